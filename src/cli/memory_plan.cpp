// The memory plan: a language model's training step walked op by op from its shape, counting the tensors each
// op keeps for its backward and what each moment of the step holds beside them (see memory_plan.h). The
// tensors and their dtypes are those the ops in src/ops allocate; a change there that keeps or frees other
// tensors is a change here (MemoryPlanCli.* measure the plan against the allocator).
#include "cli/memory_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "core/allocator.h"
#include "ops/padded_rows.h"
#include "tandem/data/tokens.h"
#include "tandem/error.h"

namespace tandem::cli {

int64_t PlannedParam::numel() const { return shape_numel(shape); }

namespace {

// The bytes the device's caching allocator holds for a tensor of numel elements of dtype dt.
int64_t rounded(int64_t numel, DType dt) {
  if (numel <= 0) return 0;
  return static_cast<int64_t>(CachingAllocator::round_size(static_cast<size_t>(numel) * dtype_size(dt)));
}

// One tensor as the allocator holds it.
struct Buf {
  int64_t numel = 0;
  DType dtype = DType::f32;
  int64_t bytes() const { return rounded(numel, dtype); }
};

int64_t bytes_of(const std::vector<Buf>& v) {
  int64_t n = 0;
  for (const Buf& b : v) n += b.bytes();
  return n;
}

// One op of the forward pass, as its backward will find it.
struct Op {
  std::string what;            // "block 3's MLP"
  std::vector<Buf> saved;      // kept for its backward (a tensor several ops keep is listed once)
  std::vector<Buf> fwd_tmp;    // forward: held while it runs, freed after (its output when no later op keeps it)
  std::vector<Buf> bwd_tmp;    // backward: scratch freed when it returns
  std::vector<Buf> bwd_out;    // backward: the gradients it hands on (held until the op before takes them)
  std::vector<Buf> bwd_keep;   // backward: held to the end of the pass (a tied token table's gradient)
  bool passes_grad = false;    // hands its incoming gradient on unchanged (a residual connection's)
  bool alias = false;          // an add: the incoming gradient goes to both inputs (the branch's is an alias)
  std::vector<int> params;     // the parameters whose gradients its backward makes
};

// A layer group's part of the step: the embeddings, one transformer block, the head.
struct Stage {
  int group = 0;
  bool block = false;
  Buf input;  // a block's input, the residual stream (kept by its first norm, or by recompute)
  std::vector<Op> ops;
};

struct Model {
  std::vector<PlannedParam> params;
  std::vector<Stage> stages;
  Buf stream;              // the residual stream of one micro-batch [B, T, width]
  int64_t tied_table = -1;  // the token table when it is also the output layer (its gradient waits for both)
  int64_t persistent = 0;  // buffers the model keeps beside its parameters (rotary tables)
};

// ---- the model, op by op

struct Dtypes {
  DType act = DType::f32;     // the residual stream and the products' outputs
  bool half = false;          // 16-bit products on a GPU
  bool copies = false;        // the products read kept 16-bit weight copies
  bool weight_saved = false;  // each product keeps its own 16-bit copy of its weight for backward (no kept copies)
};

Dtypes dtypes_of(const MemoryPlanSettings& s) {
  Dtypes d;
  d.act = s.device.is_cuda() ? activation_dtype(s.precision) : DType::f32;
  d.half = d.act != DType::f32;
  d.copies = d.half && s.param_copies && s.shard != dist::Shard::parameters && s.method != "partialUpdate";
  d.weight_saved = d.half && !d.copies;
  return d;
}

class Builder {
 public:
  explicit Builder(const MemoryPlanSettings& s) : s_(s), d_(dtypes_of(s)) {}

  Model build() {
    m_.params = planned_parameters(s_);
    for (size_t i = 0; i < m_.params.size(); ++i) index_[m_.params[i].name] = static_cast<int>(i);
    n_ = s_.batch * s_.context;
    const bool llama = s_.model == "llama";
    c_ = llama ? s_.llama.width : s_.gpt.width;
    m_.stream = {n_ * c_, d_.act};
    const int64_t layers = llama ? s_.llama.layers : s_.gpt.layers;
    m_.stages.push_back(llama ? llama_embeddings() : gpt_embeddings());
    for (int64_t i = 0; i < layers; ++i) m_.stages.push_back(llama ? llama_block(i) : gpt_block(i));
    m_.stages.push_back(head(layers));
    if (llama) {
      const int64_t hd = s_.llama.width / s_.llama.heads;
      m_.persistent += 2 * rounded(s_.llama.context * hd, d_.act);  // the rotary tables, cos and sin
    }
    return m_;
  }

 private:
  int p(const std::string& name) const {
    auto it = index_.find(name);
    TANDEM_ASSERT(it != index_.end(), "memory plan: no parameter ", name);
    return it->second;
  }
  std::vector<int> ps(const std::string& prefix, std::initializer_list<const char*> names) const {
    std::vector<int> out;
    for (const char* n : names) {
      auto it = index_.find(prefix + n);
      if (it != index_.end()) out.push_back(it->second);
    }
    return out;
  }
  Buf act(int64_t numel) const { return {numel, d_.act}; }
  Buf f32(int64_t numel) const { return {numel, DType::f32}; }
  // What a product keeps of its weight [out, in]: a 16-bit copy of its own where no kept copy is read.
  std::vector<Buf> weight_kept(int64_t numel) const { return d_.weight_saved ? std::vector<Buf>{act(numel)} : std::vector<Buf>{}; }
  // A bias as a product reads it: a 16-bit copy made for the forward where no kept copy is read.
  std::vector<Buf> bias_copy(int64_t numel, bool has) const {
    return d_.weight_saved && has ? std::vector<Buf>{act(numel)} : std::vector<Buf>{};
  }
  std::vector<Buf> norm_stats(bool rms) const {
    if (rms) return {f32(n_)};
    return {f32(n_), f32(n_)};  // mean and rstd
  }
  std::vector<Buf> column_sums() const { return s_.column_sums ? std::vector<Buf>{f32(c_)} : std::vector<Buf>{}; }
  static void append(std::vector<Buf>& to, const std::vector<Buf>& more) { to.insert(to.end(), more.begin(), more.end()); }

  // Attention over the packed product qkv [B, T, (heads + 2 kv_heads) d] (its input), giving [B, T, width].
  Op attention(const std::string& who, int64_t heads, int64_t kv_heads, double dropout) const {
    const int64_t d = c_ / heads, qkv = (heads + 2 * kv_heads) * d, bh = s_.batch * heads, t = s_.context;
    Op op;
    op.what = who + "'s attention";
    if (s_.fused_attention) {
      // The fused kernels keep the packed product, the output and the log-sum-exp rows.
      op.saved.push_back(act(n_ * qkv));
      op.saved.push_back(act(n_ * c_));
      op.saved.push_back(f32(bh * t));
      op.bwd_out = {act(n_ * qkv)};
      return op;
    }
    // The math: the query, key and value heads in f32 (keys and values repeated for grouped queries), the
    // probabilities [B H, T, T], and the output laid out again for the projection after it.
    op.saved = {f32(n_ * c_), f32(n_ * c_), f32(n_ * c_), f32(bh * t * t), act(n_ * c_)};
    if (dropout > 0.0) {
      op.saved.push_back(f32(bh * t * t));  // the mask
      op.saved.push_back(f32(bh * t * t));  // the dropped probabilities
    }
    op.fwd_tmp.push_back(act(n_ * qkv));  // the packed product, read into the f32 heads
    op.fwd_tmp.push_back(f32(n_ * c_));  // the output before it is laid out as [B, T, width]
    op.bwd_tmp = {f32(n_ * c_), f32(bh * t * t), f32(n_ * c_), f32(n_ * c_), f32(n_ * c_)};
    if (d_.half) append(op.bwd_tmp, {act(n_ * c_), act(n_ * c_), act(n_ * c_)});
    op.bwd_out = {act(n_ * qkv)};
    return op;
  }

  // A residual branch's end: without dropout the product adds the residual itself; with it, dropout and an add.
  // The product's backward hands on the gradient of its input, `in_numel` elements.
  void branch_end(std::vector<Op>& ops, Op proj, const std::string& who, double dropout, int64_t in_numel) const {
    proj.bwd_out = {act(in_numel)};
    if (dropout == 0.0) {
      proj.passes_grad = true;
      ops.push_back(std::move(proj));
      return;
    }
    ops.push_back(std::move(proj));
    Op drop;
    drop.what = who + "'s dropout";
    drop.saved = {act(n_ * c_)};      // the mask
    drop.fwd_tmp = {act(n_ * c_)};    // the branch before dropout
    drop.bwd_out = {act(n_ * c_)};
    ops.push_back(std::move(drop));
    Op add;
    add.what = who + "'s residual";
    add.fwd_tmp = {act(n_ * c_)};     // the dropped branch
    add.passes_grad = true;           // to the residual, and (an alias) to the branch
    add.alias = true;
    ops.push_back(std::move(add));
  }

  Stage gpt_embeddings() const {
    Stage st;
    st.group = 0;
    Op e;
    e.what = "the embeddings";
    e.fwd_tmp = {f32(n_ * c_)};  // the rows of the table, before the positions are added
    if (d_.half) e.fwd_tmp.push_back(f32(n_ * c_));  // their sum, before the cast to the stream's type
    // Backward: the positions' gradient summed over the batch, the table's slice, the cast's f32 gradient.
    e.bwd_tmp = {f32(s_.context * c_), f32(s_.gpt.context * c_)};
    if (d_.half) e.bwd_tmp.push_back(f32(n_ * c_));
    e.params = {p("wpe.weight")};
    if (s_.gpt.dropout > 0.0) {
      e.fwd_tmp.push_back(act(n_ * c_));  // the stream before dropout
      Op drop;
      drop.what = "the embeddings' dropout";
      drop.saved = {act(n_ * c_)};
      drop.bwd_out = {act(n_ * c_)};
      st.ops = {std::move(e), std::move(drop)};
    } else {
      st.ops = {std::move(e)};
    }
    return st;
  }

  Stage llama_embeddings() const {
    Stage st;
    st.group = 0;
    Op e;
    e.what = "the embeddings";
    if (d_.half) {
      e.fwd_tmp = {f32(n_ * c_)};
      e.bwd_tmp = {f32(n_ * c_)};
    }
    if (!s_.llama.tied) e.params = {p("wte.weight")};
    st.ops = {std::move(e)};
    return st;
  }

  // Block i's stage (its layer group), taking the residual stream as its input.
  Stage block_stage(int64_t i) const {
    Stage st;
    st.group = static_cast<int>(i) + 1;
    st.block = true;
    st.input = m_.stream;
    return st;
  }

  // A block's first norm: it keeps its statistics (its input is the block's, kept as the stage's).
  Op first_norm(const std::string& who, const std::string& pre, bool rms) const {
    Op ln1;
    ln1.what = who + "'s first norm";
    ln1.saved = norm_stats(rms);
    ln1.bwd_tmp = column_sums();
    ln1.params = ps(pre + "ln_1.", {"weight", "bias"});  // an RMSNorm has no bias: ps leaves it out
    return ln1;
  }

  Stage gpt_block(int64_t i) const {
    const nn::GptConfig& g = s_.gpt;
    const std::string pre = "h." + std::to_string(i) + ".", who = "block " + std::to_string(i);
    const int64_t f = 4 * c_;
    const bool pad = s_.bias_from_product && g.bias;  // layer norms write padded rows for the biased products
    const int64_t ld = pad ? ops::padded_ld(c_) : c_;
    Stage st = block_stage(i);
    Op ln1 = first_norm(who, pre, /*rms=*/false);
    Op qkv;
    qkv.what = who + "'s query-key-value product";
    qkv.saved = {act(n_ * ld)};
    append(qkv.saved, weight_kept(3 * c_ * c_));
    qkv.fwd_tmp = bias_copy(3 * c_, g.bias);
    if (pad) qkv.bwd_tmp = {f32(3 * c_ * ld)};
    qkv.bwd_out = {act(n_ * c_)};
    qkv.params = ps(pre + "attn.c_attn.", {"weight", "bias"});
    Op proj;
    proj.what = who + "'s attention projection";
    proj.saved = weight_kept(c_ * c_);
    proj.fwd_tmp = bias_copy(c_, g.bias);
    proj.params = ps(pre + "attn.c_proj.", {"weight", "bias"});
    st.ops = {std::move(ln1), std::move(qkv), attention(who, g.heads, g.heads, g.dropout)};
    branch_end(st.ops, std::move(proj), who + "'s attention", g.dropout, n_ * c_);
    Op ln2;
    ln2.what = who + "'s second norm";
    ln2.saved = {act(n_ * c_)};  // its input, the stream after attention
    append(ln2.saved, norm_stats(false));
    ln2.bwd_tmp = column_sums();
    ln2.params = ps(pre + "ln_2.", {"weight", "bias"});
    st.ops.push_back(std::move(ln2));
    Op mlp;
    mlp.what = who + "'s MLP";
    // Its input, the GELU's input and output; each product's own weight copy where none is kept.
    mlp.saved = {act(n_ * ld), act(n_ * f), act(n_ * f)};
    append(mlp.saved, weight_kept(f * c_));
    append(mlp.saved, weight_kept(c_ * f));
    append(mlp.fwd_tmp, bias_copy(f, g.bias));
    append(mlp.fwd_tmp, bias_copy(c_, g.bias));
    mlp.bwd_tmp = {act(n_ * f)};  // the gradient at the GELU's input
    if (pad) {
      mlp.bwd_tmp.push_back(f32(f * ld));  // the first weight's gradient with its bias's column
    } else if (g.bias && d_.half) {
      mlp.bwd_tmp.push_back(act(f));  // the first bias's gradient in the product's type
    }
    mlp.params = ps(pre + "mlp.", {"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"});
    branch_end(st.ops, std::move(mlp), who + "'s MLP", g.dropout, n_ * c_);
    return st;
  }

  Stage llama_block(int64_t i) const {
    const nn::LlamaConfig& l = s_.llama;
    const std::string pre = "h." + std::to_string(i) + ".", who = "block " + std::to_string(i);
    const int64_t d = c_ / l.heads, qkv_w = c_ + 2 * l.kv_heads * d, f = l.mlp_hidden;
    Stage st = block_stage(i);
    Op ln1 = first_norm(who, pre, /*rms=*/true);
    Op qkv;
    qkv.what = who + "'s query-key-value product";
    qkv.saved = {act(n_ * c_)};
    append(qkv.saved, weight_kept(qkv_w * c_));
    qkv.fwd_tmp = bias_copy(qkv_w, l.attention_bias);
    qkv.bwd_out = {act(n_ * c_)};
    qkv.params = ps(pre + "attn.c_attn.", {"weight", "bias"});
    Op rope;
    rope.what = who + "'s rotary embedding";
    rope.fwd_tmp = {act(n_ * qkv_w)};  // the product before rotation (attention keeps the rotated one)
    rope.bwd_out = {act(n_ * qkv_w)};
    Op proj;
    proj.what = who + "'s attention projection";
    proj.saved = weight_kept(c_ * c_);
    proj.fwd_tmp = bias_copy(c_, l.attention_bias);
    proj.params = ps(pre + "attn.c_proj.", {"weight", "bias"});
    st.ops = {std::move(ln1), std::move(qkv), std::move(rope), attention(who, l.heads, l.kv_heads, l.dropout)};
    branch_end(st.ops, std::move(proj), who + "'s attention", l.dropout, n_ * c_);
    Op ln2;
    ln2.what = who + "'s second norm";
    ln2.saved = {act(n_ * c_)};
    append(ln2.saved, norm_stats(true));
    ln2.bwd_tmp = column_sums();
    ln2.params = ps(pre + "ln_2.", {"weight"});
    Op up;
    up.what = who + "'s gate and up product";
    up.saved = {act(n_ * c_)};
    append(up.saved, weight_kept(2 * f * c_));
    up.fwd_tmp = bias_copy(2 * f, l.mlp_bias);
    up.bwd_out = {act(n_ * c_)};
    up.params = ps(pre + "mlp.c_fc.", {"weight", "bias"});
    Op glu;
    glu.what = who + "'s SwiGLU";
    glu.saved = {act(n_ * 2 * f)};
    glu.bwd_out = {act(n_ * 2 * f)};
    Op down;
    down.what = who + "'s MLP";
    down.saved = {act(n_ * f)};
    append(down.saved, weight_kept(c_ * f));
    down.fwd_tmp = bias_copy(c_, l.mlp_bias);
    down.params = ps(pre + "mlp.c_proj.", {"weight", "bias"});
    st.ops.push_back(std::move(ln2));
    st.ops.push_back(std::move(up));
    st.ops.push_back(std::move(glu));
    branch_end(st.ops, std::move(down), who + "'s MLP", l.dropout, n_ * f);
    return st;
  }

  Stage head(int64_t layers) {
    const bool llama = s_.model == "llama";
    const int64_t v = llama ? s_.llama.vocab : s_.gpt.vocab;
    const bool tied = !llama || s_.llama.tied;
    Stage st;
    st.group = static_cast<int>(layers) + 1;
    Op norm;
    norm.what = "the final norm";
    norm.saved = {m_.stream};  // its input, the last block's output
    append(norm.saved, norm_stats(llama));
    norm.bwd_tmp = column_sums();
    norm.bwd_out = {act(n_ * c_)};
    norm.params = ps("ln_f.", {"weight", "bias"});
    // The loss takes the head's product chunk by chunk (linear_cross_entropy): it keeps the gradients of its
    // input and of the output weight, made in the forward, and a chunk of logits at a time.
    const DType cdt = d_.act;
    const int64_t row_bytes = std::max<int64_t>(v * static_cast<int64_t>(dtype_size(cdt)), 1);
    int64_t rows = std::max<int64_t>(1, std::min(n_, s_.logit_chunk_bytes / row_bytes));
    const int64_t chunks = (n_ + rows - 1) / rows;
    rows = std::min(n_, ((n_ + chunks - 1) / chunks + 63) / 64 * 64);
    Op loss;
    loss.what = chunks > 1 ? "the loss (logits in " + std::to_string(chunks) + " chunks)" : "the loss (its logits)";
    loss.saved = {Buf{n_ * c_, cdt}, f32(v * c_), f32(1)};
    loss.fwd_tmp = {act(n_ * c_), Buf{rows * v, cdt}, f32(n_), f32(n_)};
    if (d_.weight_saved) loss.fwd_tmp.push_back(act(v * c_));
    loss.bwd_tmp = {f32(1), f32(1)};
    loss.bwd_out = {act(n_ * c_)};
    if (tied) {
      loss.bwd_keep = {f32(v * c_)};  // the table's gradient waits for the embeddings' share
      m_.tied_table = p("wte.weight");
    } else {
      loss.bwd_tmp.push_back(f32(v * c_));
      loss.params = {p("lm_head.weight")};
    }
    st.ops = {std::move(norm), std::move(loss)};
    return st;
  }

  const MemoryPlanSettings& s_;
  Dtypes d_;
  Model m_;
  std::map<std::string, int> index_;
  int64_t n_ = 0, c_ = 0;
};

// ---- the gradient buckets, as dist::DistOpt lays them out

struct PlanBucket {
  std::vector<int> params;
  std::vector<int64_t> starts;
  int64_t numel = 0, span = 0, offset = 0;
};

struct Layout {
  std::vector<PlanBucket> buckets;
  std::vector<int> bucket_of;  // per parameter
  int64_t total = 0;           // the arena's elements
  int64_t blocks = 0;          // one rank's blocks' elements (sharded)
};

Layout lay_out(const std::vector<PlannedParam>& params, const MemoryPlanSettings& s) {
  const bool sharded = s.shard != dist::Shard::none;
  const int64_t align = 4;  // f32: 16 bytes
  // The optimizer's order of the parameters (AdamW lists the decayed ones, of two or more dimensions, first: its
  // two groups), and the buckets laid out in its reverse, the order backward is expected to finish them.
  std::vector<int> listed;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < params.size(); ++i) {
      const bool matrix = params[i].shape.size() >= 2;
      if (s.optimizer != "adamw" ? pass == 0 : (pass == 0) == matrix) listed.push_back(static_cast<int>(i));
    }
  std::vector<int> order(listed.rbegin(), listed.rend());
  std::vector<int> keys;
  if (s.shard == dist::Shard::parameters) {
    // One group's parameters a bucket, the groups from the last to the first; a parameter of several groups
    // (a tied table) in buckets of its own after the first of them.
    keys.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<int>& g = params[i].groups;
      keys[i] = g.size() == 1 ? 2 * g[0] : 2 * *std::min_element(g.begin(), g.end()) - 1;
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[static_cast<size_t>(a)] > keys[static_cast<size_t>(b)]; });
  }
  Layout out;
  auto limit = [&](size_t k) { return static_cast<int64_t>(k == 0 ? s.first_bucket_bytes : s.bucket_bytes); };
  int last_key = -1000000;
  for (int i : order) {
    const int64_t numel = params[static_cast<size_t>(i)].numel();
    const int key = keys.empty() ? 0 : keys[static_cast<size_t>(i)];
    const bool full = !out.buckets.empty() &&
                      ((out.buckets.back().numel + numel) * 4 > limit(out.buckets.size() - 1) || key != last_key);
    last_key = key;
    if (out.buckets.empty() || full) out.buckets.emplace_back();
    PlanBucket& b = out.buckets.back();
    b.params.push_back(i);
    const int64_t start = (b.numel + align - 1) / align * align;
    b.starts.push_back(start);
    b.numel = start + numel;
  }
  const int64_t unit = sharded ? s.world * align : 1;
  out.bucket_of.assign(params.size(), 0);
  for (size_t k = 0; k < out.buckets.size(); ++k) {
    PlanBucket& b = out.buckets[k];
    b.offset = out.total;
    b.span = (b.numel + unit - 1) / unit * unit;
    out.total += (b.span + align - 1) / align * align;
    out.blocks += sharded ? b.span / s.world : b.span;
    for (int i : b.params) out.bucket_of[static_cast<size_t>(i)] = static_cast<int>(k);
  }
  return out;
}

// This rank's pieces of each parameter under sharding (the elements of it inside its block of each bucket).
std::vector<int64_t> pieces_of(const Layout& l, const std::vector<PlannedParam>& params, int world, int rank) {
  std::vector<int64_t> pieces;
  for (const PlanBucket& b : l.buckets) {
    const int64_t block = b.span / world, lo = b.offset + rank * block, hi = lo + block;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const int64_t start = b.offset + b.starts[j], end = start + params[static_cast<size_t>(b.params[j])].numel();
      const int64_t a = std::max(start, lo), z = std::min(end, hi);
      if (a < z) pieces.push_back(z - a);
    }
  }
  return pieces;
}

int state_copies(const MemoryPlanSettings& s) {
  if (s.optimizer == "adam" || s.optimizer == "adamw") return 2;
  return s.optimizer == "sgd" && s.momentum != 0.0 ? 1 : 0;
}

// ---- the step, moment by moment

enum Kind { kState, kActivations, kGradients, kWork, kKinds };

class Timeline {
 public:
  void add(Kind k, int64_t b) { held_[k] += b; }
  void sub(Kind k, int64_t b) { held_[k] -= b; }
  int64_t now() const { return held_[kState] + held_[kActivations] + held_[kGradients] + held_[kWork]; }
  int64_t held(Kind k) const { return held_[k]; }
  // Records the moment; with extra bytes of scratch held just then.
  void mark(const std::string& at, int64_t extra = 0) {
    const int64_t b = now() + extra;
    if (b > phase_peak_) {
      phase_peak_ = b;
      phase_at_ = at;
    }
    if (b > peak_) {
      peak_ = b;
      peak_at_ = at;
      at_peak_ = held_;
      at_peak_[kWork] += extra;
    }
  }
  // Ends a phase: its largest moment goes into the list.
  void end_phase(std::vector<PlanMoment>& moments) {
    if (phase_peak_ > 0) moments.push_back({phase_at_, phase_peak_});
    phase_peak_ = 0;
    phase_at_.clear();
  }
  int64_t peak() const { return peak_; }
  const std::string& peak_at() const { return peak_at_; }
  int64_t at_peak(Kind k) const { return at_peak_[k]; }

 private:
  std::array<int64_t, kKinds> held_{};
  std::array<int64_t, kKinds> at_peak_{};
  int64_t peak_ = 0, phase_peak_ = 0;
  std::string peak_at_, phase_at_;
};

class StepWalk {
 public:
  StepWalk(const MemoryPlanSettings& s, const Model& m, const Layout& l, Timeline& t)
      : s_(s), m_(m), l_(l), t_(t), nb_(l.buckets.size()) {
    sharded_ = s.shard != dist::Shard::none;
    lazy_ = s.release_gradients && !sharded_;
    staged_ = sharded_ && s.world > 1 && (s.shard == dist::Shard::gradients || s.shard == dist::Shard::parameters);
    stage3_ = s.shard == dist::Shard::parameters;
    alloc_.assign(nb_, false);
    whole_.assign(nb_, false);
    whole16_.assign(nb_, false);
    holders_.assign(nb_, {});
    staging_.assign(nb_, false);
    pending_.assign(nb_, 0);
    for (size_t k = 0; k < nb_; ++k) pending_[k] = static_cast<int>(l.buckets[k].params.size());
    for (size_t i = 0; i < m.params.size(); ++i)
      for (int g : m.params[i].groups) {
        if (group_buckets_.size() <= static_cast<size_t>(g)) group_buckets_.resize(static_cast<size_t>(g) + 1);
        auto& list = group_buckets_[static_cast<size_t>(g)];
        const size_t k = static_cast<size_t>(l.bucket_of[i]);
        if (std::find(list.begin(), list.end(), k) == list.end()) list.push_back(k);
      }
  }

  // One micro-batch's forward and backward (with the buckets of earlier micro-batches held when accumulate > 1).
  void step(bool later_micro_batch) {
    if (lazy_ && later_micro_batch)
      for (size_t k = 0; k < nb_; ++k) bucket(k);
    forward();
    t_.end_phase(moments_);
    backward();
    t_.end_phase(moments_);
  }

  // The forward pass without gradients (an evaluation): each block's tensors only while it runs, the logits whole.
  void evaluate(int64_t rows) {
    const bool llama = s_.model == "llama";
    const int64_t c = llama ? s_.llama.width : s_.gpt.width, v = llama ? s_.llama.vocab : s_.gpt.vocab;
    const Dtypes d = dtypes_of(s_);
    const int64_t n = rows * s_.context;
    const double scale = static_cast<double>(rows) / static_cast<double>(std::max<int64_t>(s_.batch, 1));
    auto scaled = [&](int64_t b) { return static_cast<int64_t>(std::ceil(static_cast<double>(b) * scale)); };
    const int64_t stream = rounded(n * c, d.act);
    for (const Stage& st : m_.stages) {
      if (stage3_) gather(st.group, st.group + 1);
      if (st.block) t_.mark("evaluation, " + label(st), stream + scaled(block_working_set(st)));
      if (stage3_) release(st.group);
    }
    // The batch, the last block's output, the final norm's, the logits and the loss's rows.
    int64_t logits = 2 * rounded(n, DType::i32) + stream + rounded(n * c, d.act) + rounded(n * v, d.act) +
                     3 * rounded(n, DType::f32);
    if (d.weight_saved) logits += rounded(v * c, d.act);
    if (stage3_) gather(m_.stages.back().group, -1);
    t_.mark("evaluation, the logits", logits);
    if (stage3_) release(m_.stages.back().group);
    t_.end_phase(moments_);
  }

  // The end of the step: the gradients applied (and, released, freed); under master weights each parameter
  // takes its master's rounding through a 16-bit copy.
  void update() {
    int64_t rounding = 0;
    if (s_.master_weights != DType::f32)
      for (const PlannedParam& p : m_.params) rounding = std::max(rounding, rounded(p.numel(), s_.master_weights));
    t_.mark("the update", rounding);
    t_.end_phase(moments_);
    if (lazy_)
      for (size_t k = 0; k < nb_; ++k)
        if (alloc_[k]) {
          alloc_[k] = false;
          t_.sub(kGradients, bucket_bytes(k));
        }
  }

  int64_t activations() const { return activations_; }
  std::vector<PlanMoment>& moments() { return moments_; }

 private:
  int64_t bucket_bytes(size_t k) const { return rounded(l_.buckets[k].span, DType::f32); }
  void bucket(size_t k) {
    if (!lazy_ || alloc_[k]) return;
    alloc_[k] = true;
    t_.add(kGradients, bucket_bytes(k));
  }
  // Sharded parameters: a group's buckets gathered whole (and the next group's on their way), freed when no
  // group holds them.
  void launch(size_t k) {
    if (whole_[k]) return;
    whole_[k] = true;
    t_.add(kWork, bucket_bytes(k));
    if (s_.master_weights != DType::f32) {  // under master weights the blocks travel in 16 bits first
      whole16_[k] = true;
      t_.add(kWork, rounded(l_.buckets[k].span, s_.master_weights));
    }
  }
  void bind(size_t k) {
    if (!whole16_[k]) return;
    whole16_[k] = false;
    t_.sub(kWork, rounded(l_.buckets[k].span, s_.master_weights));
  }
  void gather(int group, int next) {
    auto in_range = [&](int g) { return g >= 0 && static_cast<size_t>(g) < group_buckets_.size(); };
    if (in_range(group))
      for (size_t k : group_buckets_[static_cast<size_t>(group)]) launch(k);
    if (in_range(next))
      for (size_t k : group_buckets_[static_cast<size_t>(next)]) launch(k);
    if (in_range(group))
      for (size_t k : group_buckets_[static_cast<size_t>(group)]) {
        bind(k);
        holders_[k].insert(group);
      }
  }
  void release(int group) {
    if (group < 0 || static_cast<size_t>(group) >= group_buckets_.size()) return;
    for (size_t k : group_buckets_[static_cast<size_t>(group)]) {
      holders_[k].erase(group);
      if (holders_[k].empty() && whole_[k]) {
        bind(k);
        whole_[k] = false;
        t_.sub(kWork, bucket_bytes(k));
      }
    }
  }
  // A gradient made by backward, moved into its bucket's staging (sharded gradients), or written into its
  // bucket (allocated before the op ran).
  void staged(int param) {
    const size_t k = static_cast<size_t>(l_.bucket_of[static_cast<size_t>(param)]);
    if (!staging_[k]) {
      staging_[k] = true;
      t_.add(kGradients, bucket_bytes(k));
    }
    // A complete bucket's staging goes to its reduce-scatter, which holds it until the step's synchronisation waits
    // for it at the end of backward: NCCL (a GPU's) keeps a collective's tensors until then; Gloo (the CPU's) lets
    // them go as its thread completes each collective, which on a busy host is often not much earlier (the plan
    // is then an upper bound).
    if (--pending_[k] == 0) pending_[k] = static_cast<int>(l_.buckets[k].params.size());
  }
  // The end of backward: every reduce-scatter waited for, the stagings freed.
  void finish_staging() {
    for (size_t k = 0; k < nb_; ++k)
      if (staging_[k]) {
        staging_[k] = false;
        t_.sub(kGradients, bucket_bytes(k));
      }
  }
  int64_t param_grad_bytes(int param) const {
    return rounded(m_.params[static_cast<size_t>(param)].numel(), DType::f32);
  }

  // The most a block holds while it runs without keeping anything (recompute's forward, an evaluation): its
  // biggest op's tensors beside the stream.
  int64_t block_working_set(const Stage& st) const {
    int64_t most = 0;
    for (const Op& op : st.ops) most = std::max(most, bytes_of(op.saved) + bytes_of(op.fwd_tmp));
    return most + m_.stream.bytes();
  }

  void forward() {
    const bool full = s_.recompute == RecomputePolicy::full;
    for (const Stage& st : m_.stages) {
      if (stage3_) gather(st.group, st.group + 1);
      if (st.block) {
        t_.add(kActivations, st.input.bytes());
        activations_ += st.input.bytes();
      }
      if (st.block && full) {
        t_.mark("forward, " + label(st) + " (recomputed later)", block_working_set(st));
      } else {
        for (const Op& op : st.ops) {
          const int64_t kept = bytes_of(op.saved);
          t_.add(kActivations, kept);
          activations_ += kept;
          t_.mark("forward, " + op.what, bytes_of(op.fwd_tmp));
        }
      }
      if (stage3_) release(st.group);
    }
  }

  static std::string label(const Stage& st) {
    const std::string& w = st.ops.front().what;
    return w.substr(0, w.find('\''));
  }

  // Runs one op's backward: its buckets first, then its scratch and the gradients it hands on.
  void op_backward(const Op& op, bool captured) {
    if (!captured && !staged_)
      for (int p : op.params) bucket(static_cast<size_t>(l_.bucket_of[static_cast<size_t>(p)]));
    int64_t made = 0;  // parameter gradients made as tensors of their own (recompute's inner pass, staging)
    if (captured || staged_)
      for (int p : op.params) made += param_grad_bytes(p);
    const int64_t tmp = bytes_of(op.bwd_tmp), out = bytes_of(op.bwd_out), keep = bytes_of(op.bwd_keep);
    t_.add(kWork, out + keep);
    t_.add(kGradients, made);
    t_.mark("backward, " + op.what, tmp);
    held_keep_ += keep;
    t_.sub(kActivations, bytes_of(op.saved));
    if (!op.passes_grad) {
      if (!pending_grads_.empty()) {
        t_.sub(kWork, pending_grads_.back());
        pending_grads_.pop_back();
      }
    }
    if (op.alias) pending_grads_.push_back(0);
    for (const Buf& b : op.bwd_out) pending_grads_.push_back(b.bytes());
    if (captured) {
      captured_ += made;
    } else if (staged_) {
      t_.sub(kGradients, made);
      for (int p : op.params) staged(p);
    }
  }

  void backward() {
    const bool full = s_.recompute == RecomputePolicy::full;
    // The loss's seed.
    pending_grads_ = {rounded(1, DType::f32)};
    t_.add(kWork, pending_grads_.back());
    for (auto it = m_.stages.rbegin(); it != m_.stages.rend(); ++it) {
      const Stage& st = *it;
      if (stage3_) gather(st.group, st.group - 1);
      if (st.block && full) {
        // The block runs again: its output, the gradient's own copy (the inner pass's seed) and every op's tensors.
        if (!staged_)
          for (const Op& op : st.ops)
            for (int p : op.params) bucket(static_cast<size_t>(l_.bucket_of[static_cast<size_t>(p)]));
        const int64_t again = m_.stream.bytes();
        t_.add(kWork, again);
        for (const Op& op : st.ops) {
          t_.add(kActivations, bytes_of(op.saved));
          t_.mark("backward, " + op.what + " (recomputed)", bytes_of(op.fwd_tmp));
        }
        const int64_t incoming = pending_grads_.empty() ? 0 : pending_grads_.back();
        pending_grads_.push_back(incoming);  // the seed, a copy of the incoming gradient
        t_.add(kWork, incoming);
        captured_ = 0;
        for (auto op = st.ops.rbegin(); op != st.ops.rend(); ++op) op_backward(*op, /*captured=*/true);
        // The block's gradients go into their buckets (sharded: their buckets' staging); the incoming gradient
        // and the output are freed; the seed's copy, holding the input's gradient, goes on.
        if (staged_)
          for (const Op& op : st.ops)
            for (int p : op.params) staged(p);
        t_.sub(kGradients, captured_);
        captured_ = 0;
        t_.sub(kWork, again);
        const int64_t carried = pending_grads_.back();
        pending_grads_.pop_back();
        if (!pending_grads_.empty()) {
          t_.sub(kWork, pending_grads_.back());
          pending_grads_.pop_back();
        }
        pending_grads_.push_back(carried);
      } else {
        for (auto op = st.ops.rbegin(); op != st.ops.rend(); ++op) op_backward(*op, false);
      }
      if (st.block) t_.sub(kActivations, st.input.bytes());
      if (stage3_) release(st.group);
    }
    // The tied table's gradient, both shares added, goes into its bucket.
    if (m_.tied_table >= 0) {
      if (staged_) {
        staged(static_cast<int>(m_.tied_table));
      } else {
        bucket(static_cast<size_t>(l_.bucket_of[static_cast<size_t>(m_.tied_table)]));
      }
      t_.mark("end of backward (the token table's gradient added)");
    }
    t_.mark("end of backward");
    finish_staging();
    t_.sub(kWork, held_keep_);
    held_keep_ = 0;
    for (int64_t b : pending_grads_) t_.sub(kWork, b);
    pending_grads_.clear();
  }

  const MemoryPlanSettings& s_;
  const Model& m_;
  const Layout& l_;
  Timeline& t_;
  size_t nb_;
  bool sharded_ = false, lazy_ = false, staged_ = false, stage3_ = false;
  std::vector<bool> alloc_, whole_, whole16_, staging_;
  std::vector<int> pending_;
  std::vector<std::set<int>> holders_;
  std::vector<std::vector<size_t>> group_buckets_;
  std::vector<int64_t> pending_grads_;
  int64_t held_keep_ = 0, captured_ = 0, activations_ = 0;
  std::vector<PlanMoment> moments_;
};

std::string human(double b) {
  char buf[32];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  else if (b < 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else if (b < 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

}  // namespace

std::string format_bytes(int64_t bytes) { return human(static_cast<double>(bytes)); }

int64_t token_data_bytes(int64_t tokens, int width, bool masked, int64_t frame, int rank, int world) {
  int64_t part = 0;
  if (frame > 0) {
    part = data::rank_part(tokens / frame, rank, world).size() * frame;
  } else {
    part = data::rank_part(tokens, rank, world).size();
  }
  return rounded(part * width, DType::u8) + (masked ? rounded(part, DType::u8) : 0) + rounded(2, DType::i64);
}

std::vector<PlannedParam> planned_parameters(const MemoryPlanSettings& s) {
  std::vector<PlannedParam> out;
  auto add = [&](const std::string& name, Shape shape, std::vector<int> groups) {
    out.push_back({name, std::move(shape), std::move(groups)});
  };
  if (s.model == "llama") {
    const nn::LlamaConfig& l = s.llama;
    nn::check_llama_config(l);
    const int64_t w = l.width, d = w / l.heads, qkv = w + 2 * l.kv_heads * d, head = static_cast<int>(l.layers) + 1;
    add("wte.weight", {l.vocab, w}, l.tied ? std::vector<int>{0, static_cast<int>(head)} : std::vector<int>{0});
    for (int64_t i = 0; i < l.layers; ++i) {
      const std::string p = "h." + std::to_string(i) + ".";
      const std::vector<int> g{static_cast<int>(i) + 1};
      add(p + "ln_1.weight", {w}, g);
      add(p + "attn.c_attn.weight", {qkv, w}, g);
      if (l.attention_bias) add(p + "attn.c_attn.bias", {qkv}, g);
      add(p + "attn.c_proj.weight", {w, w}, g);
      if (l.attention_bias) add(p + "attn.c_proj.bias", {w}, g);
      add(p + "ln_2.weight", {w}, g);
      add(p + "mlp.c_fc.weight", {2 * l.mlp_hidden, w}, g);
      if (l.mlp_bias) add(p + "mlp.c_fc.bias", {2 * l.mlp_hidden}, g);
      add(p + "mlp.c_proj.weight", {w, l.mlp_hidden}, g);
      if (l.mlp_bias) add(p + "mlp.c_proj.bias", {w}, g);
    }
    add("ln_f.weight", {w}, {static_cast<int>(head)});
    if (!l.tied) add("lm_head.weight", {l.vocab, w}, {static_cast<int>(head)});
    return out;
  }
  TANDEM_CHECK(s.model == "gpt", "memory plan: model ", s.model, " (gpt or llama)");
  const nn::GptConfig& g = s.gpt;
  nn::check_gpt_config(g);
  const int64_t w = g.width;
  const int head = static_cast<int>(g.layers) + 1;
  add("wte.weight", {g.vocab, w}, {0, head});
  add("wpe.weight", {g.context, w}, {0});
  for (int64_t i = 0; i < g.layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const std::vector<int> gr{static_cast<int>(i) + 1};
    auto linear = [&](const std::string& name, int64_t out_f, int64_t in_f) {
      add(p + name + ".weight", {out_f, in_f}, gr);
      if (g.bias) add(p + name + ".bias", {out_f}, gr);
    };
    auto norm = [&](const std::string& name) {
      add(p + name + ".weight", {w}, gr);
      if (g.bias) add(p + name + ".bias", {w}, gr);
    };
    norm("ln_1");
    linear("attn.c_attn", 3 * w, w);
    linear("attn.c_proj", w, w);
    norm("ln_2");
    linear("mlp.c_fc", 4 * w, w);
    linear("mlp.c_proj", w, 4 * w);
  }
  add("ln_f.weight", {w}, {head});
  if (g.bias) add("ln_f.bias", {w}, {head});
  return out;
}

MemoryPlan plan_memory(const MemoryPlanSettings& s) {
  TANDEM_CHECK(s.batch > 0 && s.context > 0 && s.world > 0 && s.accumulate > 0, "memory plan: batch ", s.batch,
               ", context ", s.context, ", ranks ", s.world, ", micro-batches ", s.accumulate, " must be positive");
  const Model m = Builder(s).build();
  const Layout l = lay_out(m.params, s);
  const Dtypes d = dtypes_of(s);
  const bool sharded = s.shard != dist::Shard::none;
  const bool masters = s.master_weights != DType::f32;
  const bool whole_arena = !sharded || s.shard == dist::Shard::optimizer || s.world == 1;
  const bool lazy = s.release_gradients && !sharded;
  MemoryPlan plan;

  // ---- what is held between steps
  int64_t per_param_f32 = 0, per_param_act = 0;
  for (const PlannedParam& p : m.params) {
    per_param_f32 += rounded(p.numel(), DType::f32);
    per_param_act += rounded(p.numel(), d.act);
  }
  if (!sharded) {
    // Rebound into one arena of whole chunks (dist::DistOpt's parameter averager; a chunk is a bucket's size),
    // with a chunk's staging on more than one rank.
    int64_t total = 0;
    for (const PlannedParam& p : m.params) total += p.numel();
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(s.bucket_bytes / 4), total));
    const int64_t chunks = (total + chunk - 1) / chunk;
    plan.weights = rounded(chunks * chunk, DType::f32) + (s.world > 1 && chunks > 1 ? rounded(chunk, DType::f32) : 0);
  } else if (s.shard == dist::Shard::parameters) {
    plan.weights = rounded(l.blocks, DType::f32);
  } else {
    plan.weights = rounded(l.total, DType::f32);  // the parameters rebound into one arena
  }
  // The stepped tensors: every parameter, or this rank's pieces of them (the largest share of any rank).
  int64_t stepped = per_param_f32;
  if (sharded) {
    stepped = 0;
    for (int r = 0; r < s.world; ++r) {
      int64_t mine = 0;
      for (int64_t piece : pieces_of(l, m.params, s.world, r)) mine += rounded(piece, DType::f32);
      stepped = std::max(stepped, mine);
    }
  }
  plan.optimizer_state = state_copies(s) * stepped;
  if (masters) plan.master_weights = stepped;
  if (d.copies) plan.weight_copies = sharded && s.world > 1 ? rounded(l.total, d.act) : per_param_act;
  int64_t kept_gradients = 0;  // held between steps
  if (lazy) {
    for (const PlanBucket& b : l.buckets) plan.gradients += rounded(b.span, DType::f32);
  } else if (whole_arena) {
    kept_gradients = rounded(l.total, DType::f32);
    plan.gradients = kept_gradients;
  } else {
    kept_gradients = rounded(l.blocks, DType::f32);
    plan.gradients = kept_gradients;
  }
  // What the -d method keeps beside the gradients: error-feedback residuals (a whole arena), and its buffers.
  const bool residuals = (s.method == "sparseTopK" || s.method == "sparseThreshold" || s.method == "powerSGD");
  int64_t residual = residuals && s.error_feedback ? rounded(l.total, DType::f32) : 0;
  if (s.method == "half")
    for (const PlanBucket& b : l.buckets) residual += rounded(b.span, s.half_dtype);  // each bucket's wire
  if (s.method == "sparseTopK")
    for (const PlanBucket& b : l.buckets) {
      const double exact = s.spars * static_cast<double>(b.numel);
      const int64_t k = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(exact - 1e-9 * std::max(exact, 1.0))), 1, b.numel);
      residual += rounded(2 * k, DType::i32) + rounded(2 * k * s.world, DType::i32);  // its pairs, and every rank's
    }
  if (s.method == "powerSGD") {
    int64_t longest = 1;
    for (const PlanBucket& b : l.buckets) {
      int64_t pt = 0, qt = 0, whole = 0;
      for (int i : b.params) {
        const Shape& sh = m.params[static_cast<size_t>(i)].shape;
        const int64_t numel = shape_numel(sh), rows = sh.size() >= 2 ? sh[0] : 1, cols = rows > 0 ? numel / rows : 0;
        const int64_t r = std::min<int64_t>({static_cast<int64_t>(s.low_rank), rows, cols});
        if (sh.size() >= 2 && r >= 1 && 2 * r * (rows + cols) <= numel) {
          pt += r * rows;
          qt += r * cols;
          longest = std::max(longest, rows);
          residual += rounded(r * cols, DType::f32);  // the first Q, kept
        } else {
          whole += numel;
        }
      }
      residual += rounded(pt, DType::f32) + rounded(qt, DType::f32) + rounded(whole, DType::f32);
    }
    residual += rounded(longest, DType::f32) + 2 * rounded(1, DType::f32);
  }
  plan.gradients += residual;
  // The batch's tokens and targets, the model's buffers, and the step's small bookkeeping tensors.
  // On a GPU, also cuBLAS's workspace (taken from the device's allocator once, for the process).
  const int64_t small = 2 * rounded(s.batch * s.context, DType::i32) + m.persistent + 16 * rounded(1, DType::f32) +
                        (s.device.is_cuda() ? rounded(int64_t(32) << 20, DType::u8) : 0);
  plan.data = s.data_bytes;
  plan.between_steps = plan.weights + plan.weight_copies + plan.master_weights + plan.optimizer_state +
                       kept_gradients + residual + small + plan.data;

  // ---- building the model: its parameters, then the optimizer's arena they are copied into (the parameter
  // averager's, or under --shard the sharded step's, cut a second time along the layer groups for stage 3)
  Timeline t;
  int64_t largest_param = 0;
  for (const PlannedParam& p : m.params) largest_param = std::max(largest_param, rounded(p.numel(), DType::f32));
  {
    const int64_t arena = sharded ? rounded(l.total, DType::f32) : plan.weights;
    int64_t setup = per_param_f32 + arena + kept_gradients;
    if (s.shard == dist::Shard::parameters) setup = std::max(setup, 2 * arena + kept_gradients);
    setup += small;
    t.add(kState, setup);
    t.mark("building the model (its parameters copied into the optimizer's arena)");
    t.sub(kState, setup);
    t.end_phase(plan.moments);
  }

  // ---- the step
  t.add(kState, plan.between_steps);
  StepWalk walk(s, m, l, t);
  for (int64_t i = 0; i < std::min<int64_t>(s.accumulate, 2); ++i) walk.step(i > 0);
  plan.activations = walk.activations() / std::min<int64_t>(s.accumulate, 2);
  walk.update();
  if (s.eval_batch > 0) walk.evaluate(s.eval_batch);
  plan.moments.insert(plan.moments.end(), walk.moments().begin(), walk.moments().end());
  plan.peak = t.peak();
  plan.peak_at = t.peak_at();
  // A checkpoint of sharded state: the optimizer's state gathered whole on every rank (and, stage 3, the parameters).
  if (s.checkpoint && sharded) {
    int64_t gathered = state_copies(s) * per_param_f32 + (masters ? per_param_f32 : 0);
    int64_t largest = 0;
    for (const PlanBucket& b : l.buckets) largest = std::max(largest, rounded(b.span, DType::f32));
    if (s.shard == dist::Shard::parameters)
      for (const PlanBucket& b : l.buckets) gathered += rounded(b.span, DType::f32);
    const int64_t at = plan.between_steps + gathered + largest;
    plan.moments.push_back({"saving a checkpoint (the sharded state gathered)", at});
    if (at > plan.peak) {
      plan.peak = at;
      plan.peak_at = "saving a checkpoint (the sharded state gathered)";
    }
  }
  plan.workspace = std::max<int64_t>(0, plan.peak - t.at_peak(kState) - t.at_peak(kActivations) - t.at_peak(kGradients));
  if (plan.peak != t.peak()) plan.workspace = plan.peak - plan.between_steps;
  // Host memory beside a GPU run: the model as it is built (on the host, then moved), and a checkpoint's tensors
  // on their way to the file (the model, the optimizer's state).
  if (s.device.is_cuda()) {
    plan.host = per_param_f32 + largest_param;
    if (s.checkpoint)
      plan.host = std::max(plan.host, per_param_f32 + state_copies(s) * per_param_f32 + (masters ? per_param_f32 : 0));
  }
  return plan;
}

std::string memory_table(const MemoryPlan& plan, const MemoryPlanSettings& s, int64_t available, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> cols;
  cols.push_back({"weights", format_bytes(plan.weights)});
  if (plan.data > 0) cols.push_back({"data", format_bytes(plan.data)});
  if (plan.weight_copies > 0) cols.push_back({"16-bit copies", format_bytes(plan.weight_copies)});
  if (plan.master_weights > 0) cols.push_back({"masters", format_bytes(plan.master_weights)});
  cols.push_back({"gradients", format_bytes(plan.gradients)});
  cols.push_back({"optimizer", format_bytes(plan.optimizer_state)});
  cols.push_back({"activations", format_bytes(plan.activations)});
  cols.push_back({"workspace", format_bytes(plan.workspace)});
  cols.push_back({"peak", format_bytes(plan.peak)});
  cols.push_back({"available", available > 0 ? format_bytes(available) : std::string("?")});
  std::string head = "tandem: memory per rank |", row = "tandem: (planned)       |";
  for (auto& [name, value] : cols) {
    const size_t w = std::max(name.size(), value.size());
    head += " " + name + std::string(w - name.size(), ' ') + " |";
    row += " " + value + std::string(w - value.size(), ' ') + " |";
  }
  head.pop_back();
  row.pop_back();
  while (!head.empty() && head.back() == ' ') head.pop_back();
  while (!row.empty() && row.back() == ' ') row.pop_back();
  const bool released = s.release_gradients && s.shard == dist::Shard::none;
  std::string grads = !released ? "kept between steps"
                      : s.accumulate > 1 ? "held from the first micro-batch's backward to the update (" +
                                               std::to_string(s.accumulate) + " micro-batches a step)"
                                         : "held from backward to the update";
  std::string note = "tandem: activations of one micro-batch of " + std::to_string(s.batch) + " x " +
                     std::to_string(s.context) + " tokens under --recompute " + nn::recompute_name(s.recompute) +
                     "; gradients " + grads + "; peak at " + plan.peak_at + "; " + where;
  if (plan.host > 0)
    note += "; host memory beside: " + format_bytes(plan.host) + (s.checkpoint ? " (the model built, a checkpoint saved)" : " (the model built)");
  return head + "\n" + row + "\n" + note;
}

int64_t usable_memory(Device d, int local_ranks) {
  if (const char* e = std::getenv("TANDEM_MEMORY_LIMIT_MIB"); e && *e) {
    char* end = nullptr;
    const double mib = std::strtod(e, &end);
    TANDEM_CHECK(end && *end == '\0' && std::isfinite(mib) && mib > 0, "TANDEM_MEMORY_LIMIT_MIB=", e,
                 ": expected a positive number of MiB");
    return static_cast<int64_t>(mib * 1048576.0);
  }
  const DeviceMemory m = device_memory(d);
  if (m.free == 0) return 0;
  const double total = static_cast<double>(m.total);
  if (d.is_cuda()) {
    // Beside the tensors: library workspaces (cuBLAS, cuDNN), the communicator's buffers, and the blocks the
    // caching allocator rounds up to whole sizes.
    const int64_t reserve = static_cast<int64_t>(512.0 * 1048576.0 + 0.03 * total);
    return std::max<int64_t>(0, static_cast<int64_t>(m.free) - reserve);
  }
  // The host's memory is shared by the ranks on it; each keeps some beside its tensors (the program, its
  // threads, the data's pages).
  const int64_t share = static_cast<int64_t>(m.free) / std::max(local_ranks, 1);
  return std::max<int64_t>(0, share - static_cast<int64_t>(256.0 * 1048576.0));
}

std::vector<std::string> fitting_flags(const MemoryPlanSettings& s, int64_t budget, bool total_batch_tokens) {
  std::vector<std::string> out;
  auto fits = [&](const MemoryPlanSettings& c) { return plan_memory(c).peak <= budget; };
  const double dropout = s.model == "llama" ? s.llama.dropout : s.gpt.dropout;
  const std::string recompute = dropout > 0.0 ? "--dropout 0 --recompute full" : "--recompute full";
  auto with_recompute = [&](MemoryPlanSettings c) {
    c.recompute = RecomputePolicy::full;
    c.gpt.dropout = 0.0;
    c.llama.dropout = 0.0;
    return c;
  };
  const int64_t step_tokens = s.batch * s.context * s.accumulate * s.world;
  // A smaller micro-batch, the step's tokens kept by more of them.
  auto smaller_batch = [&](const MemoryPlanSettings& base, const std::string& extra) {
    for (int64_t b = s.batch / 2; b >= 1; b /= 2) {
      MemoryPlanSettings c = base;
      c.batch = b;
      if (total_batch_tokens) c.accumulate = s.accumulate * s.batch / b;
      if (total_batch_tokens && s.batch % b != 0) continue;
      if (!fits(c)) continue;
      std::string f = "--batch-size " + std::to_string(b);
      if (total_batch_tokens) f += " --total-batch-tokens " + std::to_string(step_tokens);
      return extra.empty() ? f : extra + " " + f;
    }
    return std::string();
  };
  if (s.recompute != RecomputePolicy::full && fits(with_recompute(s))) out.push_back(recompute);
  if (std::string f = smaller_batch(s, ""); !f.empty()) out.push_back(f);
  if (out.empty() && s.recompute != RecomputePolicy::full)
    if (std::string f = smaller_batch(with_recompute(s), recompute); !f.empty()) out.push_back(f);
  // Sharded state: on these ranks, or on more.
  const std::vector<std::pair<dist::Shard, const char*>> stages = {{dist::Shard::optimizer, "optimizer"},
                                                                   {dist::Shard::gradients, "gradients"},
                                                                   {dist::Shard::parameters, "parameters"}};
  const bool shardable = s.method == "plain" || s.method == "half";
  if (shardable && s.world > 1)
    for (auto [stage, name] : stages) {
      if (static_cast<int>(stage) <= static_cast<int>(s.shard)) continue;
      MemoryPlanSettings c = s;
      c.shard = stage;
      if (fits(c)) {
        out.push_back(std::string("--shard ") + name);
        break;
      }
    }
  if (shardable && out.size() < 3)
    for (int n = std::max(2, s.world * 2); n <= 1024; n *= 2) {
      MemoryPlanSettings c = s;
      c.shard = dist::Shard::parameters;
      c.world = n;
      if (fits(c)) {
        out.push_back("--shard parameters on " + std::to_string(n) + " ranks");
        break;
      }
      if (s.recompute != RecomputePolicy::full && fits(with_recompute(c))) {
        out.push_back(recompute + " --shard parameters on " + std::to_string(n) + " ranks");
        break;
      }
    }
  if (out.size() > 3) out.resize(3);
  return out;
}

}  // namespace tandem::cli
