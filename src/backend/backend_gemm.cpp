// Backend default of the fused product: gemm, then the epilogue's kernels.
#include "backend/backend.h"

namespace tandem::backend {

void Backend::gemm_fused(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                         const Tensor& b, double beta, Tensor& c, const GemmFusion& f) {
  TANDEM_ASSERT(!f.a_row_sums.defined() || trans_a, "gemm_fused: row sums of op(A) need trans_a");
  TANDEM_ASSERT(c.dtype() == a.dtype() || beta == 0.0, "gemm_fused: beta with C of another type than A");
  // The product in A's type, converted where C is f32.
  Tensor prod = c.dtype() == a.dtype() ? c : Tensor::empty(c.shape(), a.dtype(), c.device());
  gemm(trans_a, trans_b, m, n, k, alpha, a, b, c.dtype() == a.dtype() ? beta : 0.0, prod);
  switch (f.epilogue) {
    case GemmEpilogue::None: break;
    case GemmEpilogue::Bias: bias_add(prod, f.bias, m, n, 1, prod); break;
    case GemmEpilogue::BiasGelu: {
      Tensor aux = f.aux;
      bias_add(prod, f.bias, m, n, 1, aux);
      unary(Unary::GeluTanh, aux, prod);
      break;
    }
    case GemmEpilogue::DGelu: unary_backward(Unary::GeluTanh, prod, f.aux, prod); break;
  }
  if (!prod.is_same(c)) copy_strided(prod, c);
  if (f.a_row_sums.defined()) {
    Tensor sums = f.a_row_sums;
    bias_grad(a, k, m, 1, sums);  // A is [k, m]: its column sums
  }
}

}  // namespace tandem::backend
