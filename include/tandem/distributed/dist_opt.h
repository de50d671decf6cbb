#pragma once
// DistOpt: the distributed optimizer. Wraps any optimizer; gradients are averaged across ranks
// while backward is still running, then the wrapped optimizer applies them.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/distributed/communicator.h"
#include "tandem/nn/module.h"
#include "tandem/optim/optimizer.h"

namespace tandem::dist {

/// How gradients (or parameters) travel between ranks.
enum class SyncMode {
  Plain,            // f32 gradients, all-reduced per bucket
  Half,             // gradients cast to f16 (or bf16) for the all-reduce
  Partial,          // local steps; one chunk of the parameters averaged per step, round robin
  SparseTopK,       // per bucket, the ceil(spars*n) largest-magnitude gradients
  SparseThreshold,  // per bucket, the gradients with |g| >= spars
};

/// Parses plain, half, partialUpdate, sparseTopK, sparseThreshold (also lower-case and kebab-case).
SyncMode parse_sync_mode(const std::string& s);
/// The guide's spelling of a mode.
const char* sync_mode_name(SyncMode m);

struct DistOptOptions {
  size_t bucket_bytes = size_t(16) << 20;       // gradient bytes per all-reduce (and partial mode's chunk)
  size_t first_bucket_bytes = size_t(1) << 20;  // a small first bucket starts communication early
  DType half_dtype = DType::f16;                // f16 or bf16 for the half mode
  bool rebuild_buckets = true;                  // after the first step, order buckets as gradients arrived
};

/// Communication counters, per rank.
struct CommStats {
  int64_t steps = 0;
  int64_t collectives = 0;
  int64_t bytes_sent = 0;      // bytes this rank put on the wire (nccl-tests accounting)
  int64_t bytes_received = 0;  // bytes this rank took off the wire
  double wait_seconds = 0.0;   // host time blocked waiting for communication
};

class DistOpt {
 public:
  /// Wraps opt; comm decides the ranks. Every rank must construct DistOpt with the same parameters.
  DistOpt(std::shared_ptr<optim::Optimizer> opt, std::shared_ptr<Communicator> comm, DistOptOptions options = {});
  ~DistOpt();
  DistOpt(const DistOpt&) = delete;
  DistOpt& operator=(const DistOpt&) = delete;

  /// GPU index on this node.
  int rank_in_local() const;
  /// Rank across all nodes.
  int rank_in_global() const;
  int world_size() const;
  Communicator& communicator() { return *comm_; }
  optim::Optimizer& optimizer() { return *opt_; }

  /// Checks that every rank built the same model (names, shapes, dtypes; throws saying what
  /// differs), then broadcasts parameters and buffers from rank 0 so all ranks start identical.
  void sync_parameters(nn::Module& model);

  /// Backward with bucketed f32 all-reduce overlapped, then the optimizer step.
  void backward_and_update(const Tensor& loss);
  /// As backward_and_update with gradients sent as f16 (options().half_dtype); with clipping, each
  /// gradient value is first clipped into [-clip_value, clip_value].
  void backward_and_update_half(const Tensor& loss, bool clipping = false, double clip_value = 100.0);
  /// Backward and a local optimizer step, then one chunk of the parameters averaged across ranks.
  void backward_and_partial_update(const Tensor& loss);
  /// Backward with sparsified gradients: topK sends the ceil(spars*n) largest magnitudes per bucket,
  /// otherwise those with |g| >= spars; with corr, what was not sent is added to the next step's gradient.
  void backward_and_sparse_update(const Tensor& loss, double spars = 0.05, bool topK = false, bool corr = true);
  /// Runs the step of the given mode (spars / corr for the sparse modes, clip for half; 0: no clipping).
  void step(SyncMode mode, const Tensor& loss, double spars = 0.05, bool corr = true, double clip = 0.0);

  /// Averages parameters and buffers across ranks (partial mode does this before evaluation).
  void average_parameters();
  /// Averages buffers only (batch-norm running statistics).
  void average_buffers();
  /// Throws, naming the first tensor that differs, unless all ranks hold bit-identical parameters
  /// (and buffers, with include_buffers: batch-norm statistics agree only after average_buffers()).
  void check_consistency(bool include_buffers = true);

  const CommStats& stats() const;
  void reset_stats();
  /// Records "launch <bucket>" and "backward_done" events in order (tests use it to see overlap).
  void set_trace(bool on);
  const std::vector<std::string>& trace() const;
  /// Element counts of the gradient buckets, in launch order.
  std::vector<int64_t> bucket_sizes() const;
  const DistOptOptions& options() const;

 private:
  class Engine;
  std::shared_ptr<optim::Optimizer> opt_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace tandem::dist
