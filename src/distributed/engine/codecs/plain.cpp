// plain: each bucket all-reduced as it is, averaged once (sharded: reduce-scattered, each rank
// receiving the average of its own block). A 16-bit gradient arena is divided by the world size before
// a sum, so that the sum cannot overflow where the average would not.
#include "backend/backend.h"
#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

namespace {

class PlainCodec final : public GradCodec {
 public:
  explicit PlainCodec(const CodecEnv& env) : env_(env) {}

  void on_layout(const std::vector<Bucket>& buckets) override { work_.reset(buckets.size()); }

  bool shards() const override { return true; }

  void launch(Bucket& b) override {
    WorkPtr& w = work_[static_cast<size_t>(b.index)];
    const bool wide = b.grad.dtype() == DType::f32;
    if (!wide) backend::backend_for(env_.device).scale_cast(b.grad, b.grad, 1.0 / env_.world, 0.0);
    const ReduceOp op = wide ? ReduceOp::Avg : ReduceOp::Sum;
    if (b.shard.defined()) {
      w = env_.comm.reduce_scatter(b.grad, b.shard, op);
      count_reduce_scatter(env_.stats, static_cast<int64_t>(b.grad.nbytes()), env_.world);
    } else {
      w = env_.comm.all_reduce(b.grad, op);
      count_all_reduce(env_.stats, static_cast<int64_t>(b.grad.nbytes()), env_.world);
    }
  }

  void finish(Bucket& b) override { timed_wait(work_[static_cast<size_t>(b.index)], env_.stats); }

 private:
  CodecEnv env_;
  BucketWork work_;
};

}  // namespace

std::unique_ptr<GradCodec> make_plain_codec(const CodecEnv& env, const SyncOptions&) {
  return std::make_unique<PlainCodec>(env);
}

}  // namespace tandem::dist::detail
