// sparseTopK: per bucket, each rank sends the ceil(spars * n) gradients of largest magnitude.
// Sizes are fixed by the layout, so a step allocates nothing and never waits on the host.
#include "distributed/engine/codecs/sparse.h"

namespace tandem::dist::detail {

namespace {

class TopKCodec final : public SparseCodec {
 public:
  TopKCodec(const CodecEnv& env, double spars, bool feedback) : SparseCodec(env, feedback), spars_(spars) {}

  void on_layout(const std::vector<Bucket>& buckets) override {
    work_.reset(buckets.size());
    pairs_.clear();
    all_pairs_.clear();
    gathered_.clear();
    for (const Bucket& b : buckets) {
      int64_t k = top_k_count(spars_, b.numel);
      pairs_.push_back(Tensor::empty({2 * k}, DType::i32, env_.device));
      all_pairs_.push_back(Tensor::empty({2 * k * env_.world}, DType::i32, env_.device));
      gathered_.emplace_back(static_cast<size_t>(env_.world), k);
    }
  }

  void launch(Bucket& b) override {
    const size_t i = static_cast<size_t>(b.index);
    const int64_t k = gathered_[i][0];
    add_residual(b);
    be().sparse_topk(b.grad, k, pairs_[i]);
    keep_unsent(b, pairs_[i], k);
    work_[i] = env_.comm.all_gather(pairs_[i], all_pairs_[i]);
    int64_t bytes = 2 * k * 4 * (env_.world - 1);
    env_.stats.bytes_sent += bytes;
    env_.stats.bytes_received += bytes;
    env_.stats.collectives++;
  }

 private:
  double spars_;
};

}  // namespace

std::unique_ptr<GradCodec> make_top_k_codec(const CodecEnv& env, const SyncOptions& o) {
  TANDEM_CHECK(o.spars > 0.0 && o.spars <= 1.0, "sparseTopK: spars is the fraction of gradients sent, in (0, 1]; got ",
               o.spars);
  TANDEM_CHECK(env.grad_dtype == DType::f32, "sparseTopK selects among f32 gradients, not ",
               dtype_name(env.grad_dtype));
  return std::make_unique<TopKCodec>(env, o.spars, o.error_feedback);
}

}  // namespace tandem::dist::detail
