// DistOpt: one engine for every synchronisation mode. Parameters and gradients live in two flat
// arenas (each parameter and its gradient is a view into them); gradients are grouped into buckets
// in the order backward produces them, and each bucket is reduced the moment its last gradient is
// final, while backward continues. Modes differ only in what a bucket sends and how the result is
// written back (launch_bucket / finish_bucket); partial mode sends parameters after the step instead.
#include "tandem/distributed/dist_opt.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "backend/backend.h"
#include "core/tensor_impl.h"
#include "distributed/sync_check.h"
#include "tandem/autograd.h"

namespace tandem::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::string normalise(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '-' && c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_sparse(SyncMode m) { return m == SyncMode::SparseTopK || m == SyncMode::SparseThreshold; }

// ceil(spars * n), clamped to [1, n]. The product is taken a hair low: spars arrives rounded to a
// double (0.07 is 0.07000000000000000666), and 0.07 * 700 must give 49 values, not 50.
int64_t top_k_count(double spars, int64_t n) {
  double exact = spars * static_cast<double>(n);
  auto k = static_cast<int64_t>(std::ceil(exact - 1e-9 * std::max(exact, 1.0)));
  return std::clamp<int64_t>(k, 1, n);
}

}  // namespace

SyncMode parse_sync_mode(const std::string& s) {
  std::string n = normalise(s);
  if (n == "plain") return SyncMode::Plain;
  if (n == "half" || n == "fp16" || n == "f16") return SyncMode::Half;
  if (n == "partialupdate" || n == "partial") return SyncMode::Partial;
  if (n == "sparsetopk" || n == "topk") return SyncMode::SparseTopK;
  if (n == "sparsethreshold" || n == "threshold") return SyncMode::SparseThreshold;
  TANDEM_CHECK(false, "unknown distributed option '", s,
               "' (choose plain, half, partialUpdate, sparseTopK or sparseThreshold)");
}

const char* sync_mode_name(SyncMode m) {
  switch (m) {
    case SyncMode::Plain: return "plain";
    case SyncMode::Half: return "half";
    case SyncMode::Partial: return "partialUpdate";
    case SyncMode::SparseTopK: return "sparseTopK";
    case SyncMode::SparseThreshold: return "sparseThreshold";
  }
  return "?";
}

class DistOpt::Engine {
 public:
  struct Param {
    Tensor tensor;
    int64_t numel = 0;
    int64_t param_offset = 0;  // in the parameter arena (registration order)
    int64_t grad_offset = 0;   // in the gradient arena (bucket order)
    Tensor grad_view;          // its slot in the gradient arena, shaped like the parameter
    int bucket = -1;
    bool ready = false;
  };
  struct Bucket {
    int64_t offset = 0, numel = 0;  // range of the gradient arena
    std::vector<int> params;
    int pending = 0;
    WorkPtr work;
    Tensor grad;        // view of the gradient arena
    Tensor staging;     // half mode: the 16-bit copy that travels
    Tensor residual;    // sparse modes with error feedback: accumulated gradient not sent yet
    Tensor pairs;       // sparse modes: this rank's (index, value bits) pairs, i32 interleaved
    Tensor all_pairs;   // sparse modes: every rank's pairs, gathered
    Tensor count;       // threshold mode: this rank's pair count (i64, one element)
    Tensor all_counts;  // threshold mode: every rank's pair count
    std::vector<int64_t> gathered_counts;  // pairs per rank in all_pairs
  };

  Engine(DistOpt& owner, DistOptOptions options) : owner_(owner), options_(options) {}

  DistOpt& owner_;
  DistOptOptions options_;
  Device device;
  int world = 1;
  std::vector<Param> params;
  std::unordered_map<TensorImpl*, int> index;
  Tensor param_arena, grad_arena;
  std::vector<Bucket> buckets;
  size_t next_launch = 0;
  std::vector<int> ready_order;
  bool rebuilt = false;
  std::vector<std::pair<int64_t, int64_t>> chunks;  // partial mode: ranges of the parameter arena
  size_t next_chunk = 0;
  nn::NamedTensors buffers;
  std::vector<std::string> names;  // per parameter, from sync_parameters (or "parameter i")
  CommStats stats;
  bool trace_on = false;
  std::vector<std::string> trace;
  // the current step
  SyncMode mode = SyncMode::Plain;
  double spars = 0.05;
  bool corr = true;
  double clip = 0.0;  // half mode: clip gradients into [-clip, clip] when positive

  backend::Backend& be() { return backend::backend_for(device); }
  Communicator& comm() { return *owner_.comm_; }

  void count_all_reduce(int64_t bytes) {
    int64_t wire = bytes * 2 * (world - 1) / world;
    stats.bytes_sent += wire;
    stats.bytes_received += wire;
    stats.collectives++;
  }

  void wait(WorkPtr& w) {
    if (!w) return;
    auto t0 = Clock::now();
    w->wait();
    stats.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    w.reset();
  }

  void layout_buckets(const std::vector<int>& order) {
    for (auto& b : buckets) TANDEM_ASSERT(!b.work, "bucket re-layout with a collective in flight");
    buckets.clear();
    auto limit_of = [&](size_t k) { return k == 0 ? options_.first_bucket_bytes : options_.bucket_bytes; };
    int64_t offset = 0;
    for (int i : order) {
      Param& q = params[static_cast<size_t>(i)];
      bool full = !buckets.empty() &&
                  static_cast<size_t>(buckets.back().numel + q.numel) * sizeof(float) > limit_of(buckets.size() - 1);
      if (buckets.empty() || full) {
        Bucket b;
        b.offset = offset;
        buckets.push_back(std::move(b));
      }
      Bucket& b = buckets.back();
      q.grad_offset = offset;
      q.bucket = static_cast<int>(buckets.size() - 1);
      b.params.push_back(i);
      b.numel += q.numel;
      offset += q.numel;
    }
    for (auto& b : buckets) b.grad = grad_arena.narrow(0, b.offset, b.numel);
    for (auto& q : params) {
      q.grad_view = grad_arena.narrow(0, q.grad_offset, q.numel).view(q.tensor.shape());
      q.tensor.set_grad(q.grad_view);
    }
  }

  // ---- one training step
  void begin_step() {
    grad_arena.zero_();
    // zero_grad(set_to_none) drops the gradients: backward would then write fresh tensors outside
    // the arena, and nothing this rank computed would be sent. Point them back into it.
    for (auto& q : params) {
      q.ready = false;
      q.tensor.set_grad(q.grad_view);
    }
    for (auto& b : buckets) b.pending = static_cast<int>(b.params.size());
    next_launch = 0;
    ready_order.clear();
  }

  void on_ready(const Tensor& leaf) {
    auto it = index.find(leaf.impl());
    if (it == index.end()) return;  // a tensor the optimizer does not manage
    Param& q = params[static_cast<size_t>(it->second)];
    if (q.ready) return;
    q.ready = true;
    ready_order.push_back(it->second);
    if (--buckets[static_cast<size_t>(q.bucket)].pending == 0) launch_ready();
  }

  // Buckets are launched strictly in order so that every rank issues the same collectives in the
  // same sequence, whatever order gradients happen to arrive in.
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch_bucket(next_launch++);
  }

  void launch_bucket(size_t k) {
    Bucket& b = buckets[k];
    if (trace_on) trace.push_back("launch " + std::to_string(k));
    switch (mode) {
      case SyncMode::Plain:
        b.work = comm().all_reduce(b.grad, ReduceOp::Avg);
        count_all_reduce(b.numel * 4);
        break;
      case SyncMode::Half: {
        if (!b.staging.defined() || b.staging.dtype() != options_.half_dtype)
          b.staging = Tensor::empty({b.numel}, options_.half_dtype, device);
        // Pre-divide by the world size: the f16 sum then cannot overflow where the average would not.
        // The kernel clips after scaling, so the bound is scaled too: each rank's gradient values are
        // clipped into [-clip, clip] before they are averaged.
        be().scale_cast(b.grad, b.staging, 1.0 / world, clip / world);
        b.work = comm().all_reduce(b.staging, ReduceOp::Sum);
        count_all_reduce(b.numel * static_cast<int64_t>(dtype_size(options_.half_dtype)));
        break;
      }
      case SyncMode::SparseTopK:
      case SyncMode::SparseThreshold: launch_sparse(b); break;
      case SyncMode::Partial: TANDEM_ASSERT(false, "partial mode sends no gradient buckets");
    }
  }

  void launch_sparse(Bucket& b) {
    if (corr) {
      if (!b.residual.defined()) b.residual = Tensor::zeros({b.numel}, DType::f32, device);
      be().binary(backend::Binary::Add, b.grad, b.residual, b.grad);  // accumulated gradient
    }
    if (mode == SyncMode::SparseTopK) {
      int64_t k = top_k_count(spars, b.numel);
      // The buffers may come from another spars or from threshold mode: size them for this k.
      if (!b.pairs.defined() || b.pairs.numel() != 2 * k) b.pairs = Tensor::empty({2 * k}, DType::i32, device);
      if (!b.all_pairs.defined() || b.all_pairs.numel() < 2 * k * world)
        b.all_pairs = Tensor::empty({2 * k * world}, DType::i32, device);
      be().sparse_topk(b.grad, k, b.pairs);
      if (corr) save_residual(b, k);
      Tensor out = b.all_pairs.narrow(0, 0, 2 * k * world);
      b.work = comm().all_gather(b.pairs, out);
      b.gathered_counts.assign(static_cast<size_t>(world), k);
      int64_t bytes = 2 * k * 4;
      stats.bytes_sent += bytes * (world - 1);
      stats.bytes_received += bytes * (world - 1);
      stats.collectives++;
    } else {
      // Room for every value of the bucket (top-K mode may have left a smaller pair buffer).
      if (!b.pairs.defined() || b.pairs.numel() < 2 * b.numel)
        b.pairs = Tensor::empty({2 * b.numel}, DType::i32, device);
      if (!b.count.defined()) {
        b.count = Tensor::empty({1}, DType::i64, device);
        b.all_counts = Tensor::empty({world}, DType::i64, device);
      }
      be().sparse_threshold(b.grad, spars, b.pairs, b.count);
      // The sizes of every rank's selection decide the gather layout: this is the one host wait.
      WorkPtr w = comm().all_gather(b.count, b.all_counts);
      wait(w);
      std::vector<int64_t> counts = b.all_counts.to_vector<int64_t>();
      int64_t mine = counts[static_cast<size_t>(comm().rank())];
      if (corr) save_residual(b, mine);
      int64_t total = 0;
      std::vector<int64_t> sizes;
      for (int64_t c : counts) {
        sizes.push_back(2 * c);
        total += 2 * c;
      }
      if (!b.all_pairs.defined() || b.all_pairs.numel() < std::max<int64_t>(total, 1))
        b.all_pairs = Tensor::empty({std::max<int64_t>(total, 1)}, DType::i32, device);
      Tensor out = b.all_pairs.narrow(0, 0, total);
      b.work = comm().all_gatherv(b.pairs.narrow(0, 0, 2 * mine), out, sizes);
      b.gathered_counts = counts;
      stats.bytes_sent += 2 * mine * 4 * (world - 1) + 8 * (world - 1);
      stats.bytes_received += (total - 2 * mine) * 4 + 8 * (world - 1);
      stats.collectives += 2;
    }
  }

  // residual = accumulated gradient with the entries being sent set to zero.
  void save_residual(Bucket& b, int64_t sent) {
    be().copy_bytes(b.grad.data_ptr(), b.residual.data_ptr(), static_cast<size_t>(b.numel) * 4, device.index);
    be().sparse_zero(b.residual, b.pairs, sent);
  }

  void finish_bucket(Bucket& b) {
    wait(b.work);
    switch (mode) {
      case SyncMode::Plain: break;
      case SyncMode::Half: be().scale_cast(b.staging, b.grad, 1.0, 0.0); break;
      case SyncMode::SparseTopK:
      case SyncMode::SparseThreshold: {
        // Every rank adds the gathered pairs rank by rank, in the same order: identical results.
        b.grad.zero_();
        int64_t off = 0;
        for (int64_t c : b.gathered_counts) {
          if (c > 0) be().sparse_accumulate(b.grad, b.all_pairs.narrow(0, off, 2 * c), c, 1.0 / world);
          off += 2 * c;
        }
        break;
      }
      case SyncMode::Partial: break;
    }
  }

  void run_step(const Tensor& loss) {
    stats.steps++;
    if (world == 1) {  // nothing to exchange: the plain local step
      begin_step();
      backward(loss);
      // Clipping changes what is applied, not only what travels: a single process clips too.
      if (mode == SyncMode::Half && clip > 0.0) be().scale_cast(grad_arena, grad_arena, 1.0, clip);
      owner_.opt_->step();
      return;
    }
    if (mode == SyncMode::Partial) {
      begin_step();
      backward(loss);
      owner_.opt_->step();
      average_chunk(next_chunk);
      next_chunk = (next_chunk + 1) % chunks.size();
      return;
    }
    // The layout learnt from the first step is adopted when the next one starts, once the gradients a
    // caller may read after a step are about to be zeroed anyway: the views move, the values need not.
    if (!rebuilt && options_.rebuild_buckets && !ready_order.empty()) rebuild_from_observed_order();
    begin_step();
    backward(loss, [this](const Tensor& leaf) { on_ready(leaf); });
    if (trace_on) trace.push_back("backward_done");
    // Parameters that took no part in this loss: their (zero) gradients still travel, in order.
    for (auto& b : buckets) b.pending = 0;
    launch_ready();
    for (auto& b : buckets) finish_bucket(b);
    owner_.opt_->step();
  }

  // After the first step the real gradient order is known: lay buckets out in that order, so each
  // fills as early as possible. Ranks whose graphs differ see different orders; all adopt rank 0's,
  // since every rank must reduce the same buckets.
  void rebuild_from_observed_order() {
    rebuilt = true;
    std::vector<int> order = ready_order;
    std::vector<bool> seen(params.size(), false);
    for (int i : order) seen[static_cast<size_t>(i)] = true;
    for (size_t i = params.size(); i-- > 0;)
      if (!seen[i]) order.push_back(static_cast<int>(i));
    if (world > 1) {
      std::vector<int64_t> mine(order.begin(), order.end());
      Tensor t = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}).to(device);
      WorkPtr w = comm().broadcast(t, 0);
      wait(w);
      std::vector<int64_t> agreed = t.to_vector<int64_t>();
      order.assign(agreed.begin(), agreed.end());
    }
    for (auto& b : buckets) b.work.reset();
    // Error feedback belongs to the parameters, not to the buckets: each parameter's residual moves
    // to its place in the new layout (the views keep the old buckets' storage alive meanwhile).
    std::vector<Tensor> kept(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& q = params[i];
      const Bucket& b = buckets[static_cast<size_t>(q.bucket)];
      if (b.residual.defined()) kept[i] = b.residual.narrow(0, q.grad_offset - b.offset, q.numel);
    }
    layout_buckets(order);
    for (auto& b : buckets)
      for (int i : b.params) {
        const Param& q = params[static_cast<size_t>(i)];
        if (!kept[static_cast<size_t>(i)].defined()) continue;
        if (!b.residual.defined()) b.residual = Tensor::zeros({b.numel}, DType::f32, device);
        b.residual.narrow(0, q.grad_offset - b.offset, q.numel).copy_(kept[static_cast<size_t>(i)]);
      }
  }

  void average_chunk(size_t k) {
    auto [off, n] = chunks[k];
    Tensor view = param_arena.narrow(0, off, n);
    WorkPtr w = comm().all_reduce(view, ReduceOp::Avg);
    count_all_reduce(n * 4);
    wait(w);
  }
};

DistOpt::DistOpt(std::shared_ptr<optim::Optimizer> opt, std::shared_ptr<Communicator> comm, DistOptOptions options)
    : opt_(std::move(opt)), comm_(std::move(comm)) {
  TANDEM_CHECK(opt_ != nullptr, "DistOpt needs an optimizer");
  TANDEM_CHECK(comm_ != nullptr, "DistOpt needs a communicator");
  TANDEM_CHECK(options.bucket_bytes >= 1024 && options.first_bucket_bytes >= 1024,
               "DistOpt bucket sizes must be at least 1 KiB");
  TANDEM_CHECK(options.half_dtype == DType::f16 || options.half_dtype == DType::bf16,
               "DistOpt half mode sends f16 or bf16, not ", dtype_name(options.half_dtype));
  engine_ = std::make_unique<Engine>(*this, options);
  Engine& e = *engine_;
  e.device = comm_->device();
  e.world = comm_->size();
  const auto& ps = opt_->params();
  TANDEM_CHECK(!ps.empty(), "DistOpt: the optimizer has no parameters");
  int64_t total = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const Tensor& p = ps[i];
    TANDEM_CHECK(p.dtype() == DType::f32, "DistOpt: parameter ", i, " is ", p.str(), "; f32 parameters are required");
    TANDEM_CHECK(p.device() == e.device, "DistOpt: parameter ", i, " is on ", p.device().str(),
                 " but the communicator (", comm_->backend_name(), ") moves tensors on ", e.device.str(),
                 "; move the model there first");
    TANDEM_CHECK(e.index.emplace(p.impl(), static_cast<int>(i)).second, "DistOpt: parameter ", i,
                 " is listed twice by the optimizer");
    Engine::Param q;
    q.tensor = p;
    q.numel = p.numel();
    q.param_offset = total;
    total += q.numel;
    e.params.push_back(q);
  }
  // Parameters move into one arena: one broadcast syncs them, and partial mode averages ranges of it.
  e.param_arena = Tensor::empty({total}, DType::f32, e.device);
  for (auto& q : e.params) {
    Tensor slot = e.param_arena.narrow(0, q.param_offset, q.numel).view(q.tensor.shape());
    slot.copy_(q.tensor.detach());
    rebind_storage(q.tensor, slot);
  }
  e.grad_arena = Tensor::zeros({total}, DType::f32, e.device);
  // Until the first step shows the real order, expect gradients in reverse registration order.
  std::vector<int> order(e.params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
  e.layout_buckets(order);
  int64_t chunk = static_cast<int64_t>(options.bucket_bytes / sizeof(float));
  for (int64_t off = 0; off < total; off += chunk) e.chunks.emplace_back(off, std::min(chunk, total - off));
}

DistOpt::~DistOpt() {
  // Collectives still in flight must finish before their buffers go away.
  for (auto& b : engine_->buckets)
    if (b.work) try {
        b.work->wait();
      } catch (const std::exception&) {
      }
}

int DistOpt::rank_in_local() const { return comm_->local_rank(); }
int DistOpt::rank_in_global() const { return comm_->rank(); }
int DistOpt::world_size() const { return comm_->size(); }
const CommStats& DistOpt::stats() const { return engine_->stats; }
void DistOpt::reset_stats() { engine_->stats = CommStats{}; }
void DistOpt::set_trace(bool on) { engine_->trace_on = on; }
const std::vector<std::string>& DistOpt::trace() const { return engine_->trace; }
const DistOptOptions& DistOpt::options() const { return engine_->options_; }

std::vector<int64_t> DistOpt::bucket_sizes() const {
  std::vector<int64_t> out;
  for (const auto& b : engine_->buckets) out.push_back(b.numel);
  return out;
}

void DistOpt::backward_and_update(const Tensor& loss) { step(SyncMode::Plain, loss); }

void DistOpt::backward_and_update_half(const Tensor& loss, bool clipping, double clip_value) {
  TANDEM_CHECK(!clipping || clip_value > 0.0, "backward_and_update_half: clip value must be positive, got ",
               clip_value);
  step(SyncMode::Half, loss, 0.05, true, clipping ? clip_value : 0.0);
}

void DistOpt::backward_and_partial_update(const Tensor& loss) { step(SyncMode::Partial, loss); }

void DistOpt::backward_and_sparse_update(const Tensor& loss, double spars, bool topK, bool corr) {
  step(topK ? SyncMode::SparseTopK : SyncMode::SparseThreshold, loss, spars, corr);
}

void DistOpt::step(SyncMode mode, const Tensor& loss, double spars, bool corr, double clip) {
  TANDEM_CHECK(clip >= 0.0, "the half mode's clip value must not be negative, got ", clip);
  if (mode == SyncMode::SparseTopK)
    TANDEM_CHECK(spars > 0.0 && spars <= 1.0, "sparseTopK: spars is the fraction of gradients sent, in (0, 1]; got ",
                 spars);
  if (mode == SyncMode::SparseThreshold)
    TANDEM_CHECK(spars >= 0.0, "sparseThreshold: spars is the magnitude threshold and must not be negative; got ",
                 spars);
  Engine& e = *engine_;
  if (is_sparse(e.mode) && e.mode != mode)
    for (auto& b : e.buckets) b.residual = Tensor();  // error feedback belongs to one mode
  e.mode = mode;
  e.spars = spars;
  e.corr = corr;
  e.clip = mode == SyncMode::Half ? clip : 0.0;
  e.run_step(loss);
}

void DistOpt::average_parameters() {
  Engine& e = *engine_;
  if (e.world == 1) return;
  for (size_t k = 0; k < e.chunks.size(); ++k) e.average_chunk(k);
  average_buffers();
}

void DistOpt::average_buffers() {
  Engine& e = *engine_;
  if (e.world == 1) return;
  for (auto& [name, t] : e.buffers) {
    if (!is_floating(t.dtype())) continue;
    WorkPtr w = comm_->all_reduce(t, ReduceOp::Avg);
    e.count_all_reduce(static_cast<int64_t>(t.nbytes()));
    e.wait(w);
  }
}

void DistOpt::sync_parameters(nn::Module& model) {
  Engine& e = *engine_;
  nn::NamedTensors named = model.named_parameters();
  std::vector<std::string> names(e.params.size());
  for (auto& [name, t] : named) {
    auto it = e.index.find(t.impl());
    if (it != e.index.end()) names[static_cast<size_t>(it->second)] = name;
  }
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].empty()) names[i] = "parameter " + std::to_string(i);
  e.buffers = model.named_buffers();
  for (auto& [name, t] : e.buffers)
    TANDEM_CHECK(t.device() == e.device, "sync_parameters: buffer ", name, " is on ", t.device().str(),
                 " but the model's parameters are on ", e.device.str());
  std::vector<Tensor> tensors;
  for (auto& q : e.params) tensors.push_back(q.tensor);
  e.names = names;
  check_same_model(*comm_, names, tensors, e.buffers);
  if (e.world == 1) return;
  WorkPtr w = comm_->broadcast(e.param_arena, 0);
  e.wait(w);
  for (auto& [name, t] : e.buffers) {
    WorkPtr wb = comm_->broadcast(t, 0);
    e.wait(wb);
  }
}

void DistOpt::check_consistency(bool include_buffers) {
  Engine& e = *engine_;
  std::vector<std::string> names = e.names;
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < e.params.size(); ++i) {
    tensors.push_back(e.params[i].tensor);
    if (names.size() <= i) names.push_back("parameter " + std::to_string(i));
  }
  if (include_buffers)
    for (auto& [name, t] : e.buffers) {
      tensors.push_back(t);
      names.push_back(name);
    }
  check_identical_values(*comm_, tensors, names);
}

}  // namespace tandem::dist
