#include "distributed/engine/shard.h"

#include <algorithm>
#include <cmath>

#include "core/allocator.h"
#include "core/tensor_impl.h"
#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

ShardedStep::ShardedStep(const std::vector<Tensor>& params, const Reducer& reducer, std::shared_ptr<Communicator> comm,
                         CommStats& stats, const optim::Optimizer& opt, bool shard_parameters, bool offload,
                         bool offload_parameters)
    : comm_(std::move(comm)),
      stats_(stats),
      reducer_(reducer),
      params_(params),
      stage3_(shard_parameters),
      param_dtype_(opt.master_weights()),
      offload_(offload),
      offload_params_(offload_parameters) {
  TANDEM_CHECK(!offload_params_ || (stage3_ && offload_ && param_dtype_ == DType::f32), "offloaded parameters are ",
               "sharded (stage 3) f32 parameters stepped on the host");
  const std::vector<Bucket>& buckets = reducer.buckets();
  const Device device = comm_->device();
  const int world = comm_->size(), rank = comm_->rank();
  int64_t total = 0, blocks = 0;
  for (const Bucket& b : buckets) {
    total = std::max(total, b.offset + b.span);
    block_at_.push_back(blocks);
    blocks += b.span / world;
  }
  arena_ = Tensor::zeros({total}, DType::f32, device);
  if (offload_) {
    // Pinned where the device can read it directly (the copies each step makes), plain on the CPU backend.
    const bool pin = device.is_cuda();
    host_values_ = pin ? Tensor::empty_pinned({blocks}) : Tensor::zeros({blocks});
    host_grads_ = pin ? Tensor::empty_pinned({blocks}) : Tensor::zeros({blocks});
  }
  if (stage3_) {
    // Offloaded parameters: the kept blocks are the host's values (what the host's step writes).
    blocks_ = offload_params_ ? host_values_ : Tensor::zeros({blocks}, DType::f32, device);
    whole_.resize(buckets.size());
    gathering_.resize(buckets.size());
    held_.resize(buckets.size());
    holders_.resize(buckets.size());
    absent_ = Tensor::full({1}, std::nan(""), DType::f32, device);
  }
  std::vector<optim::ParamGroup> groups(opt.groups().size());
  std::vector<std::vector<ShardPiece>> group_pieces(groups.size());
  std::vector<std::vector<Tensor>> group_host(groups.size());
  for (const Bucket& b : buckets) {
    const int64_t block = b.span / world, lo = b.offset + rank * block, hi = lo + block;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const int i = b.params[j];
      const Tensor& p = params[static_cast<size_t>(i)];
      const int64_t start = b.offset + b.starts[j], end = start + p.numel();
      Tensor slot = arena_.narrow(0, start, p.numel()).view(p.shape());
      slot.copy_(p.detach());
      rebind_storage(p, slot);
      // The part of the parameter inside this rank's block, and the same part of the block's average.
      const int64_t a = std::max(start, lo), z = std::min(end, hi);
      if (a >= z) continue;
      Tensor piece = stage3_ ? blocks_.narrow(0, block_at_[static_cast<size_t>(b.index)] + a - lo, z - a)
                             : arena_.narrow(0, a, z - a);
      const size_t g = static_cast<size_t>(opt.group_of()[static_cast<size_t>(i)]);
      if (offload_) {  // the host's copy of the slice steps, reading the host's copy of its gradient
        const int64_t at = block_at_[static_cast<size_t>(b.index)] + a - lo;
        piece = host_values_.narrow(0, at, z - a);
        piece.set_grad(host_grads_.narrow(0, at, z - a));
        group_host[g].push_back(piece);
      } else {
        piece.set_grad(reducer.owned(static_cast<size_t>(b.index)).narrow(0, a - lo, z - a));
      }
      piece.requires_grad_();
      groups[g].params.push_back(piece);
      group_pieces[g].push_back({i, a - start, z - a, b.index, a});
      stepped_ += z - a;
    }
  }
  // The optimizer lists its parameters group after group: pieces_ follows its order.
  for (const auto& list : group_pieces) pieces_.insert(pieces_.end(), list.begin(), list.end());
  for (const auto& list : group_host) host_pieces_.insert(host_pieces_.end(), list.begin(), list.end());
  host_masters_.assign(offload_ && param_dtype_ != DType::f32 ? pieces_.size() : 0, Tensor());
  bucket_pieces_.resize(buckets.size());
  for (size_t q = 0; q < pieces_.size(); ++q) bucket_pieces_[static_cast<size_t>(pieces_[q].bucket)].push_back(q);
  stepper_ = opt.with_params(std::move(groups));
  // Master weights: the slices' optimizer keeps (and steps) f32 masters of this rank's slices alone; offloaded,
  // the host's f32 values are those masters.
  if (!offload_) stepper_->keep_master_weights(opt.master_weights());
}

// ---- offload

Tensor ShardedStep::device_block(size_t k) {
  const Bucket& b = reducer_.buckets()[k];
  const int64_t block = b.span / comm_->size();
  return stage3_ && params_sharded_ ? blocks_.narrow(0, block_at_[k], block)
                                    : arena_.narrow(0, b.offset + comm_->rank() * block, block);
}

void ShardedStep::refresh_host() {
  if (offload_params_ && params_sharded_) {  // the kept blocks are the host's values
    host_stale_ = false;
    return;
  }
  const std::vector<Bucket>& buckets = reducer_.buckets();
  for (size_t k = 0; k < buckets.size(); ++k) {
    if (bucket_pieces_[k].empty()) continue;
    Tensor from = device_block(k);
    host_values_.narrow(0, block_at_[k], from.numel()).copy_(from);
  }
  host_stale_ = false;
}

void ShardedStep::write_back() {
  if (offload_params_ && params_sharded_) return;  // stepped in place: the kept blocks are the host's values
  const std::vector<Bucket>& buckets = reducer_.buckets();
  for (size_t k = 0; k < buckets.size(); ++k) {
    if (bucket_pieces_[k].empty()) continue;
    Tensor into = device_block(k);
    Tensor from = host_values_.narrow(0, block_at_[k], into.numel());
    into.copy_(from);
    // Under master weights the parameters hold the masters' rounding (as the optimizer writes it), rounded where
    // they are rather than in two passes over host memory.
    if (param_dtype_ != DType::f32) into.copy_(into.to(param_dtype_));
  }
}

int64_t ShardedStep::host_bytes() const {
  if (!offload_) return 0;
  return static_cast<int64_t>(host_values_.nbytes() + host_grads_.nbytes()) +
         static_cast<int64_t>(stepper_->state_copies()) * stepped_ * static_cast<int64_t>(sizeof(float));
}

std::vector<optim::Optimizer::StateList> ShardedStep::slice_state_lists() {
  std::vector<optim::Optimizer::StateList> lists = stepper_->all_state_lists();
  if (!host_masters_.empty()) lists.push_back({"master", &host_masters_});
  return lists;
}

// ---- sharded parameters

void ShardedStep::shard_parameters() {
  if (!stage3_ || params_sharded_) return;
  const int world = comm_->size(), rank = comm_->rank();
  const std::vector<Bucket>& buckets = reducer_.buckets();
  for (size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    const int64_t block = b.span / world;
    blocks_.narrow(0, block_at_[k], block).copy_(arena_.narrow(0, b.offset + rank * block, block));
    unbind(k);
  }
  arena_ = Tensor();
  params_sharded_ = true;
}

// Starts bucket k's all-gather into a whole buffer of its own, unless it is gathered or on its way. A
// buffer released while ops still held it for backward is filled again in place: they read it then.
void ShardedStep::launch(size_t k) {
  if (whole_[k].defined()) return;
  const Bucket& b = reducer_.buckets()[k];
  const int64_t block = b.span / comm_->size();
  if (std::shared_ptr<Storage> kept = held_[k].lock()) {
    kept->allocator = allocator_;
    kept->ptr = allocator_->allocate(kept->nbytes);
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::move(kept);
    impl->shape = {b.span};
    impl->strides = {1};
    whole_[k] = Tensor(std::move(impl));
  } else {
    whole_[k] = Tensor::empty({b.span}, DType::f32, comm_->device());
  }
  // Under master weights the blocks hold 16-bit values: they travel in 16 bits (exactly), and bind() writes
  // them into the whole buffer.
  const DType sent = param_dtype_;
  Tensor from = blocks_.narrow(0, block_at_[k], block), into = whole_[k];
  if (offload_params_) {
    // This rank's block from the host into its place in the whole buffer; the all-gather fills the rest.
    Tensor mine = into.narrow(0, comm_->rank() * block, block);
    mine.copy_(from);
    from = mine;
  } else if (sent != DType::f32) {
    if (whole16_.size() != whole_.size()) whole16_.resize(whole_.size());
    whole16_[k] = Tensor::empty({b.span}, sent, comm_->device());
    into = whole16_[k];
    Tensor mine = into.narrow(0, comm_->rank() * block, block);
    mine.copy_(from);
    from = mine;
  }
  gathering_[k] = comm_->all_gather(from, into);
  count_all_gather(stats_, static_cast<int64_t>(into.nbytes()), comm_->size());
}

// Waits for bucket k's all-gather and points its parameters at the whole buffer.
void ShardedStep::bind(size_t k) {
  if (!gathering_[k]) return;  // bound already
  timed_wait(gathering_[k], stats_);
  if (k < whole16_.size() && whole16_[k].defined()) {  // arrived in 16 bits
    whole_[k].copy_(whole16_[k]);
    whole16_[k] = Tensor();
  }
  const Bucket& b = reducer_.buckets()[k];
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[static_cast<size_t>(b.params[j])];
    rebind_storage(p, whole_[k].narrow(0, b.starts[j], p.numel()).view(p.shape()));
  }
}

// Points bucket k's parameters at the NaN and frees its whole buffer. Ops that saved a view of it for
// backward (a layer's weight) would keep its memory: it is handed back all the same, the buffer kept
// empty, and filled again in place by the gather that precedes the layer's backward.
void ShardedStep::unbind(size_t k) {
  if (gathering_.size() > k && gathering_[k]) timed_wait(gathering_[k], stats_);  // no buffer freed in flight
  if (k < whole16_.size()) whole16_[k] = Tensor();
  for (int i : reducer_.buckets()[k].params) {
    const Tensor& p = params_[static_cast<size_t>(i)];
    rebind_storage(p, as_strided(absent_, p.shape(), Shape(p.shape().size(), 0), 0));
  }
  if (whole_.size() <= k || !whole_[k].defined()) return;
  std::shared_ptr<Storage> buffer = whole_[k].impl()->storage;
  whole_[k] = Tensor();
  if (buffer.use_count() == 1 || !buffer->allocator) return;  // nobody else holds it: freed with it
  allocator_ = buffer->allocator;
  allocator_->deallocate(buffer->ptr, buffer->nbytes);
  buffer->ptr = nullptr;
  buffer->allocator = nullptr;
  held_[k] = buffer;
}

void ShardedStep::set_layer_groups(const std::vector<std::vector<int>>& groups_of_param) {
  const std::vector<Bucket>& buckets = reducer_.buckets();
  group_buckets_.clear();
  for (size_t k = 0; k < buckets.size(); ++k)
    for (int i : buckets[k].params)
      for (int g : groups_of_param[static_cast<size_t>(i)]) {
        if (group_buckets_.size() <= static_cast<size_t>(g)) group_buckets_.resize(static_cast<size_t>(g) + 1);
        std::vector<size_t>& list = group_buckets_[static_cast<size_t>(g)];
        if (std::find(list.begin(), list.end(), k) == list.end()) list.push_back(k);
      }
}

void ShardedStep::gather(int group, int next) {
  const auto in_range = [&](int g) { return g >= 0 && static_cast<size_t>(g) < group_buckets_.size(); };
  if (!stage3_) {  // whole parameters; with overlapped gathers, this group's may still be arriving
    if (in_range(group))
      for (size_t k : group_buckets_[static_cast<size_t>(group)]) wait_bucket(k);
    return;
  }
  shard_parameters();
  if (in_range(group))
    for (size_t k : group_buckets_[static_cast<size_t>(group)]) launch(k);
  if (in_range(next))  // prefetched: on its way while this group computes
    for (size_t k : group_buckets_[static_cast<size_t>(next)]) launch(k);
  if (in_range(group))
    for (size_t k : group_buckets_[static_cast<size_t>(group)]) {
      bind(k);
      std::vector<int>& h = holders_[k];
      if (std::find(h.begin(), h.end(), group) == h.end()) h.push_back(group);
    }
}

void ShardedStep::release(int group) {
  if (!stage3_) return;  // stages 1 and 2 keep the parameters whole
  if (group < 0 || static_cast<size_t>(group) >= group_buckets_.size()) return;
  for (size_t k : group_buckets_[static_cast<size_t>(group)]) {
    std::vector<int>& h = holders_[k];
    h.erase(std::remove(h.begin(), h.end(), group), h.end());
    if (h.empty()) unbind(k);  // a bucket another group holds stays until that one lets it go
  }
}

void ShardedStep::gather_all() {
  if (!stage3_) return;
  shard_parameters();
  for (size_t k = 0; k < whole_.size(); ++k) launch(k);
  for (size_t k = 0; k < whole_.size(); ++k) bind(k);
}

void ShardedStep::release_all() {
  if (!params_sharded_) return;
  for (std::vector<int>& h : holders_) h.clear();
  for (size_t k = 0; k < whole_.size(); ++k)
    if (whole_[k].defined()) unbind(k);
}

void ShardedStep::keep_whole() {
  if (!params_sharded_) return;
  const int world = comm_->size(), rank = comm_->rank();
  const std::vector<Bucket>& buckets = reducer_.buckets();
  const DType kept = param_dtype_;
  for (size_t k = 0; k < buckets.size(); ++k) {
    if (!whole_[k].defined()) continue;  // not gathered: its blocks hold its values already
    bind(k);
    const int64_t block = buckets[k].span / world;
    Tensor mine = whole_[k].narrow(0, rank * block, block);
    blocks_.narrow(0, block_at_[k], block).copy_(kept == DType::f32 ? mine : mine.to(kept).to(DType::f32));
  }
  host_stale_ = true;
  release_all();
}

template <typename F>
void ShardedStep::on_whole(F f) {
  gather_all();
  const int world = comm_->size(), rank = comm_->rank();
  const std::vector<Bucket>& buckets = reducer_.buckets();
  for (size_t k = 0; k < buckets.size(); ++k) {
    f(whole_[k]);
    const int64_t block = buckets[k].span / world;
    blocks_.narrow(0, block_at_[k], block).copy_(whole_[k].narrow(0, rank * block, block));
  }
  release_all();
}

void ShardedStep::broadcast(int root) {
  if (comm_->size() == 1) return;
  wait_all();
  auto send = [&](Tensor t) {
    WorkPtr w = comm_->broadcast(t, root);
    timed_wait(w, stats_);
  };
  if (params_sharded_) {
    on_whole(send);
  } else {
    send(arena_);
    refresh_copies();
  }
  host_stale_ = true;
}

void ShardedStep::average() {
  if (comm_->size() == 1) return;
  wait_all();
  auto mean = [&](Tensor t) {
    WorkPtr w = comm_->all_reduce(t, ReduceOp::Avg);
    count_all_reduce(stats_, static_cast<int64_t>(t.nbytes()), comm_->size());
    timed_wait(w, stats_);
  };
  if (params_sharded_) {
    on_whole(mean);
  } else {
    mean(arena_);
    refresh_copies();
  }
  host_stale_ = true;
}

void ShardedStep::gather_state(optim::Optimizer& opt) {
  // State loaded into the wrapped optimizer and not stepped yet: the slices take it first. A copy an
  // earlier gather left there is dropped instead, stale by any step taken since.
  adopt_state(opt);
  const int world = comm_->size(), rank = comm_->rank();
  const Device device = comm_->device();
  std::vector<optim::Optimizer::StateList> mine = slice_state_lists(), theirs = opt.all_state_lists();
  TANDEM_ASSERT(mine.size() == theirs.size(), "the optimizer of the slices keeps other state than the wrapped one");
  const std::vector<Tensor>& params = opt.params();
  const std::vector<Bucket>& buckets = reducer_.buckets();
  for (size_t k = 0; k < mine.size(); ++k) {
    // The slices step together, so their state exists for all or none; a rank without slices learns
    // which from the others, and every rank gathers alike.
    bool have = false;
    for (const Tensor& t : *mine[k].tensors) have = have || t.defined();
    Tensor flag = Tensor::full({1}, have ? 1.0 : 0.0, DType::i64, device);
    if (world > 1) {
      WorkPtr w = comm_->all_reduce(flag, ReduceOp::Sum);
      timed_wait(w, stats_);
    }
    if (flag.item<int64_t>() == 0) continue;
    for (const Bucket& b : buckets) {
      const int64_t block = b.span / world, lo = b.offset + rank * block;
      Tensor whole = Tensor::zeros({b.span}, DType::f32, device);
      Tensor mine_block = whole.narrow(0, rank * block, block);
      for (size_t q : bucket_pieces_[static_cast<size_t>(b.index)]) {
        const Tensor& t = (*mine[k].tensors)[q];
        if (t.defined()) mine_block.narrow(0, pieces_[q].offset - lo, pieces_[q].numel).copy_(t);
      }
      if (world > 1) {
        WorkPtr w = comm_->all_gather(mine_block, whole);
        count_all_gather(stats_, static_cast<int64_t>(whole.nbytes()), world);
        timed_wait(w, stats_);
      }
      for (size_t j = 0; j < b.params.size(); ++j) {
        const Tensor& p = params[static_cast<size_t>(b.params[j])];
        (*theirs[k].tensors)[static_cast<size_t>(b.params[j])] =
            whole.narrow(0, b.starts[j], p.numel()).view(p.shape()).clone();
      }
    }
  }
  // Each parameter's count is its slices' (they step together; a parameter no rank used in a step was not
  // stepped, so counts differ between parameters): summed over the ranks holding a slice of it, with how
  // many do.
  std::vector<int64_t>* counts = opt.step_counts();
  std::vector<int64_t>* slice_counts = stepper_->step_counts();
  if (counts && slice_counts) {
    std::vector<int64_t> v(2 * counts->size(), 0);
    for (size_t q = 0; q < pieces_.size() && q < slice_counts->size(); ++q) {
      const size_t i = static_cast<size_t>(pieces_[q].param);
      v[2 * i] += (*slice_counts)[q];
      v[2 * i + 1] += 1;
    }
    Tensor t = Tensor::from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}).to(device);
    if (world > 1) {
      WorkPtr w = comm_->all_reduce(t, ReduceOp::Sum);
      timed_wait(w, stats_);
    }
    v = t.to_vector<int64_t>();
    for (size_t i = 0; i < counts->size(); ++i) (*counts)[i] = v[2 * i + 1] > 0 ? v[2 * i] / v[2 * i + 1] : 0;
  }
  gathered_ = true;
}

namespace {
bool holds_state(optim::Optimizer& opt) {
  for (auto& list : opt.all_state_lists())
    for (const Tensor& t : *list.tensors)
      if (t.defined()) return true;
  return false;
}
}  // namespace

void ShardedStep::release_gathered_state(optim::Optimizer& opt) {
  if (!gathered_) return;
  for (auto& list : opt.all_state_lists())
    for (Tensor& t : *list.tensors) t = Tensor();
  gathered_ = false;
}

bool ShardedStep::state_to_adopt(optim::Optimizer& opt) { return !gathered_ && holds_state(opt); }

bool ShardedStep::adopt_state(optim::Optimizer& opt) {
  if (gathered_) {
    release_gathered_state(opt);
    return false;
  }
  if (!holds_state(opt)) return false;
  std::vector<optim::Optimizer::StateList> mine = slice_state_lists(), theirs = opt.all_state_lists();
  for (size_t k = 0; k < theirs.size(); ++k)
    for (size_t q = 0; q < pieces_.size(); ++q) {
      const ShardPiece& piece = pieces_[q];
      const Tensor& whole = (*theirs[k].tensors)[static_cast<size_t>(piece.param)];
      Tensor& slice = (*mine[k].tensors)[q];
      if (!whole.defined()) {
        slice = Tensor();
        continue;
      }
      if (!slice.defined()) slice = Tensor::empty({piece.numel}, DType::f32, state_device());
      slice.copy_(whole.contiguous().view({whole.numel()}).narrow(0, piece.start, piece.numel));
    }
  if (offload_) {
    // Loaded masters are the host's values (the rest is read from the parameters, loaded with them).
    host_stale_ = true;
    bool masters = false;
    for (size_t q = 0; q < host_masters_.size(); ++q)
      if (host_masters_[q].defined()) {
        if (!masters) refresh_host();  // the padding and any slice without a master
        masters = true;
        if (!host_masters_[q].is_same(host_pieces_[q])) Tensor(host_pieces_[q]).copy_(host_masters_[q]);
        host_masters_[q] = host_pieces_[q];
      }
  }
  std::vector<int64_t>* counts = opt.step_counts();
  std::vector<int64_t>* slice_counts = stepper_->step_counts();
  if (counts && slice_counts)
    for (size_t q = 0; q < pieces_.size(); ++q) (*slice_counts)[q] = (*counts)[static_cast<size_t>(pieces_[q].param)];
  for (auto& list : theirs)
    for (Tensor& t : *list.tensors) t = Tensor();
  return true;
}

namespace {
// The slices' optimizer takes the wrapped one's settings for its next step.
void take_settings(optim::Optimizer& s, const optim::Optimizer& opt) {
  s.set_schedule(opt.schedule());
  s.set_lr(opt.lr());
  s.set_steps(opt.steps());
  for (size_t g = 0; g < opt.groups().size(); ++g) s.set_group_settings(g, opt.groups()[g]);
  s.set_step_guard(opt.step_guard());
}
}  // namespace

void ShardedStep::prepare_replay(const optim::Optimizer& opt) {
  take_settings(*stepper_, opt);
  stepper_->prepare_replay();
}

void ShardedStep::step(optim::Optimizer& opt, const Tensor& grad_factor, const std::vector<int>& unused) {
  wait_all();        // the slices are written where the last step's gathers read
  adopt_state(opt);  // a checkpoint loaded into the wrapped optimizer (a copy gathered for one is dropped)
  optim::Optimizer& s = *stepper_;
  take_settings(s, opt);
  Tensor factor = grad_factor;
  if (offload_) {
    // The parameters are the values without master weights (read again: anything may have set them); under
    // master weights the host's masters are, read from the parameters only where nothing stepped them yet.
    if (param_dtype_ == DType::f32 || host_stale_) refresh_host();
    const std::vector<Bucket>& buckets = reducer_.buckets();
    for (size_t k = 0; k < buckets.size(); ++k) {
      if (bucket_pieces_[k].empty()) continue;
      const int64_t block = buckets[k].span / comm_->size();
      host_grads_.narrow(0, block_at_[k], block).copy_(reducer_.owned(k).narrow(0, 0, block));
    }
    if (factor.defined()) factor = factor.to(Device::cpu());
    if (opt.step_guard().defined()) s.set_step_guard(opt.step_guard().to(Device::cpu()));
  }
  {
    // The slices of unused parameters take no step: without a gradient for it, the optimizer leaves them.
    std::vector<std::pair<size_t, Tensor>> hidden;
    if (!unused.empty()) {
      std::vector<bool> skip(params_.size(), false);
      for (int i : unused) skip[static_cast<size_t>(i)] = true;
      for (size_t q = 0; q < pieces_.size(); ++q)
        if (skip[static_cast<size_t>(pieces_[q].param)]) {
          Tensor piece = s.params()[q];  // a handle: its gradient is the slice's
          hidden.emplace_back(q, piece.grad());
          piece.set_grad(Tensor());
        }
    }
    struct Restore {
      const std::vector<Tensor>& pieces;
      std::vector<std::pair<size_t, Tensor>>& hidden;
      ~Restore() {
        for (auto& [q, g] : hidden) Tensor(pieces[q]).set_grad(g);
      }
    } restore{s.params(), hidden};
    s.step_with_gradient_factor(factor);
  }
  if (offload_) {
    write_back();
    for (size_t q = 0; q < host_masters_.size(); ++q) host_masters_[q] = host_pieces_[q];
  }
  opt.count_replayed_step();  // the wrapped optimizer's count (and schedule) move on as if it had stepped
  if (!stage3_) gather();      // sharded parameters are gathered by their layers' next use instead
}

std::vector<Tensor> ShardedStep::keep_copies(DType dtype) {
  TANDEM_CHECK(dtype == DType::bf16 || dtype == DType::f16, "parameter copies are bf16 or f16, not ", dtype_name(dtype));
  if (stage3_) return {};
  wait_all();
  if (!copy_arena_.defined() || copy_arena_.dtype() != dtype)
    copy_arena_ = Tensor::empty(arena_.shape(), dtype, arena_.device());
  refresh_copies();
  std::vector<Tensor> views(params_.size());
  for (const Bucket& b : reducer_.buckets())
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor& p = params_[static_cast<size_t>(b.params[j])];
      views[static_cast<size_t>(b.params[j])] = copy_arena_.narrow(0, b.offset + b.starts[j], p.numel()).view(p.shape());
    }
  // An optimizer that writes copies as it steps writes those of this rank's slices: on one rank, every
  // parameter's, and the step needs no conversion of its own.
  stepper_copies_ = !offload_ && stepper_->keeps_parameter_copies();
  if (stepper_copies_) {
    std::vector<Tensor> mine;
    for (const ShardPiece& piece : pieces_) mine.push_back(copy_arena_.narrow(0, piece.offset, piece.numel));
    stepper_->set_parameter_copies(std::move(mine));
  }
  return views;
}

// The copies as Tensor::to rounds the parameters: one conversion over the whole buffer.
void ShardedStep::refresh_copies() {
  if (copy_arena_.defined()) copy_arena_.copy_(arena_);
}

// Stages 1 and 2 after a step: every bucket's parameter blocks all-gathered in place, then the 16-bit copies
// written. With overlapped gathers the buckets go out in the order forward uses them and only those holding
// a parameter of no group are waited for here (each copied as it arrives).
void ShardedStep::gather() {
  const int world = comm_->size(), rank = comm_->rank();
  if (world == 1) {  // the one rank's blocks are the whole model (its copies written by the step, if it writes them)
    if (!stepper_copies_) refresh_copies();
    return;
  }
  const std::vector<Bucket>& buckets = reducer_.buckets();
  in_flight_.reset(buckets.size());
  // Under master weights the parameters hold 16-bit values: the blocks travel in 16 bits (half the bytes),
  // through the 16-bit copies where they are of that type, else through a staging of the bucket's.
  const DType sent = param_dtype_;
  staging_.assign(sent == DType::f32 ? 0 : buckets.size(), Tensor());
  auto launch_bucket = [&](size_t k) {
    const Bucket& b = buckets[k];
    const int64_t block = b.span / world;
    Tensor whole = arena_.narrow(0, b.offset, b.span);
    if (sent != DType::f32) {
      const bool through_copies = copy_arena_.defined() && copy_arena_.dtype() == sent;
      whole = through_copies ? copy_arena_.narrow(0, b.offset, b.span) : Tensor::empty({b.span}, sent, arena_.device());
      staging_[k] = whole;
      // This rank's block: exact in 16 bits (and there already when the step wrote the copies).
      if (!(through_copies && stepper_copies_))
        whole.narrow(0, rank * block, block).copy_(arena_.narrow(0, b.offset + rank * block, block));
    }
    Tensor mine = whole.narrow(0, rank * block, block);
    in_flight_[k] = comm_->all_gather(mine, whole);
    count_all_gather(stats_, static_cast<int64_t>(whole.nbytes()), world);
  };
  if (gather_order_.empty()) {
    for (size_t k = 0; k < buckets.size(); ++k) launch_bucket(k);
    if (!staging_.empty()) {  // 16-bit gathers: each bucket written into the parameters as it arrives
      for (size_t k = 0; k < buckets.size(); ++k) wait_bucket(k);
      return;
    }
    for (size_t k = 0; k < buckets.size(); ++k) timed_wait(in_flight_[k], stats_);
    refresh_copies();  // one conversion of the whole buffer
    return;
  }
  for (size_t k : gather_order_) launch_bucket(k);
  for (size_t k : waited_at_once_) wait_bucket(k);
}

void ShardedStep::overlap_groups(const std::vector<int>& group_of) {
  if (stage3_) return;
  const std::vector<Bucket>& buckets = reducer_.buckets();
  group_buckets_.clear();
  waited_at_once_.clear();
  std::vector<std::pair<int, size_t>> first_use;  // (the first group using the bucket, or -1; the bucket)
  for (size_t k = 0; k < buckets.size(); ++k) {
    int first = -1;
    bool loose = false;
    for (int i : buckets[k].params) {
      const int g = group_of[static_cast<size_t>(i)];
      if (g < 0) {
        loose = true;
        continue;
      }
      if (group_buckets_.size() <= static_cast<size_t>(g)) group_buckets_.resize(static_cast<size_t>(g) + 1);
      std::vector<size_t>& list = group_buckets_[static_cast<size_t>(g)];
      if (list.empty() || list.back() != k) list.push_back(k);
      first = first < 0 ? g : std::min(first, g);
    }
    if (loose) waited_at_once_.push_back(k);
    first_use.push_back({loose ? -1 : first, k});
  }
  std::stable_sort(first_use.begin(), first_use.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  gather_order_.clear();
  for (const auto& [g, k] : first_use) gather_order_.push_back(k);
}

// Waits for bucket k's all-gather, if one is in flight, and writes that bucket's 16-bit copies (or, when it
// travelled in 16 bits, its parameters from what arrived: exactly, the values being 16-bit ones).
void ShardedStep::wait_bucket(size_t k) {
  if (k >= in_flight_.size() || !in_flight_[k]) return;
  timed_wait(in_flight_[k], stats_);
  const Bucket& b = reducer_.buckets()[k];
  Tensor params = arena_.narrow(0, b.offset, b.span);
  if (k < staging_.size() && staging_[k].defined()) {
    params.copy_(staging_[k]);
    const bool copies_arrived =
        copy_arena_.defined() && staging_[k].data_ptr() == copy_arena_.narrow(0, b.offset, 1).data_ptr();
    staging_[k] = Tensor();
    if (copies_arrived) return;
  }
  if (!copy_arena_.defined()) return;
  copy_arena_.narrow(0, b.offset, b.span).copy_(params);
}

void ShardedStep::wait_all() {
  for (size_t k = 0; k < in_flight_.size(); ++k) wait_bucket(k);
}

}  // namespace tandem::dist::detail
