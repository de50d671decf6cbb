#pragma once
// Internal: per-channel reductions and per-channel elementwise maps over activations stored as planes
// ([n, c, s], NCHW with s = h * w) or rows ([m, c], channels last or 2-D: channel fastest). Bias
// gradients and batch normalisation are built from these.
//
// A reduction splits each channel over several blocks so that any shape fills the GPU; every block
// leaves its partial sums (double) in a workspace, and the last block to finish a channel adds the
// partials in a fixed order and hands the totals to a finish step: one launch, deterministic results,
// no host synchronisation. Index arithmetic is 32-bit (with multiply-shift division) when the tensor
// has fewer than 2^31 elements.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend::chan {

/// Division of unsigned 32-bit values below 2^31 by a fixed divisor through a multiply and a shift.
struct FastDiv {
  uint32_t divisor = 1, magic = 1, shift = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint32_t(1) << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, magic);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t(n) * magic) >> 32);
#endif
    return (t + n) >> shift;
  }
  __host__ __device__ __forceinline__ uint32_t mod(uint32_t n) const { return n - div(n) * divisor; }
};

/// How an activation is laid out per channel.
struct Layout {
  int64_t n, c, s;  // planes: [n, c, s]; rows: n * s rows of c channels
  bool rows;
  int64_t total() const { return n * c * s; }
  bool small() const { return total() < (int64_t(INT_MAX) >> 1); }  // 32-bit indices with room for a stride
};

/// Layout of an [n, c, h, w] (or [n, c]) tensor viewed as [n, c, s]; channels-last storage gives rows.
inline Layout layout_of(int64_t n, int64_t c, int64_t s, bool channels_last) {
  return {n, c, s, channels_last || s == 1};
}

/// The channel of flat element i (32-bit form).
template <bool ROWS>
struct ChannelOf32 {
  FastDiv s, c;
  __device__ __forceinline__ uint32_t operator()(uint32_t i) const { return ROWS ? c.mod(i) : c.mod(s.div(i)); }
};
/// The channel of flat element i (64-bit form).
template <bool ROWS>
struct ChannelOf64 {
  int64_t s, c;
  __device__ __forceinline__ int64_t operator()(int64_t i) const { return ROWS ? i % c : (i / s) % c; }
};

/// Calls f(channel_of, index tag) with the fastest channel-of functor the layout allows.
template <typename F>
void with_channel_of(const Layout& l, F&& f) {
  if (l.small()) {
    const FastDiv s(static_cast<uint32_t>(std::max<int64_t>(l.s, 1))), c(static_cast<uint32_t>(std::max<int64_t>(l.c, 1)));
    if (l.rows)
      f(ChannelOf32<true>{s, c}, uint32_t{});
    else
      f(ChannelOf32<false>{s, c}, uint32_t{});
  } else {
    if (l.rows)
      f(ChannelOf64<true>{l.s, l.c}, int64_t{});
    else
      f(ChannelOf64<false>{l.s, l.c}, int64_t{});
  }
}

/// Runs op(i, channel) for every element: the map behind bias addition and the normalisation step.
template <typename I, typename ChanOf, typename Op>
__global__ void map_kernel(I total, ChanOf chan_of, Op op) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(blockDim.x) * gridDim.x)
    op(i, chan_of(i));
}

/// Launches op(i, channel) over every element of the layout on stream.
template <typename Op>
void map(const Layout& l, cudaStream_t stream, Op op) {
  if (l.total() == 0) return;
  with_channel_of(l, [&](auto chan_of, auto itag) {
    using I = decltype(itag);
    map_kernel<I><<<kern::blocks_for(l.total()), kern::kBlock, 0, stream>>>(static_cast<I>(l.total()), chan_of, op);
  });
  TANDEM_CUDA_LAUNCH_CHECK("channel map_kernel");
}

constexpr int kRowThreads = 16;   // rows reduced in parallel by a rows block (32 channels wide)
constexpr int kPlaneThreads = 256;

// Adds a block's partials of K sums for one channel into the workspace; the last block of the channel
// (counted in counters[slot]) totals them in split order and calls finish. Returns nothing; every
// thread must call it.
template <int K, typename Finish>
__device__ __forceinline__ void complete(double* partial, unsigned* counters, int64_t slot, int64_t c,
                                         bool writer, int64_t ch, const double (&sums)[K], bool finisher,
                                         Finish& finish) {
  __shared__ bool last;
  const int splits = gridDim.y;
  if (writer)
    for (int k = 0; k < K; ++k) partial[(int64_t(blockIdx.y) * K + k) * c + ch] = sums[k];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(&counters[slot], 1u) == unsigned(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (finisher) {
    double tot[K] = {};
    const volatile double* p = partial;
    for (int sp = 0; sp < splits; ++sp)
      for (int k = 0; k < K; ++k) tot[k] += p[(int64_t(sp) * K + k) * c + ch];
    finish(ch, tot);
  }
  if (threadIdx.x == 0 && threadIdx.y == 0) counters[slot] = 0;  // ready for the next launch
}

// Rows: a block covers 32 channels; its kRowThreads thread rows and the grid's second dimension split
// the rows. elem(offset, channel, sums) adds element `offset`'s contributions (and may write outputs).
template <int K, typename I, typename Elem, typename Finish>
__global__ void rows_reduce_kernel(I m, I c, Elem elem, Finish finish, double* partial, unsigned* counters) {
  __shared__ double sh[K][kRowThreads][33];
  const I ch = static_cast<I>(blockIdx.x) * 32 + threadIdx.x;
  double acc[K] = {};
  if (ch < c)
    for (I r = static_cast<I>(blockIdx.y) * kRowThreads + threadIdx.y; r < m;
         r += static_cast<I>(gridDim.y) * kRowThreads)
      elem(r * c + ch, ch, acc);
  for (int k = 0; k < K; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  double tot[K] = {};
  if (threadIdx.y == 0)
    for (int t = 0; t < kRowThreads; ++t)
      for (int k = 0; k < K; ++k) tot[k] += sh[k][t][threadIdx.x];
  const bool mine = threadIdx.y == 0 && ch < c;
  complete<K>(partial, counters, blockIdx.x, c, mine, ch, tot, mine, finish);
}

// Planes: a block (x) per channel, split over the grid's second dimension.
template <int K, typename I, typename Elem, typename Finish>
__global__ void planes_reduce_kernel(I n, I c, FastDiv s_div, I s, Elem elem, Finish finish, double* partial,
                                     unsigned* counters) {
  __shared__ double scratch[32];
  const I ch = blockIdx.x, per = n * s;
  double acc[K] = {};
  for (I j = static_cast<I>(blockIdx.y) * kPlaneThreads + threadIdx.x; j < per;
       j += static_cast<I>(gridDim.y) * kPlaneThreads) {
    I img, t;
    if constexpr (sizeof(I) == 4) {
      img = s_div.div(j);
      t = j - img * s;
    } else {
      img = j / s;
      t = j - img * s;
    }
    elem((img * c + ch) * s + t, ch, acc);
  }
  double tot[K];
  for (int k = 0; k < K; ++k) tot[k] = kern::block_sum(acc[k], scratch);
  complete<K>(partial, counters, ch, c, threadIdx.x == 0, ch, tot, threadIdx.x == 0, finish);
}

/// Per-device state of the reductions: completion counters, kept zero between launches.
unsigned* reduce_counters(CudaBackend& be, int device, int64_t needed);

/// Reduces K sums per channel over the layout: elem(offset, channel, double (&sums)[K]) per element,
/// then finish(channel, const double (&totals)[K]) once per channel. Both are device functors.
template <int K, typename Elem, typename Finish>
void reduce(CudaBackend& be, int device, const Layout& l, Elem elem, Finish finish) {
  if (l.c == 0) return;
  DeviceState& st = be.state(device);
  const int64_t m = l.n * l.s;
  const int64_t target_blocks = int64_t(st.sm_count > 0 ? st.sm_count : 80) * 4;
  if (l.rows) {
    const int64_t col_blocks = (l.c + 31) / 32;
    const int64_t splits = std::clamp<int64_t>(std::min((m + 8 * kRowThreads - 1) / (8 * kRowThreads),
                                                        (target_blocks + col_blocks - 1) / col_blocks),
                                               1, 65535);
    unsigned* counters = reduce_counters(be, device, col_blocks);
    Scratch partial(be.allocator(device), static_cast<size_t>(splits * K * l.c) * sizeof(double));
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
    const dim3 block(32, kRowThreads);
    if (l.small())
      rows_reduce_kernel<K, uint32_t><<<grid, block, 0, st.stream>>>(static_cast<uint32_t>(m),
                                                                      static_cast<uint32_t>(l.c), elem, finish,
                                                                      partial.as<double>(), counters);
    else
      rows_reduce_kernel<K, int64_t><<<grid, block, 0, st.stream>>>(m, l.c, elem, finish, partial.as<double>(),
                                                                     counters);
    TANDEM_CUDA_LAUNCH_CHECK("rows_reduce_kernel");
    return;
  }
  TANDEM_CHECK(l.c <= INT_MAX, "per-channel reduction over ", l.c, " channels");
  const int64_t splits = std::clamp<int64_t>(std::min((m + 4 * kPlaneThreads - 1) / (4 * kPlaneThreads),
                                                      (target_blocks + l.c - 1) / l.c),
                                             1, 65535);
  unsigned* counters = reduce_counters(be, device, l.c);
  Scratch partial(be.allocator(device), static_cast<size_t>(splits * K * l.c) * sizeof(double));
  const dim3 grid(static_cast<unsigned>(l.c), static_cast<unsigned>(splits));
  if (l.small())
    planes_reduce_kernel<K, uint32_t><<<grid, kPlaneThreads, 0, st.stream>>>(
        static_cast<uint32_t>(l.n), static_cast<uint32_t>(l.c), FastDiv(static_cast<uint32_t>(std::max<int64_t>(l.s, 1))),
        static_cast<uint32_t>(l.s), elem, finish, partial.as<double>(), counters);
  else
    planes_reduce_kernel<K, int64_t><<<grid, kPlaneThreads, 0, st.stream>>>(l.n, l.c, FastDiv(), l.s, elem, finish,
                                                                             partial.as<double>(), counters);
  TANDEM_CUDA_LAUNCH_CHECK("planes_reduce_kernel");
}

}  // namespace tandem::backend::chan
