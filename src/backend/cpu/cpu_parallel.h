#pragma once
// Internal: threading and BLAS access shared by the CPU kernels.
//
// The kernels run on one pool of threads, the backend's own (cpu_thread_pool.cpp), sized by
// tandem::set_num_threads. OpenBLAS (the pthreads build) keeps a pool of its own whose workers spin
// after every call; with few cores the two pools would take cores from each other, and two of our
// threads calling a multi-threaded OpenBLAS at once would queue on the same workers. So OpenBLAS
// always runs on the calling thread, and the kernels split GEMMs themselves: per image inside
// convolutions, by blocks of the output in gemm_parallel.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "tandem/error.h"
#include "tandem/tensor.h"

namespace tandem::backend::cpu {

/// Elements below which a memory-bound loop stays on one thread (waking a thread costs microseconds).
inline constexpr int64_t kParallelElems = 32768;
/// Floating-point operations below which a GEMM is not split across threads.
inline constexpr double kParallelFlops = 4.0e6;

/// Items per parallel range for a loop whose items each touch `work` elements: two ranges reach
/// kParallelElems, below which the loop stays on one thread.
inline int64_t grain_for(int64_t work) { return std::max<int64_t>(1, kParallelElems / 2 / std::max<int64_t>(work, 1)); }

/// Threads the kernels may use: tandem::num_threads().
inline int max_threads() { return std::max(1, omp_get_max_threads()); }

using TaskFn = void (*)(void* ctx, int64_t task, int slot);

/// Runs fn(ctx, task, slot) for every task in [0, count) on up to `threads` threads, the caller
/// included. slot in [0, threads) names the thread running the task (for per-thread scratch). Tasks
/// are handed out one at a time; returns when all have run, rethrowing the first exception.
/// Nested calls, and calls while another host thread uses the pool, run on the calling thread.
void parallel_tasks(int64_t count, int threads, TaskFn fn, void* ctx);

/// parallel_tasks with a callable f(task, slot).
template <typename F>
void parallel_tasks(int64_t count, int threads, F&& f) {
  using Fn = std::remove_reference_t<F>;
  parallel_tasks(count, threads, [](void* ctx, int64_t task, int slot) { (*static_cast<Fn*>(ctx))(task, slot); },
                 const_cast<void*>(static_cast<const void*>(&f)));
}

/// The [lo, hi) share of [0, n) that part t of parts gets in an even split.
inline void part_range(int64_t n, int64_t t, int64_t parts, int64_t& lo, int64_t& hi) {
  const int64_t base = n / parts, extra = n % parts;
  lo = t * base + std::min(t, extra);
  hi = lo + base + (t < extra ? 1 : 0);
}

/// Runs body(lo, hi) over consecutive ranges covering [0, n), in parallel when there are at least
/// two ranges of `grain` elements. Ranges are several per thread, so a thread slowed by other load
/// on the machine leaves its share to the others.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& body) {
  const int threads = max_threads();
  grain = std::max<int64_t>(grain, 1);
  if (threads <= 1 || n < 2 * grain) {
    if (n > 0) body(int64_t(0), n);
    return;
  }
  const int64_t parts = std::min<int64_t>(n / grain, 4 * threads);
  parallel_tasks(parts, threads, [&](int64_t t, int) {
    int64_t lo, hi;
    part_range(n, t, parts, lo, hi);
    body(lo, hi);
  });
}

/// Pins OpenBLAS to the calling thread; call before any BLAS call, outside parallel tasks.
void ensure_blas_serial();

/// Throws when a GEMM extent does not fit the 32-bit BLAS interface.
void check_blas_extent(int64_t v, const char* what);

/// One row-major GEMM on the calling thread: c = alpha * op(a) op(b) + beta * c.
template <typename T>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc);

/// The same GEMM split across the threads by blocks of rows or columns of c.
template <typename T>
void gemm_parallel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                   int64_t ldb, T beta, T* c, int64_t ldc);

/// The sum of x[i] y[i] over n elements (f32 summed in float lanes by blocks, the blocks in double), split over
/// the threads for long vectors; the same value whatever the thread count.
template <typename T>
double dot(const T* x, const T* y, int64_t n);

/// Threads worth using for an m x n x k product (kParallelFlops each), at most max_threads().
int gemm_threads(int64_t m, int64_t n, int64_t k);

/// An uninitialised CPU scratch buffer of n elements of T, recycled by the caching allocator.
template <typename T>
Tensor scratch(int64_t n) {
  return Tensor::empty({n}, dtype_of<T>());
}

}  // namespace tandem::backend::cpu
