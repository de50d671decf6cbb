// Backend defaults of the normalisation kernels that a backend may fuse.
#include "backend/backend.h"

namespace tandem::backend {

bool Backend::layer_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                      const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& acc, Tensor& dw,
                                      Tensor& db, Tensor& /*acc_sums*/) {
  TANDEM_ASSERT(acc.numel() == x.numel() && acc.dtype() == x.dtype() && acc.is_contiguous(),
                "layer_norm_backward_add into ", acc.str(), " for ", x.str());
  Tensor dx = Tensor::empty(acc.shape(), acc.dtype(), acc.device()), none;
  layer_norm_backward(dy, x, w, mean, rstd, n, c, rms, dx, dw, db, none);
  binary(Binary::Add, acc, dx, acc);
  return false;
}

}  // namespace tandem::backend
