// half: each bucket cast to f16 (or bf16) for the all-reduce and back: half the bytes. Values are
// divided by the world size before the cast and summed after, so the f16 sum cannot overflow where
// the average would not. With clip, each rank's values are first clipped into [-clip, clip].
// Sharded, the 16-bit bucket is reduce-scattered in 16 bits and only the rank's own block converted
// back, into its f32 shard; the 16-bit copy then lives from launch to finish only.
#include "backend/backend.h"
#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

namespace {

class HalfCodec final : public GradCodec {
 public:
  HalfCodec(const CodecEnv& env, DType dtype, double clip) : env_(env), dtype_(dtype), clip_(clip) {}

  bool shards() const override { return true; }

  void on_layout(const std::vector<Bucket>& buckets) override {
    work_.reset(buckets.size());
    staging_.clear();
    for (const Bucket& b : buckets)
      staging_.push_back(env_.shard == Shard::none ? Tensor::empty({b.span}, dtype_, env_.device) : Tensor());
  }

  void launch(Bucket& b) override {
    Tensor& wire = staging_[static_cast<size_t>(b.index)];
    if (!wire.defined()) wire = Tensor::empty({b.span}, dtype_, env_.device);
    // The kernel clips after scaling, so the bound is scaled too.
    be().scale_cast(b.grad, wire, 1.0 / env_.world, clip_ / env_.world);
    WorkPtr& w = work_[static_cast<size_t>(b.index)];
    if (b.shard.defined()) {
      Tensor mine = own_block(b);
      w = env_.comm.reduce_scatter(wire, mine, ReduceOp::Sum);
      count_reduce_scatter(env_.stats, static_cast<int64_t>(wire.nbytes()), env_.world);
    } else {
      w = env_.comm.all_reduce(wire, ReduceOp::Sum);
      count_all_reduce(env_.stats, static_cast<int64_t>(wire.nbytes()), env_.world);
    }
  }

  void finish(Bucket& b) override {
    timed_wait(work_[static_cast<size_t>(b.index)], env_.stats);
    Tensor& wire = staging_[static_cast<size_t>(b.index)];
    if (!b.shard.defined()) {
      be().scale_cast(wire, b.grad, 1.0, 0.0);
      return;
    }
    be().scale_cast(own_block(b), b.shard, 1.0, 0.0);
    wire = Tensor();
  }

  // Clipping changes what is applied, not only what travels: a single process clips too.
  void apply_locally(Bucket& b) override {
    if (clip_ > 0.0) be().scale_cast(b.grad, b.grad, 1.0, clip_);
  }

 private:
  backend::Backend& be() { return backend::backend_for(env_.device); }
  // The rank's block of the 16-bit copy, where the reduce-scatter leaves its sum (in place).
  Tensor own_block(const Bucket& b) {
    const int64_t block = b.span / env_.world;
    return staging_[static_cast<size_t>(b.index)].narrow(0, env_.rank * block, block);
  }
  CodecEnv env_;
  DType dtype_;
  double clip_;
  std::vector<Tensor> staging_;  // per bucket: the 16-bit copy that travels
  BucketWork work_;
};

}  // namespace

std::unique_ptr<GradCodec> make_half_codec(const CodecEnv& env, const SyncOptions& o) {
  TANDEM_CHECK(o.half_dtype == DType::f16 || o.half_dtype == DType::bf16, "the half method sends f16 or bf16, not ",
               dtype_name(o.half_dtype));
  TANDEM_CHECK(o.clip >= 0.0, "the half method's clip value must not be negative, got ", o.clip);
  TANDEM_CHECK(env.grad_dtype == DType::f32, "the half method casts f32 gradients; these are already ",
               dtype_name(env.grad_dtype), " (use plain)");
  return std::make_unique<HalfCodec>(env, o.half_dtype, o.clip);
}

}  // namespace tandem::dist::detail
