// CUDA backend: batched matrix products through cuBLAS's strided-batched GEMM.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "tandem/precision.h"

namespace tandem::backend {

void CudaBackend::gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k,
                               double alpha, const Tensor& a, int64_t stride_a, const Tensor& b, int64_t stride_b,
                               double beta, Tensor& c, int64_t stride_c) {
  TANDEM_CHECK(a.dtype() == b.dtype() && a.dtype() == c.dtype(), "gemm_batched: ", a.str(), ", ", b.str(), " and ",
               c.str(), " differ in dtype");
  TANDEM_CHECK(c.dtype() == DType::f32 || c.dtype() == DType::f16 || c.dtype() == DType::bf16, "gemm_batched: dtype ",
               dtype_name(c.dtype()), " is not supported on CUDA (use f32, f16 or bf16)");
  TANDEM_ASSERT(batch == 0 || (a.numel() >= (batch - 1) * stride_a + m * k && b.numel() >= (batch - 1) * stride_b + k * n &&
                               c.numel() >= (batch - 1) * stride_c + m * n),
                "gemm_batched extents ", batch, "x", m, "x", n, "x", k, " for ", a.str(), ", ", b.str(), ", ", c.str());
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {  // empty sums: C = beta * C, matrix by matrix (beta == 0 must not read C)
    for (int64_t i = 0; i < batch; ++i) {
      Tensor ci = c.view({-1}).narrow(0, i * stride_c, m * n);
      if (beta == 0.0)
        fill(ci, 0.0);
      else
        affine(ci, beta, 0.0, ci);
    }
    return;
  }
  TANDEM_CHECK(std::max({m, n, k}) <= INT_MAX && batch <= INT_MAX, "gemm_batched: extents ", batch, "x", m, "x", n,
               "x", k, " exceed cuBLAS's 32-bit limits");
  DeviceState& s = state_for(c);
  const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
  // Column-major cuBLAS computes the row-major C = op(A) op(B) as C^T = op(B)^T op(A)^T (see gemm).
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int count = static_cast<int>(batch);
  std::lock_guard<std::mutex> lock(s.cublas_mu);
  if (c.dtype() == DType::f32 && current_precision() == Precision::f32) {  // exact f32
    TANDEM_CUBLAS_CHECK(cublasSgemmStridedBatched(
        s.cublas, op_b, op_a, in, im, ik, &al, static_cast<const float*>(b.data_ptr()), ldb, stride_b,
        static_cast<const float*>(a.data_ptr()), lda, stride_a, &be, static_cast<float*>(c.data_ptr()), in, stride_c,
        count));
    return;
  }
  // TF32 tensor cores for f32 data; 16-bit data with f32 accumulation.
  const cudaDataType_t t = c.dtype() == DType::f32 ? CUDA_R_32F : c.dtype() == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  const cublasComputeType_t compute = c.dtype() == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  TANDEM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(s.cublas, op_b, op_a, in, im, ik, &al, b.data_ptr(), t, ldb, stride_b,
                                                 a.data_ptr(), t, lda, stride_a, &be, c.data_ptr(), t, in, stride_c,
                                                 count, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace tandem::backend
