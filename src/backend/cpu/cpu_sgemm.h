#pragma once
// Internal: tandem's own f32 matrix product for the CPU (AVX2 + FMA), with the epilogues of a layer fused
// into it (bias, bias then GELU, the GELU's derivative, a residual addend).
//
// Why not OpenBLAS alone: a transformer's products on the CPU are small (a few hundred rows and columns),
// where OpenBLAS spends a good share of each call outside its kernel (a pass that scales C by beta, packing,
// its interface), and every epilogue costs a pass of its own over C. Here the operands are packed in the
// usual panels (6 rows of A, 16 columns of B), a 6 x 16 register tile is accumulated by FMAs, and each
// finished tile gets its epilogue while it is still in the cache. The backend takes this path where
// bench/cpu_gemm_bench.cpp measured it faster than OpenBLAS (sgemm_preferred), OpenBLAS elsewhere.
#include <cstdint>

namespace tandem::backend::cpu {

/// What is done to each element v of the product alpha op(A) op(B) (+ beta C) before it is stored.
struct SgemmEpilogue {
  enum class Kind { None, Bias, BiasGelu, DGelu };
  Kind kind = Kind::None;
  const float* bias = nullptr;    // [n]: Bias, BiasGelu
  const float* addend = nullptr;  // [m, n] rows ld_addend apart, added to v first (a residual); beta must be 0
  int64_t ld_addend = 0;
  float* aux = nullptr;           // [m, n] rows ld_aux apart: BiasGelu writes v + bias there, DGelu reads it
  int64_t ld_aux = 0;
  /// Causal attention's products skip what is known to be zero or not wanted, given `diagonal` (row i's last
  /// column of interest is i + diagonal): LowerA, op(A)(i, p) = 0 for p > i + diagonal (probabilities times
  /// values); UpperA, op(A)(i, p) = 0 for p < i + diagonal (their transpose); UpperC, C(i, j) for j > i +
  /// diagonal is not wanted (scores): tiles wholly past the diagonal are left unwritten, others are whole.
  enum class Triangle { None, LowerA, UpperA, UpperC };
  Triangle triangle = Triangle::None;
  int64_t diagonal = 0;
};

/// Whether this build and processor run the own kernel (AVX2 and FMA, checked once at run time).
bool sgemm_available();

/// Whether the own kernel is available and the product fills its 6 x 16 tiles at least once (m >= 6, n >= 16):
/// thinner ones (a dot product as a 1 x 1 product, one query's attention) waste most of each tile.
bool sgemm_fits(int64_t m, int64_t n);

/// Whether the own kernel is expected to beat OpenBLAS on an m x n x k product with op(A) transposed or not
/// (the measurements of bench/cpu_gemm_bench.cpp) and is available.
bool sgemm_preferred(bool ta, int64_t m, int64_t n, int64_t k);

/// c [m, n] (rows ldc apart) = epilogue(alpha op(a) op(b) + beta c), row-major operands: op(a) [m, k] is a
/// (rows lda apart) or, with ta, the transpose of a [k, m]; op(b) likewise [k, n]. beta 0 never reads c (NaN
/// there is ignored). Split over up to `threads` threads of the backend's pool (1: the calling thread only);
/// every element is summed in the same order whatever the thread count. Requires sgemm_available().
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const SgemmEpilogue& e = {},
           int threads = 1);

/// GELU (tanh form) and its derivative over n floats, vectorised: y = gelu(x); dx = g * gelu'(x). Within a
/// few ulp of the scalar formula of backend/elementwise_functors.h (tanh taken from an exponential).
void gelu_tanh_f32(const float* x, float* y, int64_t n);
void gelu_tanh_backward_f32(const float* g, const float* x, float* dx, int64_t n);

}  // namespace tandem::backend::cpu
