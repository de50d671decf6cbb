// CUDA backend: batched matrix products (cuBLAS) for attention's math path, and cuDNN's fused flash
// attention (scaled dot-product attention, forward and backward) through the cuDNN frontend's graph API.
//
// Building a cuDNN graph takes milliseconds to seconds, so each geometry (shape, type, causal mask, scale,
// dropout, determinism) is built once per device, forward and backward together, and kept (every plan the
// heuristics offer is timed on scratch tensors and the fastest kept: TANDEM_ATTENTION_TUNE); afterwards a
// call looks its graph up and queues it on the compute stream, with the workspace taken from the
// device's allocator (a recording's own pool while a step is recorded) and nothing waited for. A geometry
// cuDNN does not take is remembered as such, and the op computes it by the math path instead. Built
// without the frontend's headers (TANDEM_WITH_CUDNN_FRONTEND 0), nothing is fused: the first 16-bit
// attention on a GPU says so once on stderr.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "tandem/precision.h"

#ifndef TANDEM_WITH_CUDNN_FRONTEND
#define TANDEM_WITH_CUDNN_FRONTEND 0
#endif
#if TANDEM_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#endif

namespace tandem::backend {

// ---- fused attention

namespace {

// Everything a built graph depends on.
struct AttentionKey {
  int device;
  DType dtype;
  int64_t b, h, tq, tk, d, dv;
  int64_t hk;  // the key's and value's heads (grouped-query attention: a divisor of h)
  bool causal, deterministic, grads_like_inputs;
  bool documents;  // packed documents: an additive bias [b, 1, tq, tk] masks the keys of other documents
  float scale, dropout_p;
  std::array<int64_t, 4> qs, ks, vs;  // the inputs' strides as [b, h, t, d]
  bool operator==(const AttentionKey& o) const {
    return device == o.device && dtype == o.dtype && b == o.b && h == o.h && hk == o.hk && tq == o.tq && tk == o.tk && d == o.d &&
           dv == o.dv && causal == o.causal && deterministic == o.deterministic &&
           grads_like_inputs == o.grads_like_inputs && documents == o.documents &&
           std::memcmp(&scale, &o.scale, sizeof(float)) == 0 && std::memcmp(&dropout_p, &o.dropout_p, sizeof(float)) == 0 &&
           qs == o.qs && ks == o.ks && vs == o.vs;
  }
};

struct AttentionKeyHash {
  size_t operator()(const AttentionKey& k) const {
    size_t h = std::hash<int64_t>()(k.b);
    auto mix = [&](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {k.h, k.hk, k.tq, k.tk, k.d, k.dv}) mix(static_cast<uint64_t>(v));
    for (const auto* st : {&k.qs, &k.ks, &k.vs})
      for (int64_t v : *st) mix(static_cast<uint64_t>(v));
    uint32_t sb, pb;
    std::memcpy(&sb, &k.scale, 4);
    std::memcpy(&pb, &k.dropout_p, 4);
    mix(sb);
    mix(pb);
    mix((static_cast<uint64_t>(k.device) << 16) | (static_cast<uint64_t>(k.dtype) << 8) | (k.documents ? 8 : 0) |
        (k.grads_like_inputs ? 4 : 0) |
        (k.causal ? 2 : 0) | (k.deterministic ? 1 : 0));
    return h;
  }
};

// Strides of a contiguous [b, h, t, d] tensor.
std::array<int64_t, 4> bhtd(int64_t h, int64_t t, int64_t d) { return {h * t * d, t * d, d, 1}; }
// Strides of [b, h, t, d] laid out as [b, t, h, d]: the outputs' and gradients' layout.
std::array<int64_t, 4> bthd(int64_t h, int64_t t, int64_t d) { return {h * t * d, d, h * d, 1}; }

std::array<int64_t, 4> or_contiguous(const std::array<int64_t, 4>& s, int64_t h, int64_t t, int64_t d) {
  return s == std::array<int64_t, 4>{} ? bhtd(h, t, d) : s;
}

// An input gradient's strides: its input's (grads_like_inputs) or [b, t, h, d] with the input's h heads.
std::array<int64_t, 4> grad_strides(const AttentionKey& k, const std::array<int64_t, 4>& input, int64_t h, int64_t t,
                                    int64_t d) {
  return k.grads_like_inputs ? input : bthd(h, t, d);
}

int64_t kv_heads_of(const AttentionGeom& g) { return g.kv_heads > 0 ? g.kv_heads : g.heads; }

AttentionKey key_of(const AttentionGeom& g, DType t, int device) {
  return {device,
          t,
          g.batch,
          g.heads,
          g.tq,
          g.tk,
          g.d,
          g.dv,
          kv_heads_of(g),
          g.causal,
          deterministic_algorithms(),
          g.grads_like_inputs,
          g.doc_pos.defined(),
          static_cast<float>(g.scale),
          static_cast<float>(g.dropout_p),
          or_contiguous(g.q_strides, g.heads, g.tq, g.d),
          or_contiguous(g.k_strides, kv_heads_of(g), g.tk, g.d),
          or_contiguous(g.v_strides, kv_heads_of(g), g.tk, g.dv)};
}

#if TANDEM_WITH_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kSeed, kOffset, kDO, kDQ, kDK, kDV, kBias };

// Packed documents' additive mask, [b, 1, tq, tk] in the inputs' type (launch_document_bias).
std::shared_ptr<fe::graph::Tensor_attributes> bias_tensor(fe::graph::Graph& graph, const AttentionKey& k) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name("Bias")
                          .set_uid(kBias)
                          .set_dim({k.b, 1, k.tq, k.tk})
                          .set_stride({k.tq * k.tk, k.tq * k.tk, k.tk, 1}));
}

std::vector<int64_t> vec(const std::array<int64_t, 4>& s) { return {s[0], s[1], s[2], s[3]}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& graph, const char* name, int64_t uid, int64_t b,
                                                    int64_t h, int64_t t, int64_t d, const std::array<int64_t, 4>& st) {
  return graph.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, h, t, d}).set_stride(vec(st)));
}

std::shared_ptr<fe::graph::Tensor_attributes> rng_tensor(fe::graph::Graph& graph, const char* name, int64_t uid) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT64));
}

std::shared_ptr<fe::graph::Graph> new_graph(DType t) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const AttentionKey& k) {
  auto graph = new_graph(k.dtype);
  auto q = input(*graph, "Q", kQ, k.b, k.h, k.tq, k.d, k.qs);
  auto kk = input(*graph, "K", kK, k.b, k.hk, k.tk, k.d, k.ks);
  auto v = input(*graph, "V", kV, k.b, k.hk, k.tk, k.dv, k.vs);
  auto opts = fe::graph::SDPA_attributes().set_name("tandem_sdpa").set_generate_stats(true).set_attn_scale(k.scale);
  if (k.causal) opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (k.dropout_p > 0.0f)
    opts.set_dropout(k.dropout_p, rng_tensor(*graph, "Seed", kSeed), rng_tensor(*graph, "Offset", kOffset));
  if (k.documents) opts.set_bias(bias_tensor(*graph, k));
  auto [o, stats] = graph->sdpa(q, kk, v, opts);
  o->set_output(true).set_uid(kO).set_dim({k.b, k.h, k.tq, k.dv}).set_stride(vec(bthd(k.h, k.tq, k.dv)));
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({k.b, k.h, k.tq, 1})
      .set_stride({k.h * k.tq, k.tq, 1, 1});
  return graph;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const AttentionKey& k) {
  auto graph = new_graph(k.dtype);
  auto q = input(*graph, "Q", kQ, k.b, k.h, k.tq, k.d, k.qs);
  auto kk = input(*graph, "K", kK, k.b, k.hk, k.tk, k.d, k.ks);
  auto v = input(*graph, "V", kV, k.b, k.hk, k.tk, k.dv, k.vs);
  auto o = input(*graph, "O", kO, k.b, k.h, k.tq, k.dv, bthd(k.h, k.tq, k.dv));
  auto dout = input(*graph, "dO", kDO, k.b, k.h, k.tq, k.dv, bthd(k.h, k.tq, k.dv));
  auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim({k.b, k.h, k.tq, 1})
                                 .set_stride({k.h * k.tq, k.tq, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("tandem_sdpa_backward")
                  .set_attn_scale(k.scale)
                  .set_deterministic_algorithm(k.deterministic);
  if (k.causal) opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (k.dropout_p > 0.0f)
    opts.set_dropout(k.dropout_p, rng_tensor(*graph, "Seed", kSeed), rng_tensor(*graph, "Offset", kOffset));
  if (k.documents) opts.set_bias(bias_tensor(*graph, k));  // no gradient of it is asked for
  auto [dq, dk, dv] = graph->sdpa_backward(q, kk, v, o, dout, stats, opts);
  dq->set_output(true).set_uid(kDQ).set_dim({k.b, k.h, k.tq, k.d}).set_stride(vec(grad_strides(k, k.qs, k.h, k.tq, k.d)));
  dk->set_output(true).set_uid(kDK).set_dim({k.b, k.hk, k.tk, k.d}).set_stride(
      vec(grad_strides(k, k.ks, k.hk, k.tk, k.d)));
  dv->set_output(true).set_uid(kDV).set_dim({k.b, k.hk, k.tk, k.dv}).set_stride(
      vec(grad_strides(k, k.vs, k.hk, k.tk, k.dv)));
  return graph;
}

// Builds a graph's plans: heuristic A's first choice, or (tuning) every plan heuristics A and B offer, to be
// timed. Returns the workspace the chosen plan needs (tuning: the largest any plan needs), or -1 with the
// reason when cuDNN does not take the graph.
int64_t build(fe::graph::Graph& graph, cudnnHandle_t handle, bool all, std::string& why) {
  fe::error_t st = all ? graph.build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::B}, fe::BuildPlanPolicy_t::ALL)
                       : graph.build(handle, {fe::HeurMode_t::A});
  if (!st.is_good()) {
    why = st.get_message();
    return -1;
  }
  if (all) return graph.get_autotune_workspace_size();
  int64_t ws = 0;
  st = graph.get_workspace_size(ws);
  if (!st.is_good()) {
    why = st.get_message();
    return -1;
  }
  return ws;
}

#endif

}  // namespace

bool attention_tuning_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("TANDEM_ATTENTION_TUNE");
    return !(e && e[0] == '0');
  }();
  return on && !deterministic_algorithms();  // a timed choice may differ from one run to the next
}

namespace {

// A geometry's graphs, or the reason cuDNN refused it.
struct AttentionPlan {
  bool ok = false;
#if TANDEM_WITH_CUDNN_FRONTEND
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
#endif
  int64_t fwd_ws = 0, bwd_ws = 0;
  int64_t fwd_index = -1, bwd_index = -1;  // the timed choice (-1: the heuristic's first)
};

#if TANDEM_WITH_CUDNN_FRONTEND
// Elements a [b, h, t, d] tensor of these strides spans.
int64_t span(int64_t b, int64_t h, int64_t t, int64_t d, const std::array<int64_t, 4>& s) {
  return 1 + (b - 1) * s[0] + (h - 1) * s[1] + (t - 1) * s[2] + (d - 1) * s[3];
}

// The fastest plan of a graph on the given tensors: every built plan run in three interleaved rounds of
// two untimed and five timed executions, each plan's best round kept. Returns its index, or -1 when no plan
// runs.
int64_t fastest_plan(fe::graph::Graph& graph, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack, void* ws,
                     cudaStream_t stream) {
  const int64_t n = graph.get_execution_plan_count();
  std::vector<float> best(static_cast<size_t>(n), -1.0f);
  std::vector<bool> runs(static_cast<size_t>(n), true);
  cudaEvent_t start = nullptr, stop = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int round = 0; round < 3; ++round)
    for (int64_t i = 0; i < n; ++i) {
      if (!runs[static_cast<size_t>(i)]) continue;
      bool ok = true;
      for (int r = 0; r < 2 && ok; ++r) ok = graph.execute_plan_at_index(handle, pack, ws, i).is_good();
      TANDEM_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int r = 0; r < 5 && ok; ++r) ok = graph.execute_plan_at_index(handle, pack, ws, i).is_good();
      TANDEM_CUDA_CHECK(cudaEventRecord(stop, stream));
      TANDEM_CUDA_CHECK(cudaEventSynchronize(stop));
      if (!ok) {  // a plan that did not build, or does not run here
        runs[static_cast<size_t>(i)] = false;
        continue;
      }
      float ms = 0.0f;
      TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      float& b = best[static_cast<size_t>(i)];
      if (b < 0.0f || ms < b) b = ms;
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  (void)cudaGetLastError();
  int64_t chosen = -1;
  for (int64_t i = 0; i < n; ++i)
    if (runs[static_cast<size_t>(i)] && best[static_cast<size_t>(i)] >= 0.0f &&
        (chosen < 0 || best[static_cast<size_t>(i)] < best[static_cast<size_t>(chosen)]))
      chosen = i;
  if (std::getenv("TANDEM_ATTENTION_TUNE_LOG"))
    for (int64_t i = 0; i < n; ++i) {
      std::string name;
      (void)graph.get_plan_name_at_index(i, name);
      std::fprintf(stderr, "tandem: attention plan %lld %s: %s%s\n", static_cast<long long>(i), name.c_str(),
                   runs[static_cast<size_t>(i)] ? detail::cat(best[static_cast<size_t>(i)] / 5.0f, " ms").c_str()
                                                : "does not run",
                   i == chosen ? " (chosen)" : "");
    }
  return chosen;
}

// Times every built plan of the geometry's forward and backward on scratch tensors (each 16-bit input
// holds 0.0115 everywhere) and keeps the fastest of each with its workspace. Waits for the device:
// outside recordings only.
void tune(AttentionPlan& plan, const AttentionKey& k, cudnnHandle_t handle, DeviceState& dev, Allocator& alloc) {
  auto scratch = [&](int64_t elems, size_t elem_bytes) {
    auto s = std::make_unique<Scratch>(alloc, static_cast<size_t>(elems) * elem_bytes);
    TANDEM_CUDA_CHECK(cudaMemsetAsync(s->as<void>(), 0x3C, static_cast<size_t>(elems) * elem_bytes, dev.stream));
    return s;
  };
  const std::array<int64_t, 4> out = bthd(k.h, k.tq, k.dv);
  auto q = scratch(span(k.b, k.h, k.tq, k.d, k.qs), 2), kk = scratch(span(k.b, k.hk, k.tk, k.d, k.ks), 2),
       v = scratch(span(k.b, k.hk, k.tk, k.dv, k.vs), 2), o = scratch(span(k.b, k.h, k.tq, k.dv, out), 2),
       dout = scratch(span(k.b, k.h, k.tq, k.dv, out), 2), stats = scratch(k.b * k.h * k.tq, 4),
       dq = scratch(span(k.b, k.h, k.tq, k.d, grad_strides(k, k.qs, k.h, k.tq, k.d)), 2),
       dk = scratch(span(k.b, k.hk, k.tk, k.d, grad_strides(k, k.ks, k.hk, k.tk, k.d)), 2),
       dv = scratch(span(k.b, k.hk, k.tk, k.dv, grad_strides(k, k.vs, k.hk, k.tk, k.dv)), 2), rng = scratch(2, 8),
       bias = scratch(k.documents ? k.b * k.tq * k.tk : 1, 2);
  TANDEM_CUDA_CHECK(cudaMemsetAsync(rng->as<void>(), 0, 16, dev.stream));
  Scratch ws(alloc, static_cast<size_t>(std::max(plan.fwd_ws, plan.bwd_ws)));
  std::unordered_map<int64_t, void*> pack = {{kQ, q->as<void>()}, {kK, kk->as<void>()}, {kV, v->as<void>()},
                                             {kO, o->as<void>()}, {kStats, stats->as<void>()}};
  if (k.dropout_p > 0.0f) {
    pack[kSeed] = rng->as<int64_t>();
    pack[kOffset] = rng->as<int64_t>() + 1;
  }
  if (k.documents) pack[kBias] = bias->as<void>();
  auto pick = [&](fe::graph::Graph& graph, int64_t& index, int64_t& plan_ws, const char* what) {
    index = fastest_plan(graph, handle, pack, ws.as<void>(), dev.stream);
    TANDEM_CHECK(index >= 0, "scaled_dot_product_attention: no plan of cuDNN's fused attention ", what, " ran");
    fe::error_t st = graph.get_workspace_size_plan_at_index(index, plan_ws);
    TANDEM_CHECK(st.is_good(), "scaled_dot_product_attention: cuDNN's fused attention ", what, ": ",
                 st.get_message());
  };
  pick(*plan.fwd, plan.fwd_index, plan.fwd_ws, "forward");  // also writes the statistics the backward reads
  pack[kDO] = dout->as<void>();
  pack[kDQ] = dq->as<void>();
  pack[kDK] = dk->as<void>();
  pack[kDV] = dv->as<void>();
  pick(*plan.bwd, plan.bwd_index, plan.bwd_ws, "backward");
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(dev.stream));  // the scratch goes back to the allocator
}
#endif

// Per device: a cuDNN handle of its own (on the compute stream) and the built geometries.
struct AttentionState {
  std::mutex mu;  // guards the handle and the map
  cudnnHandle_t handle = nullptr;
  std::unordered_map<AttentionKey, std::unique_ptr<AttentionPlan>, AttentionKeyHash> plans;
};

AttentionState& attention_state(int device) {
  static std::mutex mu;
  static auto* states = new std::unordered_map<int, std::unique_ptr<AttentionState>>();  // kept for the process
  std::lock_guard<std::mutex> lock(mu);
  auto& s = (*states)[device];
  if (!s) s = std::make_unique<AttentionState>();
  return *s;
}

std::string describe(const AttentionKey& k) {
  return detail::cat(dtype_name(k.dtype), " [", k.b, ", ", k.h, ", ", k.tq, ", ", k.d, "] x [", k.tk, ", ", k.dv, "]",
                     k.hk != k.h ? detail::cat(" (", k.hk, " key heads)") : std::string(),
                     k.causal ? " causal" : "", k.dropout_p > 0 ? detail::cat(" dropout ", k.dropout_p) : std::string(),
                     k.documents ? " packed documents" : "");
}

// The plan of a geometry, built on first use. Call with st.mu held.
AttentionPlan& plan_for(AttentionState& st, const AttentionKey& key, DeviceState& dev, Allocator& alloc) {
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return *it->second;
  auto plan = std::make_unique<AttentionPlan>();
#if TANDEM_WITH_CUDNN_FRONTEND
  std::string why;
  try {
    if (!st.handle) {
      cudnnHandle_t h = nullptr;
      TANDEM_CUDNN_CHECK(cudnnCreate(&h));
      TANDEM_CUDNN_CHECK(cudnnSetStream(h, dev.stream));
      st.handle = h;
    }
    const bool tuned = attention_tuning_enabled();
    plan->fwd = forward_graph(key);
    plan->fwd_ws = build(*plan->fwd, st.handle, tuned, why);
    if (plan->fwd_ws >= 0) {
      plan->bwd = backward_graph(key);
      plan->bwd_ws = build(*plan->bwd, st.handle, tuned, why);
    }
    plan->ok = plan->fwd_ws >= 0 && plan->bwd_ws >= 0;
    if (plan->ok && tuned) tune(*plan, key, st.handle, dev, alloc);
  } catch (const std::exception& e) {
    why = e.what();
    plan->ok = false;
  }
  if (!plan->ok) {
    plan->fwd.reset();
    plan->bwd.reset();
    std::fprintf(stderr,
                 "tandem: cuDNN's fused attention does not take %s on cuda:%d (%s); scaled_dot_product_attention "
                 "computes it by matrix products\n",
                 describe(key).c_str(), dev.device, why.c_str());
  }
#else
  (void)dev;
  (void)alloc;
#endif
  return *st.plans.emplace(key, std::move(plan)).first->second;
}

#if TANDEM_WITH_CUDNN_FRONTEND
void execute(fe::graph::Graph& graph, int64_t index, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack,
             void* ws, const char* what) {
  fe::error_t st = index < 0 ? graph.execute(handle, pack, ws) : graph.execute_plan_at_index(handle, pack, ws, index);
  TANDEM_CHECK(st.is_good(), "scaled_dot_product_attention: cuDNN's fused attention ", what, " failed: ",
               st.get_message());
}

// Packed documents' additive mask [b, 1, tq, tk] of 16-bit values, made in `into` (document_bias_bytes of it).
size_t document_bias_bytes(const AttentionGeom& g) { return static_cast<size_t>(g.batch * g.tq * g.tk) * 2; }
void* document_bias(const AttentionGeom& g, DType t, Scratch& into, DeviceState& dev) {
  launch_document_bias(g.doc_pos.data<int32_t>(), g.batch, g.tq, t == DType::bf16, into.as<void>(), dev.stream);
  return into.as<void>();
}
#endif

// t must be a dtype tensor of this shape with these strides.
void require_attention_tensor(const Tensor& t, DType dtype, const Shape& shape, const std::array<int64_t, 4>& strides,
                              const char* what) {
  const Shape& st = t.strides();
  TANDEM_ASSERT(t.dtype() == dtype && t.shape() == shape && st.size() == 4 && st[0] == strides[0] &&
                    st[1] == strides[1] && st[2] == strides[2] && st[3] == strides[3],
                "fused attention ", what, " ", t.str(), " must be a ", dtype_name(dtype), " ", shape_str(shape),
                " with strides [", strides[0], ", ", strides[1], ", ", strides[2], ", ", strides[3], "]");
}

}  // namespace

bool CudaBackend::fused_attention_supported(const AttentionGeom& g, DType dtype, int device) {
#if TANDEM_WITH_CUDNN_FRONTEND
  if (dtype != DType::f16 && dtype != DType::bf16) return false;
  // Packed documents: the keys of other documents masked by an additive bias (TANDEM_DOCUMENT_ATTENTION=math: by
  // the math path's masked scores instead).
  static const bool documents_by_math = [] {
    const char* v = std::getenv("TANDEM_DOCUMENT_ATTENTION");
    return v && std::string(v) == "math";
  }();
  if (g.doc_pos.defined() && (documents_by_math || g.tq != g.tk)) return false;
  // TANDEM_ATTENTION_MATH=1 keeps every attention on the math path (for comparisons and benchmarks).
  static const bool math_only = [] {
    const char* v = std::getenv("TANDEM_ATTENTION_MATH");
    return v && std::string(v) == "1";
  }();
  if (math_only) return false;
  DeviceState& dev = state(device);
  AttentionState& st = attention_state(device);
  std::lock_guard<std::mutex> lock(st.mu);
  const AttentionKey key = key_of(g, dtype, device);
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return it->second->ok;
  // Graphs are built outside recordings (building allocates and waits for the device): a geometry first
  // met while a step is recorded takes the math path there.
  if (recording(device)) return false;
  return plan_for(st, key, dev, allocator(dev.device)).ok;
#else
  static std::once_flag notice;
  std::call_once(notice, [] {
    std::fprintf(stderr,
                 "tandem: built without the cuDNN frontend headers (TANDEM_CUDNN_FRONTEND_INCLUDE): "
                 "scaled_dot_product_attention computes 16-bit attention on GPUs by matrix products, not by cuDNN's "
                 "fused flash attention\n");
  });
  (void)g;
  (void)dtype;
  (void)device;
  return false;
#endif
}

void CudaBackend::fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeom& g,
                                          uint64_t seed, uint64_t offset, Tensor& o, Tensor& stats) {
  DeviceState& dev = state_for(o);
  const DType t = q.dtype();
  const AttentionKey key = key_of(g, t, dev.device);
  require_attention_tensor(q, t, {g.batch, g.heads, g.tq, g.d}, key.qs, "query");
  require_attention_tensor(k, t, {g.batch, key.hk, g.tk, g.d}, key.ks, "key");
  require_attention_tensor(v, t, {g.batch, key.hk, g.tk, g.dv}, key.vs, "value");
  require_attention_tensor(o, t, {g.batch, g.heads, g.tq, g.dv}, bthd(g.heads, g.tq, g.dv), "output");
  TANDEM_ASSERT(stats.dtype() == DType::f32 && stats.is_contiguous() && stats.numel() == g.batch * g.heads * g.tq,
                "fused attention statistics ", stats.str());
#if TANDEM_WITH_CUDNN_FRONTEND
  AttentionState& st = attention_state(dev.device);
  std::lock_guard<std::mutex> lock(st.mu);
  AttentionPlan& plan = plan_for(st, key, dev, allocator(dev.device));
  TANDEM_CHECK(plan.ok, "scaled_dot_product_attention: cuDNN's fused attention does not take ", q.str());
  Scratch ws(allocator(dev.device), static_cast<size_t>(plan.fwd_ws));
  Scratch rng(allocator(dev.device), g.dropout_p > 0 ? 2 * sizeof(int64_t) : 0);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.data_ptr()}, {kK, k.data_ptr()}, {kV, v.data_ptr()}, {kO, o.data_ptr()}, {kStats, stats.data_ptr()}};
  if (g.dropout_p > 0) {
    launch_attention_rng_state(seed, offset, dev.replays, rng.as<int64_t>(), dev.stream);
    pack[kSeed] = rng.as<int64_t>();
    pack[kOffset] = rng.as<int64_t>() + 1;
  }
  Scratch bias(allocator(dev.device), key.documents ? document_bias_bytes(g) : 0);
  if (key.documents) pack[kBias] = document_bias(g, t, bias, dev);
  execute(*plan.fwd, plan.fwd_index, st.handle, pack, ws.as<void>(), "forward");
#else
  (void)dev;
  (void)seed;
  (void)offset;
  TANDEM_CHECK(false, "scaled_dot_product_attention: tandem was built without the cuDNN frontend headers");
#endif
}

void CudaBackend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                           const Tensor& dout, const Tensor& stats, const AttentionGeom& g,
                                           uint64_t seed, uint64_t offset, Tensor& dq, Tensor& dk, Tensor& dv) {
  DeviceState& dev = state_for(dq);
  const DType t = q.dtype();
  const AttentionKey key = key_of(g, t, dev.device);
  require_attention_tensor(q, t, {g.batch, g.heads, g.tq, g.d}, key.qs, "query");
  require_attention_tensor(k, t, {g.batch, key.hk, g.tk, g.d}, key.ks, "key");
  require_attention_tensor(v, t, {g.batch, key.hk, g.tk, g.dv}, key.vs, "value");
  require_attention_tensor(o, t, {g.batch, g.heads, g.tq, g.dv}, bthd(g.heads, g.tq, g.dv), "output");
  require_attention_tensor(dout, t, {g.batch, g.heads, g.tq, g.dv}, bthd(g.heads, g.tq, g.dv), "output gradient");
  require_attention_tensor(dq, t, {g.batch, g.heads, g.tq, g.d}, grad_strides(key, key.qs, g.heads, g.tq, g.d),
                           "query gradient");
  require_attention_tensor(dk, t, {g.batch, key.hk, g.tk, g.d}, grad_strides(key, key.ks, key.hk, g.tk, g.d),
                           "key gradient");
  require_attention_tensor(dv, t, {g.batch, key.hk, g.tk, g.dv}, grad_strides(key, key.vs, key.hk, g.tk, g.dv),
                           "value gradient");
#if TANDEM_WITH_CUDNN_FRONTEND
  AttentionState& st = attention_state(dev.device);
  std::lock_guard<std::mutex> lock(st.mu);
  AttentionPlan& plan = plan_for(st, key, dev, allocator(dev.device));
  TANDEM_CHECK(plan.ok, "scaled_dot_product_attention backward: cuDNN's fused attention does not take ", q.str());
  Scratch ws(allocator(dev.device), static_cast<size_t>(plan.bwd_ws));
  Scratch rng(allocator(dev.device), g.dropout_p > 0 ? 2 * sizeof(int64_t) : 0);
  std::unordered_map<int64_t, void*> pack = {{kQ, q.data_ptr()},     {kK, k.data_ptr()},       {kV, v.data_ptr()},
                                             {kO, o.data_ptr()},     {kDO, dout.data_ptr()},   {kStats, stats.data_ptr()},
                                             {kDQ, dq.data_ptr()},   {kDK, dk.data_ptr()},     {kDV, dv.data_ptr()}};
  if (g.dropout_p > 0) {
    launch_attention_rng_state(seed, offset, dev.replays, rng.as<int64_t>(), dev.stream);
    pack[kSeed] = rng.as<int64_t>();
    pack[kOffset] = rng.as<int64_t>() + 1;
  }
  // The forward's mask made again (a kernel over b t^2 elements) rather than kept from the forward to here.
  Scratch bias(allocator(dev.device), key.documents ? document_bias_bytes(g) : 0);
  if (key.documents) pack[kBias] = document_bias(g, t, bias, dev);
  execute(*plan.bwd, plan.bwd_index, st.handle, pack, ws.as<void>(), "backward");
#else
  (void)dev;
  (void)q;
  (void)k;
  (void)v;
  (void)stats;
  (void)seed;
  (void)offset;
  TANDEM_CHECK(false, "scaled_dot_product_attention: tandem was built without the cuDNN frontend headers");
#endif
}

}  // namespace tandem::backend
