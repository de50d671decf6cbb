#pragma once
// Internal: the parameters moved into one flat buffer, so that one broadcast starts every rank from
// the same model and partialUpdate can average them a bucket-sized chunk at a time (round robin).
// partialUpdate sends parameters after the step, not gradients: it is not a gradient codec. The
// round robin's position lives on the device: a recorded step replayed averages the next chunk at
// every replay (the buffer is padded to whole chunks, and the chunk due is staged through one
// fixed buffer, since a recorded collective always reads the same address).
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
  /// Averages the next chunk across ranks; chunk k at the k-th call, cycling (the position advances
  /// on the device, also in a job of one rank, where nothing travels). With a verdict (one f32 on the
  /// device, the same on every rank), a step whose verdict is not finite keeps its parameters and its
  /// position: the chunk still travels (every rank takes part) but is not written back.
  void average_next_chunk(const Tensor& verdict = Tensor());
  /// Averages every parameter across ranks.
  void average_all();
  /// How many chunks the round robin cycles through.
  int64_t chunks() const { return chunks_; }
  /// The chunk the next average_next_chunk averages (read from the device: a wait).
  int64_t next_chunk() const;
  /// Makes chunk k the next one (a resumed run continues the round robin).
  void set_next_chunk(int64_t k);

 private:
  void average(const Tensor& range);

  std::shared_ptr<Communicator> comm_;
  CommStats& stats_;
  Tensor arena_;       // the parameters, then zeros up to whole chunks
  int64_t chunk_ = 0, chunks_ = 1;
  Tensor staging_;     // the chunk being averaged (jobs of several ranks; with one chunk, only under a verdict)
  Tensor next_;        // i64 [1] on the device: the chunk due
};

}  // namespace tandem::dist::detail
