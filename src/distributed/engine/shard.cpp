#include "distributed/engine/shard.h"

#include <algorithm>

#include "core/tensor_impl.h"
#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

ShardedStep::ShardedStep(const std::vector<Tensor>& params, const Reducer& reducer, std::shared_ptr<Communicator> comm,
                         CommStats& stats, const optim::Optimizer& opt)
    : comm_(std::move(comm)), stats_(stats), reducer_(reducer) {
  const std::vector<Bucket>& buckets = reducer.buckets();
  int64_t total = 0;
  for (const Bucket& b : buckets) total = std::max(total, b.offset + b.span);
  arena_ = Tensor::zeros({total}, DType::f32, comm_->device());
  const int world = comm_->size(), rank = comm_->rank();
  std::vector<optim::ParamGroup> groups(opt.groups().size());
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
      pieces_.push_back({i, a - start, z - a, b.index});
      Tensor piece = arena_.narrow(0, a, z - a);
      piece.requires_grad_();
      piece.set_grad(reducer.owned(static_cast<size_t>(b.index)).narrow(0, a - lo, z - a));
      groups[static_cast<size_t>(opt.group_of()[static_cast<size_t>(i)])].params.push_back(piece);
      stepped_ += z - a;
    }
  }
  stepper_ = opt.with_params(std::move(groups));
}

void ShardedStep::broadcast(int root) {
  if (comm_->size() == 1) return;
  WorkPtr w = comm_->broadcast(arena_, root);
  timed_wait(w, stats_);
}

void ShardedStep::average() {
  if (comm_->size() == 1) return;
  WorkPtr w = comm_->all_reduce(arena_, ReduceOp::Avg);
  count_all_reduce(stats_, static_cast<int64_t>(arena_.nbytes()), comm_->size());
  timed_wait(w, stats_);
}

void ShardedStep::step(optim::Optimizer& opt) {
  optim::Optimizer& s = *stepper_;
  s.set_schedule(opt.schedule());
  s.set_lr(opt.lr());
  s.set_steps(opt.steps());
  for (size_t g = 0; g < opt.groups().size(); ++g) s.set_group_settings(g, opt.groups()[g]);
  s.set_step_guard(opt.step_guard());
  s.step();
  opt.count_replayed_step();  // the wrapped optimizer's count (and schedule) move on as if it had stepped
  gather();
}

void ShardedStep::gather() {
  const int world = comm_->size(), rank = comm_->rank();
  if (world == 1) return;  // the one rank's blocks are the whole model
  const std::vector<Bucket>& buckets = reducer_.buckets();
  std::vector<WorkPtr> work(buckets.size());
  for (size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    const int64_t block = b.span / world;
    Tensor whole = arena_.narrow(0, b.offset, b.span);
    Tensor mine = whole.narrow(0, rank * block, block);
    work[k] = comm_->all_gather(mine, whole);
    count_all_gather(stats_, static_cast<int64_t>(whole.nbytes()), world);
  }
  for (WorkPtr& w : work) timed_wait(w, stats_);
}

}  // namespace tandem::dist::detail
