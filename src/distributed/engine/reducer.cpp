// The reducer, in the order a step uses it: the arena and its bucket layout, then begin, the
// backward hook (on_ready, launch_ready), finish, and the rebuild that adopts the order gradients
// really arrive in. The codec decides what travels; the reducer decides when.
#include "distributed/engine/reducer.h"

#include <algorithm>
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
    slots_.push_back(std::move(s));
  }
  TANDEM_CHECK(!sharded() || (dtype == DType::f32 && masters.empty()), "DistOpt: sharded state needs f32 gradients");
  rank_ = comm_->rank();
  arena_dtype_ = dtype;
  has_masters_ = !masters.empty();
  lazy_ = options_.release_gradients && !sharded() && !has_masters_;
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
  const size_t elem = dtype_size(arena_dtype_);
  auto limit_of = [&](size_t k) { return k == 0 ? options_.first_bucket_bytes : options_.bucket_bytes; };
  // Every parameter starts at a 16-byte boundary of the buffers (the gaps, inside a bucket and between buckets,
  // stay zero), so that the products writing gradients into the buffer, the optimizer's kernels and, sharded,
  // those reading a rank's slices take 16-byte accesses whatever the sizes of the parameters before them (a
  // 10-class bias, say).
  const int64_t align = std::max<int64_t>(1, static_cast<int64_t>(16 / elem));
  buckets_.clear();
  int last_group = -1;
  for (int i : order) {
    Slot& s = slots_[static_cast<size_t>(i)];
    const int group = groups_.empty() ? -1 : groups_[static_cast<size_t>(i)];
    bool full = !buckets_.empty() &&
                (static_cast<size_t>(buckets_.back().numel + s.numel) * elem > limit_of(buckets_.size() - 1) ||
                 group != last_group);
    last_group = group;
    if (buckets_.empty() || full) {
      Bucket b;
      b.index = static_cast<int>(buckets_.size());
      buckets_.push_back(std::move(b));
    }
    Bucket& b = buckets_.back();
    s.bucket = b.index;
    b.params.push_back(i);
    const int64_t start = (b.numel + align - 1) / align * align;
    b.starts.push_back(start);
    b.numel = start + s.numel;
  }
  // Sharded, every bucket is padded to whole blocks, one per rank, each a whole number of 16-byte units (the
  // padding stays zero); unsharded, its span is its values.
  const int64_t unit = sharded() ? world_ * align : 1;
  int64_t offset = 0, blocks = 0;
  for (Bucket& b : buckets_) {
    b.offset = offset;
    b.span = (b.numel + unit - 1) / unit * unit;
    for (size_t j = 0; j < b.params.size(); ++j) slots_[static_cast<size_t>(b.params[j])].offset = b.offset + b.starts[j];
    offset += (b.span + align - 1) / align * align;  // the next bucket at a 16-byte boundary too
    blocks += sharded() ? b.span / world_ : b.span;  // this rank's block of each
  }
  arena_numel_ = offset;
  if (lazy_) {
    // Gradients do not survive a new layout: it is adopted before they are made (begin) or before the first step.
    release();
  } else if (whole_arena() && (!arena_.defined() || arena_.numel() != offset)) {
    arena_ = Tensor::zeros({offset}, arena_dtype_, device_);
    if (has_masters_) master_arena_ = Tensor::zeros({offset}, DType::f32, device_);
  }
  if (!whole_arena() && (!shard_arena_.defined() || shard_arena_.numel() != blocks))
    shard_arena_ = Tensor::zeros({blocks}, DType::f32, device_);
  Tensor old_residual = residual_arena_;
  if (old_residual.defined()) residual_arena_ = Tensor::zeros({offset}, DType::f32, device_);
  for (Slot& s : slots_) {
    const Shape& shape = s.param.shape();
    // A residual moves to its parameter's new slot whether or not gradients are kept between steps (released
    // gradients, too, carry their residuals: a rebuild must neither drop them nor keep the old arena).
    if (residual_arena_.defined()) {
      Tensor moved = residual_arena_.narrow(0, s.offset, s.numel).view(shape);
      if (s.residual.defined()) moved.copy_(s.residual);
      s.residual = moved;
    }
    if (!whole_arena() || lazy_) {
      s.grad = Tensor();  // gradients pass through their bucket's staging only, or are made by each step
      continue;
    }
    s.grad = arena_.narrow(0, s.offset, s.numel).view(shape);
    s.param.set_grad(s.grad);
    if (master_arena_.defined()) {
      s.master_grad = master_arena_.narrow(0, s.offset, s.numel).view(shape);
      s.master.set_grad(s.master_grad);
    }
  }
  owned_.clear();
  int64_t block_offset = 0;
  for (Bucket& b : buckets_) {
    b.grad = whole_arena() && !lazy_ ? arena_.narrow(0, b.offset, b.span) : Tensor();
    if (residual_arena_.defined()) b.residual = residual_arena_.narrow(0, b.offset, b.numel);
    if (!sharded()) continue;
    const int64_t block = b.span / world_;
    owned_.push_back(whole_arena() ? b.grad.narrow(0, rank_ * block, block)
                                   : shard_arena_.narrow(0, block_offset, block));
    b.shard = owned_.back();
    block_offset += block;
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
    residual_arena_ = codec_->keeps_residual() ? Tensor::zeros({arena_numel_}, DType::f32, device_) : Tensor();
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
    if (arena_.defined()) arena_.zero_();
    if (lazy_) release();  // a step abandoned before its update leaves its buckets behind
    if (options_.check_finite) save_carried();
  }
  accumulating_ = accumulate;
  for (Slot& s : slots_) {
    s.ready = false;
    if (!accumulate) s.used = false;
    // Sharded gradients: backward makes each gradient afresh, and on_ready moves it into its bucket.
    s.param.set_grad(s.grad, /*zeroed=*/!accumulate);
    if (s.master.defined()) s.master.set_grad(s.master_grad);
  }
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    b.pending = static_cast<int>(b.params.size());
    // A later micro-batch's average lands beside the shard, to be added to it (finish).
    if (!whole_arena()) b.shard = accumulate ? Tensor::empty({owned_[k].numel()}, DType::f32, device_) : owned_[k];
  }
  next_launch_ = 0;
  ready_order_.clear();
  checked_ = false;
}

// release_gradients: a bucket's storage, allocated when backward first reaches it (or at its launch, if it never
// does), every parameter's gradient a view of it. A gradient a parameter already holds (adopted before the bucket
// existed) is copied into its slot.
void Reducer::ensure_bucket(Bucket& b) {
  if (!lazy_ || b.grad.defined()) return;
  b.grad = Tensor::zeros({b.span}, arena_dtype_, device_);
  for (size_t j = 0; j < b.params.size(); ++j) {
    Slot& s = slots_[static_cast<size_t>(b.params[j])];
    s.grad = b.grad.narrow(0, b.starts[j], s.numel).view(s.param.shape());
    const Tensor held = s.param.grad();
    if (held.defined() && held.numel() == s.numel) s.grad.copy_(held.view(s.param.shape()));
    s.param.set_grad(s.grad, /*zeroed=*/!held.defined());
  }
}

void Reducer::ensure_buckets() {
  for (Bucket& b : buckets_) ensure_bucket(b);
}

void Reducer::grad_buffer(const Tensor& leaf) {
  if (!lazy_) return;
  auto it = index_.find(leaf.impl());
  if (it == index_.end()) return;
  Slot& s = slots_[static_cast<size_t>(it->second)];
  Bucket& b = buckets_[static_cast<size_t>(s.bucket)];
  if (!b.grad.defined()) {
    ensure_bucket(b);
  } else if (!s.param.grad().defined()) {
    s.param.set_grad(s.grad, /*zeroed=*/true);  // its slot was never written: zeros
  }
}

void Reducer::release() {
  if (!lazy_) return;
  for (Bucket& b : buckets_) b.grad = Tensor();
  for (Slot& s : slots_) {
    s.grad = Tensor();
    s.param.set_grad(Tensor());
  }
}

void Reducer::mark_used(const Tensor& leaf) {
  auto it = index_.find(leaf.impl());
  if (it != index_.end()) slots_[static_cast<size_t>(it->second)].used = true;
}

// Which parameters no rank used. A step that used every parameter on this rank still takes part in the
// agreement: another rank may have left one out, and only together do the ranks know.
void Reducer::find_unused(bool agree) {
  const size_t n = slots_.size();
  if (agree && world_ > 1) {
    if (backend::backend_for(device_).recording(device_.index)) return;  // the graph's parameters are the last step's
    std::vector<int32_t> used(n);
    for (size_t i = 0; i < n; ++i) used[i] = slots_[i].used ? 1 : 0;
    Tensor t = Tensor::from_vector(used, {static_cast<int64_t>(n)}).to(device_);
    WorkPtr w = comm_->all_reduce(t, ReduceOp::Sum);
    count_all_reduce(stats_, static_cast<int64_t>(t.nbytes()), world_);
    timed_wait(w, stats_);
    used = t.to_vector<int32_t>();
    unused_.clear();
    for (size_t i = 0; i < n; ++i)
      if (used[i] == 0) unused_.push_back(static_cast<int>(i));
    return;
  }
  unused_.clear();
  for (size_t i = 0; i < n; ++i)
    if (!slots_[i].used) unused_.push_back(static_cast<int>(i));
}

void Reducer::on_ready(const Tensor& leaf) {
  auto it = index_.find(leaf.impl());
  if (it == index_.end()) return;  // a tensor the optimizer does not manage
  Slot& s = slots_[static_cast<size_t>(it->second)];
  if (s.ready) return;
  s.ready = true;
  s.used = true;
  ready_order_.push_back(it->second);
  if (!whole_arena()) stage_gradient(s);
  if (--buckets_[static_cast<size_t>(s.bucket)].pending == 0) launch_ready();
}

// Sharded gradients: the parameter's gradient, just made by backward, moves into its bucket's staging
// (allocated by the bucket's first gradient, freed once the bucket is reduced) and is dropped.
void Reducer::stage_gradient(Slot& s) {
  Bucket& b = buckets_[static_cast<size_t>(s.bucket)];
  if (!b.grad.defined()) b.grad = Tensor::zeros({b.span}, arena_dtype_, device_);
  Tensor g = s.param.grad();
  if (g.defined()) b.grad.narrow(0, s.offset - b.offset, s.numel).view(s.param.shape()).copy_(g);
  s.param.set_grad(Tensor());
}

// Buckets are launched strictly in order so that every rank issues the same collectives in the
// same sequence, whatever order gradients happen to arrive in.
void Reducer::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    if (trace_on_) trace_.push_back("launch " + std::to_string(next_launch_));
    Bucket& b = buckets_[next_launch_++];
    ensure_bucket(b);
    if (!b.grad.defined()) b.grad = Tensor::zeros({b.span}, arena_dtype_, device_);  // no gradient reached it
    apply_gradient_scale(b);
    if (world_ > 1 || !sharded()) {
      codec_->launch(b);
    } else {
      // A sharded job of one rank: nothing travels, and its one block is the whole bucket, a view of the whole
      // arena it keeps (whole_arena).
      codec_->apply_locally(b);
    }
    // Sharded gradients: the staging is the collective's now (it holds it until done), not ours.
    if (!whole_arena()) b.grad = Tensor();
  }
}

// The f32 average the optimizer reads: this rank's block under sharding, else the master arena's copy
// of the bucket's range or the bucket's own gradient.
Tensor Reducer::f32_range(size_t k) const {
  const Bucket& b = buckets_[k];
  if (sharded()) return owned_[k];
  return master_arena_.defined() ? master_arena_.narrow(0, b.offset, b.numel) : b.grad;
}

void Reducer::finish() {
  TANDEM_ASSERT(codec_, "gradients synchronised before a codec was set");
  if (trace_on_) trace_.push_back("backward_done");
  // Parameters that took no part in this loss: their (zero) gradients still travel, in order.
  for (Bucket& b : buckets_) b.pending = 0;
  launch_ready();
  backend::Backend& be = backend::backend_for(device_);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (world_ > 1 || !sharded()) codec_->finish(b);
    if (whole_arena()) continue;
    if (!b.shard.is_same(owned_[k])) be.binary(backend::Binary::Add, owned_[k], b.shard, owned_[k]);
    b.shard = owned_[k];
    b.grad = Tensor();  // the staging: only the rank's block is kept
  }
  finalize();
  find_unused(/*agree=*/true);
  contribution_ = 1.0;
  // A sharded layout stays: the optimizer's state and the parameters' blocks are cut along it.
  if (options_.rebuild_buckets && !rebuilt_ && world_ > 1 && !sharded()) rebuild_due_ = true;
}

void Reducer::finish_locally() {
  TANDEM_ASSERT(codec_, "gradients synchronised before a codec was set");
  ensure_buckets();  // parameters backward never reached: zeros
  for (Bucket& b : buckets_) {
    apply_gradient_scale(b);
    codec_->apply_locally(b);
  }
  finalize();
  find_unused(/*agree=*/false);
}

// partialUpdate: each rank steps its own replica with its own gradients, and leaves alone what it did not use.
void Reducer::finish_unsynced() {
  ensure_buckets();
  for (Bucket& b : buckets_) apply_gradient_scale(b);
  finalize();
  find_unused(/*agree=*/false);
}

// A 16-bit arena is scaled in f32, after its conversion (finalize): its codecs keep no residual.
void Reducer::apply_gradient_scale(Bucket& b) {
  backend::Backend& be = backend::backend_for(device_);
  if (factor_.defined() && !master_arena_.defined()) be.scale_by(b.grad, factor_, b.grad);
  if (contribution_ != 1.0) be.scale_cast(b.grad, b.grad, contribution_, 0.0);
}

void Reducer::zero_contribution() {
  if (arena_.defined()) arena_.zero_();
  if (lazy_)
    for (Bucket& b : buckets_)
      if (b.grad.defined()) b.grad.zero_();
  for (Bucket& b : buckets_)
    if (!whole_arena()) b.grad = Tensor();  // staged afresh, as zeros, when the bucket is launched
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
  for (size_t k = 0; k < buckets_.size(); ++k) be.sum(f32_range(k), bucket_sum_views_[k]);
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

void Reducer::set_groups(const std::vector<int>& group_of_param) {
  TANDEM_CHECK(group_of_param.size() == slots_.size(), "layer groups for ", group_of_param.size(), " of ",
               slots_.size(), " parameters");
  groups_ = group_of_param;
  // Backward meets the groups from the last to the first, and each group's parameters in reverse order.
  std::vector<int> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return groups_[static_cast<size_t>(a)] > groups_[static_cast<size_t>(b)];
  });
  layout(order);
  carried_saved_.clear();
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
    Tensor range = f32_range(k);
    Tensor v = range.view({1, range.numel()});
    be.gemm(false, true, 1, 1, range.numel(), 1.0, v, v, 0.0, bucket_sum_views_[k]);
  }
  be.sum(bucket_sums_, norm_sq_);
  // Every rank holds the same averages, so each computed (nearly) the same sum; averaging the sums
  // makes the norm bit-identical on every rank, however their thread counts rounded. Sharded, each
  // rank holds its blocks only: the squares are summed over the ranks instead.
  if ((agree || sharded()) && world_ > 1) {
    WorkPtr w = comm_->all_reduce(norm_sq_, sharded() ? ReduceOp::Sum : ReduceOp::Avg);
    count_all_reduce(stats_, 4, world_);
    timed_wait(w, stats_);
  }
  Tensor norm = Tensor::empty({1}, DType::f32, device_);
  be.unary(backend::Unary::Sqrt, norm_sq_, norm);
  return norm;
}

void Reducer::scale_grads(const Tensor& coef) {
  backend::Backend& be = backend::backend_for(device_);
  for (size_t k = 0; k < buckets_.size(); ++k) {  // in place, the factor read on the device
    Tensor v = f32_range(k);
    be.scale_by(v, coef, v);
  }
}

int64_t Reducer::gradient_bytes() const {
  if (lazy_) return arena_numel_ * static_cast<int64_t>(dtype_size(arena_dtype_));  // held from backward to the update
  return static_cast<int64_t>((arena_.defined() ? arena_.nbytes() : 0) +
                              (master_arena_.defined() ? master_arena_.nbytes() : 0) +
                              (shard_arena_.defined() ? shard_arena_.nbytes() : 0));
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
