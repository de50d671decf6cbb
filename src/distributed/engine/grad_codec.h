#pragma once
// Internal: the seam between the reducer and what travels. A GradCodec turns one bucket of this
// rank's gradients into collectives and the results back into the averaged gradient. Its settings
// are fixed when it is made; buffers are sized in on_layout, so that a step's launch and finish
// allocate nothing (sparseThreshold, whose sizes the host learns each step, excepted: it says so in
// capturable()). Adding a codec is one file in codecs/ and one entry in codecs/registry.cpp.
#include <memory>
#include <string>
#include <vector>

#include "tandem/distributed/communicator.h"
#include "tandem/distributed/dist_opt.h"

namespace tandem::dist::detail {

/// One bucket as the reducer lays it out.
struct Bucket {
  int index = 0;
  int64_t offset = 0, numel = 0;  // range of the gradient arena, in elements (with the zero gaps that put
                                  // each parameter's start at a 16-byte boundary)
  int64_t span = 0;               // numel, padded under sharding to whole blocks of 16 bytes, one per rank
  std::vector<int> params;        // parameter indices, in arena order
  std::vector<int64_t> starts;    // each parameter's offset inside the bucket
  Tensor grad;                    // [span]: this rank's gradient in; the average out (unsharded)
  Tensor residual;                // error feedback (f32, same range), when the codec keeps one
  /// Under sharding: where the average of this rank's block of the bucket goes ([span / world]);
  /// undefined otherwise.
  Tensor shard;
  int pending = 0;                // parameters whose gradient is not final yet in this step
};

/// What a codec works with, fixed for its lifetime.
struct CodecEnv {
  Communicator& comm;
  CommStats& stats;
  Device device;
  int rank = 0, world = 1;
  DType grad_dtype = DType::f32;  // the gradient arena's
  std::vector<Shape> shapes;      // per parameter
  Shard shard = Shard::none;      // sharded: reduce-scatter each bucket into Bucket::shard
};

class GradCodec {
 public:
  virtual ~GradCodec() = default;
  /// Whether the reducer should keep an error-feedback residual per parameter (Bucket::residual).
  virtual bool keeps_residual() const { return false; }
  /// Whether launch and finish never wait on the host nor allocate (a step can be captured whole).
  virtual bool capturable() const { return true; }
  /// Whether the codec can reduce-scatter a bucket into its Bucket::shard (sharded state).
  virtual bool shards() const { return false; }
  /// The buckets were laid out (at the start, and again when rebuilt): size every buffer here.
  virtual void on_layout(const std::vector<Bucket>& buckets) = 0;
  /// The bucket's gradient (plus residual, for codecs that keep one) is final: start sending it.
  virtual void launch(Bucket& b) = 0;
  /// Waits for what launch started and leaves the average in b.grad (and updates b.residual).
  virtual void finish(Bucket& b) = 0;
  /// A job of one rank: what the codec does to a gradient even with nothing to exchange.
  virtual void apply_locally(Bucket& b) {}
  /// Buffers the codec carries from one step to the next, besides the residuals (PowerSGD's Q): the
  /// reducer keeps a copy from before a step and puts it back when the step proves non-finite.
  virtual std::vector<Tensor> carried_buffers() { return {}; }
  /// The same state by parameter, for checkpoints: names stable across layouts ("q/3": parameter 3's Q).
  virtual std::vector<std::pair<std::string, Tensor>> named_state() { return {}; }
};

/// Makes the codec `opts.method` names (parse_sync_method's spelling); throws for an unknown one or
/// settings it cannot use.
std::unique_ptr<GradCodec> make_codec(const CodecEnv& env, const SyncOptions& opts);
/// The codecs make_codec knows, as {canonical name, other accepted spellings}.
struct CodecName {
  const char* name;
  std::vector<const char*> aliases;
};
const std::vector<CodecName>& codec_names();

// ---- helpers the codecs share

/// Adds an all-reduce of `bytes` to the counters (nccl-tests accounting: 2(n-1)/n of it each way).
void count_all_reduce(CommStats& stats, int64_t bytes, int world);
/// Adds a reduce-scatter of `bytes` of input, or an all-gather of `bytes` of output (each (n-1)/n of
/// it each way: together an all-reduce's traffic).
void count_reduce_scatter(CommStats& stats, int64_t bytes, int world);
void count_all_gather(CommStats& stats, int64_t bytes, int world);
/// Waits for w (when set) and clears it; the host time blocked goes into stats.
void timed_wait(WorkPtr& w, CommStats& stats);

/// One pending collective per bucket. Dropping it waits for any still running (quietly: this is
/// the unwinding path), so no buffer is freed while a collective may still use it.
class BucketWork {
 public:
  BucketWork() = default;
  ~BucketWork();
  BucketWork(const BucketWork&) = delete;
  BucketWork& operator=(const BucketWork&) = delete;
  void reset(size_t buckets);
  WorkPtr& operator[](size_t k) { return work_[k]; }
  size_t size() const { return work_.size(); }

 private:
  std::vector<WorkPtr> work_;
};

}  // namespace tandem::dist::detail
