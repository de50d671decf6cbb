// sparseThreshold: per bucket, each rank sends exactly the gradients with |g| >= threshold. How
// many that is decides the gather's layout, so the counts are exchanged first and read on the host
// (the one host wait per bucket), and the gather buffer grows when a step needs more room: this
// codec cannot be captured in a CUDA graph.
#include <algorithm>

#include "distributed/engine/codecs/sparse.h"

namespace tandem::dist::detail {

namespace {

class ThresholdCodec final : public SparseCodec {
 public:
  ThresholdCodec(const CodecEnv& env, double threshold, bool feedback)
      : SparseCodec(env, feedback), threshold_(threshold) {}

  bool capturable() const override { return false; }

  void on_layout(const std::vector<Bucket>& buckets) override {
    work_.reset(buckets.size());
    pairs_.clear();
    all_pairs_.clear();
    gathered_.assign(buckets.size(), {});
    count_ = Tensor::empty({1}, DType::i64, env_.device);
    all_counts_ = Tensor::empty({env_.world}, DType::i64, env_.device);
    for (const Bucket& b : buckets) {
      pairs_.push_back(Tensor::empty({2 * b.numel}, DType::i32, env_.device));  // room for every value
      // Room for an eighth of every rank's values; a denser step grows it.
      all_pairs_.push_back(Tensor::empty({std::max<int64_t>(2 * env_.world * b.numel / 8, 2)}, DType::i32, env_.device));
    }
  }

  void launch(Bucket& b) override {
    const size_t i = static_cast<size_t>(b.index);
    const int W = env_.world;
    add_residual(b);
    be().sparse_threshold(b.grad, threshold_, pairs_[i], count_);
    WorkPtr w = env_.comm.all_gather(count_, all_counts_);
    timed_wait(w, env_.stats);
    std::vector<int64_t> counts = all_counts_.to_vector<int64_t>();
    const int64_t mine = counts[static_cast<size_t>(env_.rank)];
    keep_unsent(b, pairs_[i], mine);
    int64_t total = 0;
    std::vector<int64_t> sizes;
    for (int64_t c : counts) {
      sizes.push_back(2 * c);
      total += 2 * c;
    }
    if (all_pairs_[i].numel() < total) all_pairs_[i] = Tensor::empty({total}, DType::i32, env_.device);
    Tensor out = all_pairs_[i].narrow(0, 0, total);
    work_[i] = env_.comm.all_gatherv(pairs_[i].narrow(0, 0, 2 * mine), out, sizes);
    gathered_[i] = counts;
    env_.stats.bytes_sent += 2 * mine * 4 * (W - 1) + 8 * (W - 1);
    env_.stats.bytes_received += (total - 2 * mine) * 4 + 8 * (W - 1);
    env_.stats.collectives += 2;
  }

 private:
  double threshold_;
  Tensor count_, all_counts_;  // this rank's pair count, every rank's
};

}  // namespace

std::unique_ptr<GradCodec> make_threshold_codec(const CodecEnv& env, const SyncOptions& o) {
  TANDEM_CHECK(o.spars >= 0.0, "sparseThreshold: spars is the magnitude threshold and must not be negative; got ",
               o.spars);
  TANDEM_CHECK(env.grad_dtype == DType::f32, "sparseThreshold selects among f32 gradients, not ",
               dtype_name(env.grad_dtype));
  return std::make_unique<ThresholdCodec>(env, o.spars, o.error_feedback);
}

}  // namespace tandem::dist::detail
