// The reducer, in the order a step uses it: the arena and its bucket layout, then begin, the
// backward hook (on_ready, launch_ready), finish, and the rebuild that adopts the order gradients
// really arrive in. The codec decides what travels; the reducer decides when.
#include "distributed/engine/reducer.h"

#include <cmath>

#include "backend/backend.h"
#include "core/tensor_impl.h"

namespace tandem::dist::detail {

namespace {

bool is_16bit(DType t) { return t == DType::f16 || t == DType::bf16; }

}  // namespace

Reducer::Reducer(const std::vector<Tensor>& params, std::shared_ptr<Communicator> comm, ReducerOptions options,
                 CommStats& stats, const std::vector<Tensor>& masters)
    : comm_(std::move(comm)), options_(options), stats_(stats), device_(comm_->device()), world_(comm_->size()) {
  TANDEM_CHECK(!params.empty(), "DistOpt: the optimizer has no parameters");
  const DType dtype = params[0].dtype();
  TANDEM_CHECK(dtype == DType::f32 || is_16bit(dtype), "DistOpt: parameters are ", dtype_name(dtype),
               "; gradients are reduced in f32, f16 or bf16");
  TANDEM_CHECK(masters.empty() || masters.size() == params.size(), "DistOpt: ", masters.size(),
               " f32 master copies for ", params.size(), " parameters");
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    TANDEM_CHECK(p.dtype() == dtype, "DistOpt: parameter ", i, " is ", p.str(), " but parameter 0 is ",
                 dtype_name(dtype), "; one gradient dtype is required");
    TANDEM_CHECK(p.device() == device_, "DistOpt: parameter ", i, " is on ", p.device().str(),
                 " but the communicator (", comm_->backend_name(), ") moves tensors on ", device_.str(),
                 "; move the model there first");
    TANDEM_CHECK(index_.emplace(p.impl(), static_cast<int>(i)).second, "DistOpt: parameter ", i,
                 " is listed twice by the optimizer");
    Slot s;
    s.param = p;
    s.numel = p.numel();
    if (!masters.empty()) {
      s.master = masters[i];
      TANDEM_CHECK(s.master.dtype() == DType::f32 && s.master.numel() == s.numel && s.master.device() == device_,
                   "DistOpt: master copy ", i, " is ", s.master.str(), " for parameter ", p.str());
    }
    total += s.numel;
    slots_.push_back(std::move(s));
  }
  arena_ = Tensor::zeros({total}, dtype, device_);
  if (!masters.empty()) master_arena_ = Tensor::zeros({total}, DType::f32, device_);
  total_ = Tensor::zeros({1}, DType::f32, device_);
  norm_sq_ = Tensor::zeros({1}, DType::f32, device_);
  // Until the first step shows the real order, expect gradients in reverse registration order.
  std::vector<int> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
  layout(order);
}

Reducer::~Reducer() = default;

// Packs parameters into buckets in `order` (a tensor larger than a bucket gets one of its own) and
// points every view at its new place. Residuals belong to parameters, not to buckets: each one
// moves to its parameter's new slot. Gradients do not move: a layout is only adopted when they are
// about to be zeroed.
void Reducer::layout(const std::vector<int>& order) {
  const size_t elem = dtype_size(arena_.dtype());
  auto limit_of = [&](size_t k) { return k == 0 ? options_.first_bucket_bytes : options_.bucket_bytes; };
  buckets_.clear();
  int64_t offset = 0;
  for (int i : order) {
    Slot& s = slots_[static_cast<size_t>(i)];
    bool full = !buckets_.empty() &&
                static_cast<size_t>(buckets_.back().numel + s.numel) * elem > limit_of(buckets_.size() - 1);
    if (buckets_.empty() || full) {
      Bucket b;
      b.index = static_cast<int>(buckets_.size());
      b.offset = offset;
      buckets_.push_back(std::move(b));
    }
    Bucket& b = buckets_.back();
    s.offset = offset;
    s.bucket = b.index;
    b.params.push_back(i);
    b.starts.push_back(b.numel);
    b.numel += s.numel;
    offset += s.numel;
  }
  Tensor old_residual = residual_arena_;
  if (old_residual.defined()) residual_arena_ = Tensor::zeros({arena_.numel()}, DType::f32, device_);
  for (Slot& s : slots_) {
    const Shape& shape = s.param.shape();
    s.grad = arena_.narrow(0, s.offset, s.numel).view(shape);
    s.param.set_grad(s.grad);
    if (master_arena_.defined()) {
      s.master_grad = master_arena_.narrow(0, s.offset, s.numel).view(shape);
      s.master.set_grad(s.master_grad);
    }
    if (residual_arena_.defined()) {
      Tensor moved = residual_arena_.narrow(0, s.offset, s.numel).view(shape);
      if (s.residual.defined()) moved.copy_(s.residual);
      s.residual = moved;
    }
  }
  for (Bucket& b : buckets_) {
    b.grad = arena_.narrow(0, b.offset, b.numel);
    if (residual_arena_.defined()) b.residual = residual_arena_.narrow(0, b.offset, b.numel);
  }
  bucket_sums_ = Tensor::zeros({static_cast<int64_t>(buckets_.size())}, DType::f32, device_);
  bucket_sum_views_.clear();
  for (size_t k = 0; k < buckets_.size(); ++k)
    bucket_sum_views_.push_back(bucket_sums_.narrow(0, static_cast<int64_t>(k), 1));
  if (codec_) codec_->on_layout(buckets_);
}

void Reducer::set_codec(std::unique_ptr<GradCodec> codec, bool keep_residuals) {
  codec_ = std::move(codec);
  bool keep = keep_residuals && codec_->keeps_residual() && residual_arena_.defined();
  if (!keep) {
    residual_arena_ = codec_->keeps_residual() ? Tensor::zeros({arena_.numel()}, DType::f32, device_) : Tensor();
    for (Slot& s : slots_)
      s.residual = residual_arena_.defined() ? residual_arena_.narrow(0, s.offset, s.numel).view(s.param.shape())
                                             : Tensor();
    for (Bucket& b : buckets_)
      b.residual = residual_arena_.defined() ? residual_arena_.narrow(0, b.offset, b.numel) : Tensor();
  }
  codec_->on_layout(buckets_);
}

// ---- one step

void Reducer::begin(bool accumulate) {
  if (!accumulate) {
    if (rebuild_due_) rebuild();
    arena_.zero_();
    if (options_.check_finite) save_carried();
  }
  for (Slot& s : slots_) {
    s.ready = false;
    s.param.set_grad(s.grad, /*zeroed=*/!accumulate);
    if (s.master.defined()) s.master.set_grad(s.master_grad);
  }
  for (Bucket& b : buckets_) b.pending = static_cast<int>(b.params.size());
  next_launch_ = 0;
  ready_order_.clear();
  checked_ = false;
}

void Reducer::on_ready(const Tensor& leaf) {
  auto it = index_.find(leaf.impl());
  if (it == index_.end()) return;  // a tensor the optimizer does not manage
  Slot& s = slots_[static_cast<size_t>(it->second)];
  if (s.ready) return;
  s.ready = true;
  ready_order_.push_back(it->second);
  if (--buckets_[static_cast<size_t>(s.bucket)].pending == 0) launch_ready();
}

// Buckets are launched strictly in order so that every rank issues the same collectives in the
// same sequence, whatever order gradients happen to arrive in.
void Reducer::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    if (trace_on_) trace_.push_back("launch " + std::to_string(next_launch_));
    Bucket& b = buckets_[next_launch_++];
    apply_gradient_scale(b);
    codec_->launch(b);
  }
}

namespace {

// The master arena's copy of the bucket's range, or the bucket's own gradient.
Tensor f32_range(const Tensor& master_arena, const Bucket& b) {
  return master_arena.defined() ? master_arena.narrow(0, b.offset, b.numel) : b.grad;
}

}  // namespace

void Reducer::finish() {
  TANDEM_ASSERT(codec_, "gradients synchronised before a codec was set");
  if (trace_on_) trace_.push_back("backward_done");
  // Parameters that took no part in this loss: their (zero) gradients still travel, in order.
  for (Bucket& b : buckets_) b.pending = 0;
  launch_ready();
  for (Bucket& b : buckets_) codec_->finish(b);
  finalize();
  if (options_.rebuild_buckets && !rebuilt_ && world_ > 1) rebuild_due_ = true;
}

void Reducer::finish_locally() {
  TANDEM_ASSERT(codec_, "gradients synchronised before a codec was set");
  for (Bucket& b : buckets_) {
    apply_gradient_scale(b);
    codec_->apply_locally(b);
  }
  finalize();
}

void Reducer::finish_unsynced() {
  for (Bucket& b : buckets_) apply_gradient_scale(b);
  finalize();
}

// A 16-bit arena is scaled in f32, after its conversion (finalize): its codecs keep no residual.
void Reducer::apply_gradient_scale(Bucket& b) {
  if (factor_.defined() && !master_arena_.defined()) backend::backend_for(device_).scale_by(b.grad, factor_, b.grad);
}

std::vector<Tensor> Reducer::carried() {
  std::vector<Tensor> out;
  if (residual_arena_.defined()) out.push_back(residual_arena_);
  if (codec_)
    for (Tensor& t : codec_->carried_buffers()) out.push_back(t);
  return out;
}

// What a step will change and must not keep if it proves non-finite (an inf folded into a residual or
// into PowerSGD's Q would make every later step non-finite too): copied before the step, put back by
// finalize on the device when the verdict is not finite.
void Reducer::save_carried() {
  std::vector<Tensor> now = carried();
  if (carried_saved_.size() != now.size()) carried_saved_.assign(now.size(), Tensor());
  for (size_t i = 0; i < now.size(); ++i) {
    if (!carried_saved_[i].defined() || carried_saved_[i].numel() != now[i].numel())
      carried_saved_[i] = Tensor::empty({now[i].numel()}, now[i].dtype(), device_);
    carried_saved_[i].copy_(now[i].view({now[i].numel()}));
  }
}

// Hands f32 to the optimizer, and decides whether any average is inf/NaN: a bucket's sum is finite
// exactly when its values are (a finite sum overflowing would mean gradients near 1e38, useless
// anyway). One tiny all-reduce makes the verdict the same on every rank even if their sums round
// differently; a NaN anywhere makes the total NaN everywhere.
void Reducer::finalize() {
  backend::Backend& be = backend::backend_for(device_);
  if (master_arena_.defined())
    for (Bucket& b : buckets_) {
      Tensor dst = master_arena_.narrow(0, b.offset, b.numel);
      be.scale_cast(b.grad, dst, 1.0, 0.0);
      if (factor_.defined()) be.scale_by(dst, factor_, dst);
    }
  if (!options_.check_finite) return;
  checked_ = true;
  for (size_t k = 0; k < buckets_.size(); ++k) be.sum(f32_range(master_arena_, buckets_[k]), bucket_sum_views_[k]);
  be.sum(bucket_sums_, total_);
  if (world_ > 1) {
    WorkPtr w = comm_->all_reduce(total_, ReduceOp::Sum);
    count_all_reduce(stats_, 4, world_);
    timed_wait(w, stats_);
  }
  std::vector<Tensor> now = carried();
  if (now.size() == carried_saved_.size())
    for (size_t i = 0; i < now.size(); ++i) {
      Tensor flat = now[i].view({now[i].numel()});
      be.restore_if_nonfinite(total_, carried_saved_[i], flat);
    }
}

bool Reducer::found_nonfinite() const { return checked_ && !std::isfinite(total_.item<float>()); }

// After the first step the real gradient order is known: lay buckets out in that order, so each
// fills as early as possible. Ranks whose graphs differ see different orders; all adopt rank 0's,
// since every rank must reduce the same buckets.
void Reducer::rebuild() {
  rebuild_due_ = false;
  rebuilt_ = true;
  std::vector<int> order = ready_order_;
  std::vector<bool> seen(slots_.size(), false);
  for (int i : order) seen[static_cast<size_t>(i)] = true;
  for (size_t i = slots_.size(); i-- > 0;)
    if (!seen[i]) order.push_back(static_cast<int>(i));
  std::vector<int64_t> mine(order.begin(), order.end());
  Tensor t = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}).to(device_);
  WorkPtr w = comm_->broadcast(t, 0);
  timed_wait(w, stats_);
  std::vector<int64_t> agreed = t.to_vector<int64_t>();
  order.assign(agreed.begin(), agreed.end());
  layout(order);
}

void Reducer::restore_layout(const std::vector<int>& order) {
  TANDEM_CHECK(order.size() == slots_.size(), "a saved bucket layout of ", order.size(), " parameters for ",
               slots_.size());
  std::vector<bool> seen(slots_.size(), false);
  for (int i : order) {
    TANDEM_CHECK(i >= 0 && static_cast<size_t>(i) < slots_.size() && !seen[static_cast<size_t>(i)],
                 "a saved bucket layout is not an order of the parameters");
    seen[static_cast<size_t>(i)] = true;
  }
  layout(order);
  rebuilt_ = true;
  rebuild_due_ = false;
  carried_saved_.clear();
}

std::vector<int> Reducer::layout_order() const {
  std::vector<int> out;
  for (const Bucket& b : buckets_) out.insert(out.end(), b.params.begin(), b.params.end());
  return out;
}

// ---- between finish and the update

Tensor Reducer::grad_norm(bool agree) {
  backend::Backend& be = backend::backend_for(device_);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Tensor v = f32_range(master_arena_, buckets_[k]).view({1, buckets_[k].numel});
    be.gemm(false, true, 1, 1, buckets_[k].numel, 1.0, v, v, 0.0, bucket_sum_views_[k]);
  }
  be.sum(bucket_sums_, norm_sq_);
  // Every rank holds the same averages, so each computed (nearly) the same sum; averaging the sums
  // makes the norm bit-identical on every rank, however their thread counts rounded.
  if (agree && world_ > 1) {
    WorkPtr w = comm_->all_reduce(norm_sq_, ReduceOp::Avg);
    count_all_reduce(stats_, 4, world_);
    timed_wait(w, stats_);
  }
  Tensor norm = Tensor::empty({1}, DType::f32, device_);
  be.unary(backend::Unary::Sqrt, norm_sq_, norm);
  return norm;
}

void Reducer::scale_grads(const Tensor& coef) {
  backend::Backend& be = backend::backend_for(device_);
  for (const Bucket& b : buckets_) {  // in place, the factor read on the device
    Tensor v = f32_range(master_arena_, b);
    be.scale_by(v, coef, v);
  }
}

// ---- introspection

std::vector<double> Reducer::residual_norms() const {
  std::vector<double> out;
  for (const Slot& s : slots_) {
    double sq = 0;
    if (s.residual.defined())
      for (float v : s.residual.to_vector<float>()) sq += static_cast<double>(v) * v;
    out.push_back(std::sqrt(sq));
  }
  return out;
}

}  // namespace tandem::dist::detail
