// Backend defaults of the loss kernels that a backend may fuse.
#include "backend/backend.h"

namespace tandem::backend {

void Backend::xent_rows_forward_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                     Tensor& valid) {
  Tensor lse = Tensor::empty(loss.shape(), loss.dtype(), loss.device());
  xent_rows_forward(logits, targets, ignore_index, loss, lse, valid);
  const Tensor unit = Tensor::full({1}, 1.0, loss.dtype(), loss.device());
  xent_rows_backward(logits, targets, lse, unit, ignore_index, logits);  // each element read, then written
}

}  // namespace tandem::backend
