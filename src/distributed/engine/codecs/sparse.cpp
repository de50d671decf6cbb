#include "distributed/engine/codecs/sparse.h"

#include <algorithm>
#include <cmath>

namespace tandem::dist::detail {

int64_t top_k_count(double spars, int64_t n) {
  double exact = spars * static_cast<double>(n);
  auto k = static_cast<int64_t>(std::ceil(exact - 1e-9 * std::max(exact, 1.0)));
  return std::clamp<int64_t>(k, 1, n);
}

void SparseCodec::add_residual(Bucket& b) {
  if (feedback_) be().binary(backend::Binary::Add, b.grad, b.residual, b.grad);
}

void SparseCodec::keep_unsent(Bucket& b, const Tensor& pairs, int64_t n) {
  if (!feedback_) return;
  be().copy_bytes(b.grad.data_ptr(), b.residual.data_ptr(), static_cast<size_t>(b.numel) * 4, env_.device.index);
  be().sparse_zero(b.residual, pairs, n);
}

void SparseCodec::finish(Bucket& b) {
  const size_t k = static_cast<size_t>(b.index);
  timed_wait(work_[k], env_.stats);
  b.grad.zero_();
  int64_t off = 0;
  for (int64_t c : gathered_[k]) {
    if (c > 0) be().sparse_accumulate(b.grad, all_pairs_[k].narrow(0, off, 2 * c), c, 1.0 / env_.world);
    off += 2 * c;
  }
}

}  // namespace tandem::dist::detail
