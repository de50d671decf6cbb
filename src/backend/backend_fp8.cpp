// Backend default of the FP8 product: both operands decoded to f32 (times their scale_inv), then the f32
// product. This is the CPU's emulation of an FP8 product, and CUDA's where cuBLASLt does not take the case.
#include "backend/backend.h"
#include "tandem/precision.h"

namespace tandem::backend {

void Backend::fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                       const Tensor& b_scale_inv, int64_t m, int64_t n, int64_t k, Tensor& c) {
  TANDEM_CHECK(a.dtype() == DType::u8 && b.dtype() == DType::u8 && a.numel() == m * k && b.numel() == n * k,
               "fp8_gemm: operands ", a.str(), " and ", b.str(), " are not the FP8 codes of [", m, ", ", k, "] and [",
               n, ", ", k, "]");
  TANDEM_CHECK((c.dtype() == DType::f32 || c.dtype() == DType::bf16) && c.numel() == m * n, "fp8_gemm: output ",
               c.str(), " for [", m, ", ", n, "] (f32 or bf16)");
  Tensor ad = Tensor::empty({m, k}, DType::f32, a.device()), bd = Tensor::empty({n, k}, DType::f32, b.device());
  fp8_dequantize(a, a_scale_inv, fa, ad);
  fp8_dequantize(b, b_scale_inv, fb, bd);
  Tensor out = c.dtype() == DType::f32 ? c : Tensor::empty({m, n}, DType::f32, c.device());
  PrecisionScope exact(Precision::f32);  // f32 sums whatever the caller's precision (no TF32 rounding)
  if (m > 0 && n > 0) gemm(false, true, m, n, k, 1.0, ad, bd, 0.0, out);
  if (!out.is_same(c)) copy_strided(out, c);
}

}  // namespace tandem::backend
