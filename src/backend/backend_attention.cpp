// The fused attention entry points of backends that have no fused kernels: the op asks
// fused_attention_supported first, so these are reached only by a caller that did not.
#include "backend/backend.h"

namespace tandem::backend {

void Backend::fused_attention_forward(const Tensor& q, const Tensor&, const Tensor&, const AttentionGeom&, uint64_t,
                                      uint64_t, Tensor&, Tensor&) {
  TANDEM_CHECK(false, "scaled_dot_product_attention: no fused attention kernels for ", q.str(),
               " (ask fused_attention_supported first)");
}

void Backend::fused_attention_backward(const Tensor& q, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const AttentionGeom&, uint64_t, uint64_t, Tensor&, Tensor&,
                                       Tensor&) {
  TANDEM_CHECK(false, "scaled_dot_product_attention backward: no fused attention kernels for ", q.str(),
               " (ask fused_attention_supported first)");
}

}  // namespace tandem::backend
