#pragma once
// Internal: what sparseTopK and sparseThreshold share. Each rank sends (index, value) pairs by
// all-gather, and every rank adds everyone's pairs rank by rank, in the same order: the result is
// exactly the sum of what each sent divided by the world size, and identical on every rank.
#include "backend/backend.h"
#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

/// How many of n values sparseTopK sends: ceil(spars * n), clamped to [1, n]. The product is taken a
/// hair low: spars arrives rounded to a double (0.07 is 0.07000000000000000666), and 0.07 * 700 must
/// give 49 values, not 50.
int64_t top_k_count(double spars, int64_t n);

class SparseCodec : public GradCodec {
 public:
  SparseCodec(const CodecEnv& env, bool feedback) : env_(env), feedback_(feedback) {}
  bool keeps_residual() const override { return feedback_; }
  /// Waits for the gathered pairs and writes their average into the bucket.
  void finish(Bucket& b) override;

 protected:
  backend::Backend& be() { return backend::backend_for(env_.device); }
  /// With error feedback: the gradient to select from is this step's plus what earlier steps kept.
  void add_residual(Bucket& b);
  /// With error feedback: residual = that gradient with the n entries of `pairs` (being sent) zeroed.
  void keep_unsent(Bucket& b, const Tensor& pairs, int64_t n);

  CodecEnv env_;
  bool feedback_;
  std::vector<Tensor> pairs_;                   // per bucket: this rank's pairs, i32 interleaved
  std::vector<Tensor> all_pairs_;               // per bucket: every rank's, gathered
  std::vector<std::vector<int64_t>> gathered_;  // per bucket: how many pairs each rank sent
  BucketWork work_;
};

}  // namespace tandem::dist::detail
