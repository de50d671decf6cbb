// The fused recurrent-network kernels a backend without them refuses (tandem::rnn composes the network
// of other ops there: rnn_supported is false).
#include "backend/backend.h"

namespace tandem::backend {

void Backend::rnn_forward(const RnnGeom&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&, bool, Tensor&,
                          Tensor&, Tensor&, Tensor&) {
  TANDEM_CHECK(false, "rnn: ", x.device().str(), " has no fused recurrent kernels");
}

void Backend::rnn_backward(const RnnGeom&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&,
                           Tensor&) {
  TANDEM_CHECK(false, "rnn: ", x.device().str(), " has no fused recurrent kernels");
}

}  // namespace tandem::backend
