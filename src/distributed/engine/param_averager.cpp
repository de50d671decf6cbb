#include "distributed/engine/param_averager.h"

#include <algorithm>

#include "backend/backend.h"
#include "core/tensor_impl.h"
#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

ParamAverager::ParamAverager(const std::vector<Tensor>& params, std::shared_ptr<Communicator> comm,
                             size_t chunk_bytes, CommStats& stats)
    : comm_(std::move(comm)), stats_(stats) {
  int64_t total = 0;
  for (const Tensor& p : params) {
    TANDEM_CHECK(p.dtype() == DType::f32, "DistOpt: parameter ", p.str(), " is not f32; f32 parameters are required");
    total += p.numel();
  }
  chunk_ = std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(chunk_bytes / sizeof(float)), total));
  chunks_ = std::max<int64_t>(1, (total + chunk_ - 1) / chunk_);
  arena_ = Tensor::zeros({chunks_ * chunk_}, DType::f32, comm_->device());
  int64_t offset = 0;
  for (const Tensor& p : params) {
    Tensor slot = arena_.narrow(0, offset, p.numel()).view(p.shape());
    slot.copy_(p.detach());
    rebind_storage(p, slot);
    offset += p.numel();
  }
  next_ = Tensor::zeros({1}, DType::i64, comm_->device());
  if (comm_->size() > 1 && chunks_ > 1) staging_ = Tensor::empty({chunk_}, DType::f32, comm_->device());
}

void ParamAverager::broadcast(int root) {
  if (comm_->size() == 1) return;
  WorkPtr w = comm_->broadcast(arena_, root);
  timed_wait(w, stats_);
}

void ParamAverager::average_next_chunk(const Tensor& verdict) {
  // One chunk with no verdict to heed is the whole buffer, averaged where it lies.
  if (chunks_ == 1 && !verdict.defined()) return average(arena_);
  backend::Backend& be = backend::backend_for(comm_->device());
  if (comm_->size() > 1) {
    if (!staging_.defined()) staging_ = Tensor::empty({chunk_}, DType::f32, comm_->device());
    be.copy_chunk(arena_, staging_, next_, /*into_chunk=*/false, Tensor());
    average(staging_);
    be.copy_chunk(staging_, arena_, next_, /*into_chunk=*/true, verdict);
  }
  if (chunks_ > 1) be.advance_counter(next_, chunks_, verdict);
}

void ParamAverager::average_all() {
  for (int64_t k = 0; k < chunks_; ++k) average(arena_.narrow(0, k * chunk_, chunk_));
}

int64_t ParamAverager::next_chunk() const { return next_.item<int64_t>(); }

void ParamAverager::set_next_chunk(int64_t k) {
  TANDEM_CHECK(k >= 0 && k < chunks_, "partialUpdate: chunk ", k, " of ", chunks_);
  next_.fill_(static_cast<double>(k));
}

void ParamAverager::average(const Tensor& range) {
  if (comm_->size() == 1 || range.numel() == 0) return;
  Tensor view = range;
  WorkPtr w = comm_->all_reduce(view, ReduceOp::Avg);
  count_all_reduce(stats_, range.numel() * 4, comm_->size());
  timed_wait(w, stats_);
}

}  // namespace tandem::dist::detail
