#pragma once
// Collective communication between the ranks of a data-parallel job.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tensor.h"

namespace tandem::dist {

enum class ReduceOp { Sum, Avg };

/// Completion handle of an asynchronous collective. wait() orders later work on the tensor's
/// device after the collective (a stream wait on GPUs, a blocking wait on CPUs) and rethrows its
/// failure. Tensors passed to the collective stay alive until then.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  /// True once the collective has finished (never blocks).
  virtual bool done() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

/// A group of ranks. Every rank must call the same collectives in the same order with tensors of
/// the same shape and dtype (all_gatherv excepted). Backends: NCCL (CUDA tensors), Gloo (CPU
/// tensors), and a one-process group where every collective is a copy or nothing.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Rank among the processes on this host (the GPU index to use).
  virtual int local_rank() const = 0;
  /// Processes on this host.
  virtual int local_size() const = 0;
  /// "nccl", "gloo", "single"
  virtual std::string backend_name() const = 0;
  /// The device whose tensors this communicator moves.
  virtual Device device() const = 0;

  /// In place: t = op over ranks of t. Dtypes f32, f16, bf16, i32, i64 (f64 on the CPU).
  virtual WorkPtr all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  /// out [n] = op over ranks of block rank() of in [size * n] (contiguous, flat; in is not changed).
  /// out may be that block of in itself (in place). Dtypes as all_reduce. ZeRO's gradient exchange:
  /// each rank receives the average of its own slice, for half an all-reduce's traffic.
  virtual WorkPtr reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum) = 0;
  /// out [size * n] = concatenation over ranks of in [n] (contiguous, flat). in may be block rank()
  /// of out itself (in place); otherwise the two share no storage.
  virtual WorkPtr all_gather(const Tensor& in, Tensor& out) = 0;
  /// out = concatenation over ranks r of the first counts[r] elements of each rank's in;
  /// in holds counts[rank()] elements; counts are known to every rank.
  virtual WorkPtr all_gatherv(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) = 0;
  /// In place: t = root's t.
  virtual WorkPtr broadcast(Tensor& t, int root = 0) = 0;
  /// Returns once every rank has called barrier().
  virtual void barrier() = 0;
  /// A collective that has not finished after this long fails, naming the collective and rank.
  virtual void set_timeout(std::chrono::milliseconds t) = 0;
  /// Whether collectives issued while the device's work is being recorded (DeviceGraph) are recorded
  /// with it and run again by every replay (NCCL's are).
  virtual bool records_collectives() const { return false; }
  /// Holds the device work queued so far (a replayed step and the collectives in it) to the same
  /// timeout as a collective, naming `what` when it is late. A group of one rank waits on no peer:
  /// nothing to watch.
  virtual void watch(const char* what) {}
};

}  // namespace tandem::dist
