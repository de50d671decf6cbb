#pragma once
// Internal: the parameters moved into one flat buffer, so that one broadcast starts every rank from
// the same model and partialUpdate can average them a bucket-sized chunk at a time (round robin).
// partialUpdate sends parameters after the step, not gradients: it is not a gradient codec.
#include <memory>
#include <utility>
#include <vector>

#include "tandem/distributed/communicator.h"
#include "tandem/distributed/dist_opt.h"

namespace tandem::dist::detail {

class ParamAverager {
 public:
  /// Moves the parameters' values into one buffer and makes each parameter a view of it.
  ParamAverager(const std::vector<Tensor>& params, std::shared_ptr<Communicator> comm, size_t chunk_bytes,
                CommStats& stats);
  /// Every rank takes root's parameters.
  void broadcast(int root);
  /// Averages the next chunk across ranks; chunk k at the k-th call, cycling.
  void average_next_chunk();
  /// Averages every parameter across ranks.
  void average_all();

 private:
  void average(std::pair<int64_t, int64_t> chunk);

  std::shared_ptr<Communicator> comm_;
  CommStats& stats_;
  Tensor arena_;
  std::vector<std::pair<int64_t, int64_t>> chunks_;  // (offset, length) ranges of the arena
  size_t next_ = 0;
};

}  // namespace tandem::dist::detail
