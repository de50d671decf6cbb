// Backend default of the fused product: gemm, then the epilogue's kernels.
#include "backend/backend.h"

namespace tandem::backend {

void Backend::gemm_fused(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                         const Tensor& b, double beta, Tensor& c, const GemmFusion& f) {
  if (!a.is_contiguous()) {  // rows of A a stride apart: packed first
    TANDEM_ASSERT(!trans_a && a.dim() == 2 && a.size(0) == m && a.size(1) == k, "gemm_fused: A ", a.str(), " for ", m,
                  "x", k);
    Tensor packed = Tensor::empty(a.shape(), a.dtype(), a.device());
    copy_strided(a, packed);
    gemm_fused(trans_a, trans_b, m, n, k, alpha, packed, b, beta, c, f);
    return;
  }
  TANDEM_ASSERT(!f.a_row_sums.defined() || trans_a, "gemm_fused: row sums of op(A) need trans_a");
  TANDEM_ASSERT(c.dtype() == a.dtype() || beta == 0.0 || f.epilogue == GemmEpilogue::None,
                "gemm_fused: beta with an epilogue and C of another type than A");
  TANDEM_ASSERT(!f.addend.defined() || (beta == 0.0 && f.addend.dtype() == c.dtype() && f.addend.numel() == m * n &&
                                        !f.addend.is_same(c)),
                "gemm_fused: an addend ", f.addend.defined() ? f.addend.str() : "", " for C ", c.str());
  TANDEM_ASSERT(!f.c_col_sums.defined() || f.epilogue == GemmEpilogue::DGelu, "gemm_fused: column sums need DGelu");
  // The product in A's type, converted where C is f32.
  Tensor prod = c.dtype() == a.dtype() ? c : Tensor::empty(c.shape(), a.dtype(), c.device());
  if (f.addend.defined()) copy_strided(f.addend.view(prod.shape()), prod);
  gemm(trans_a, trans_b, m, n, k, alpha, a, b, f.addend.defined() ? 1.0 : c.dtype() == a.dtype() ? beta : 0.0, prod);
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
  if (!prod.is_same(c) && beta == 0.0) {
    copy_strided(prod, c);
  } else if (!prod.is_same(c)) {  // C of another type, accumulated: C = beta C + the product
    Tensor wide = Tensor::empty(c.shape(), c.dtype(), c.device());
    copy_strided(prod, wide);
    if (beta != 1.0) affine(c, beta, 0.0, c);
    binary(Binary::Add, c, wide, c);
  }
  if (f.c_col_sums.defined()) {
    Tensor sums = f.c_col_sums;
    bias_grad(c, m, n, 1, sums);
  }
  if (f.a_row_sums.defined()) {
    Tensor sums = f.a_row_sums;
    bias_grad(a, k, m, 1, sums);  // A is [k, m]: its column sums
  }
}

}  // namespace tandem::backend
