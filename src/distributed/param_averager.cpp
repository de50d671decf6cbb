#include "distributed/param_averager.h"

#include <algorithm>

#include "core/tensor_impl.h"
#include "distributed/grad_codec.h"

namespace tandem::dist::detail {

ParamAverager::ParamAverager(const std::vector<Tensor>& params, std::shared_ptr<Communicator> comm,
                             size_t chunk_bytes, CommStats& stats)
    : comm_(std::move(comm)), stats_(stats) {
  int64_t total = 0;
  for (const Tensor& p : params) {
    TANDEM_CHECK(p.dtype() == DType::f32, "DistOpt: parameter ", p.str(), " is not f32; f32 parameters are required");
    total += p.numel();
  }
  arena_ = Tensor::empty({total}, DType::f32, comm_->device());
  int64_t offset = 0;
  for (const Tensor& p : params) {
    Tensor slot = arena_.narrow(0, offset, p.numel()).view(p.shape());
    slot.copy_(p.detach());
    rebind_storage(p, slot);
    offset += p.numel();
  }
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / sizeof(float)));
  for (int64_t off = 0; off < total; off += chunk) chunks_.emplace_back(off, std::min(chunk, total - off));
}

void ParamAverager::broadcast(int root) {
  if (comm_->size() == 1) return;
  WorkPtr w = comm_->broadcast(arena_, root);
  timed_wait(w, stats_);
}

void ParamAverager::average_next_chunk() {
  average(chunks_[next_]);
  next_ = (next_ + 1) % chunks_.size();
}

void ParamAverager::average_all() {
  for (const auto& c : chunks_) average(c);
}

void ParamAverager::average(std::pair<int64_t, int64_t> chunk) {
  if (comm_->size() == 1 || chunk.second == 0) return;
  Tensor view = arena_.narrow(0, chunk.first, chunk.second);
  WorkPtr w = comm_->all_reduce(view, ReduceOp::Avg);
  count_all_reduce(stats_, chunk.second * 4, comm_->size());
  timed_wait(w, stats_);
}

}  // namespace tandem::dist::detail
