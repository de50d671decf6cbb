#pragma once
// Internal: threading policy and BLAS access shared by the CPU compute kernels.
//
// The CPU backend runs one pool of threads, OpenMP's. OpenBLAS (the pthreads build here) keeps its
// own pool whose workers spin after every call; on a machine with few cores the two pools would
// steal cores from each other, and two OpenMP threads calling a multi-threaded OpenBLAS at once
// would queue on the same workers. So OpenBLAS always runs on the calling thread, and the kernels
// split GEMMs themselves: per image inside convolutions, by output blocks in gemm_parallel.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "tandem/error.h"
#include "tandem/tensor.h"

namespace tandem::backend::cpu {

/// Elements below which a memory-bound loop stays on one thread (a parallel region costs microseconds).
inline constexpr int64_t kParallelElems = 32768;
/// Floating-point operations below which a GEMM is not split across threads.
inline constexpr double kParallelFlops = 4.0e6;

/// Threads the kernels may use.
inline int max_threads() { return std::max(1, omp_get_max_threads()); }

/// Pins OpenBLAS to the calling thread; call outside parallel regions, before any BLAS call.
void ensure_blas_serial();

/// Throws when a GEMM extent does not fit the 32-bit BLAS interface.
void check_blas_extent(int64_t v, const char* what);

/// One row-major GEMM on the calling thread: c = alpha * op(a) op(b) + beta * c.
template <typename T>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc);

/// The same GEMM split across the OpenMP threads by blocks of rows or columns of c. Call outside
/// parallel regions.
template <typename T>
void gemm_parallel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                   int64_t ldb, T beta, T* c, int64_t ldc);

/// An uninitialised CPU scratch buffer of n elements of T, recycled by the caching allocator.
template <typename T>
Tensor scratch(int64_t n) {
  return Tensor::empty({n}, dtype_of<T>());
}

/// The [lo, hi) share of [0, n) that thread t of nt gets in a static split.
inline void thread_range(int64_t n, int t, int nt, int64_t& lo, int64_t& hi) {
  int64_t base = n / nt, extra = n % nt;
  lo = t * base + std::min<int64_t>(t, extra);
  hi = lo + base + (t < extra ? 1 : 0);
}

}  // namespace tandem::backend::cpu
