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
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend::chan {

using kern::aligned16;
using kern::FastDiv;
using kern::load_pack;
using kern::Pack;
using kern::pack_width;
using kern::store_pack;

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

/// Whether packs of V elements never straddle two channels' runs: consecutive channels (rows whose width
/// is a multiple of V) or one channel (planes whose size is a multiple of V).
inline bool packable(const Layout& l, int v) { return l.rows ? l.c % v == 0 : l.s % v == 0; }

/// Per-channel values (N of them) for a pack of V elements, in float.
template <int V, int N>
struct Coef {
  float v[N][V];
};

/// The values of src[j][channel] for the pack's channels ch0 + u * STEP (STEP 0: one channel, loaded once).
template <int V, int STEP, int N, typename P, typename I>
__device__ __forceinline__ Coef<V, N> load_coef(I ch0, const P* const (&src)[N]) {
  Coef<V, N> k;
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int u = 0; u < V; ++u) k.v[j][u] = STEP == 0 && u > 0 ? k.v[j][0] : kern::to_float(src[j][ch0 + u * STEP]);
  return k;
}

// Maps. An op gives coef<V, STEP>(ch0): its per-channel values for the V elements of a pack (channels
// ch0 + u * STEP), and apply<V>(i0, coef) for elements i0 .. i0 + V - 1. Rows keep each thread on fixed
// channels (values loaded once per thread); planes load them once per pack (one channel per pack).
template <int V, typename I, typename Op>
__global__ void rows_map_kernel(I m, I c, Op op) {
  const I ch0 = (static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (ch0 >= c) return;
  const auto k = op.template coef<V, 1>(ch0);
  for (I r = static_cast<I>(blockIdx.y) * blockDim.y + threadIdx.y; r < m; r += static_cast<I>(gridDim.y) * blockDim.y)
    op.template apply<V>(r * c + ch0, k);
}

template <int V, typename I, typename ChanOf, typename Op>
__global__ void planes_map_kernel(I packs, ChanOf chan_of, Op op) {
  for (I p = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += static_cast<I>(blockDim.x) * gridDim.x) {
    const I i0 = p * V;
    op.template apply<V>(i0, op.template coef<V, 0>(static_cast<I>(chan_of(i0))));
  }
}

/// The smallest power of two at least n, capped at cap (a power of two).
inline int64_t pow2_at_least(int64_t n, int64_t cap) {
  int64_t p = 1;
  while (p < n && p < cap) p *= 2;
  return p;
}

/// Launches a per-element map over the layout on stream (16-byte accesses when the pointers and the
/// layout allow, else one element at a time).
template <typename T, typename Op>
void map(const Layout& l, cudaStream_t stream, Op op, std::initializer_list<const void*> ptrs) {
  if (l.total() == 0) return;
  constexpr int W = pack_width<T>();
  const bool wide = W > 1 && aligned16(ptrs) && packable(l, W);
  auto launch = [&](auto vtag) {
    constexpr int V = decltype(vtag)::value;
    if (l.rows) {
      const int64_t m = l.n * l.s, cpacks = l.c / V;
      const int64_t tx = pow2_at_least(cpacks, 32), ty = kern::kBlock / tx;
      const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
      const dim3 grid(static_cast<unsigned>((cpacks + tx - 1) / tx),
                      static_cast<unsigned>(std::clamp<int64_t>((m + 2 * ty - 1) / (2 * ty), 1, 65535)));
      if (l.small())
        rows_map_kernel<V, uint32_t><<<grid, block, 0, stream>>>(static_cast<uint32_t>(m),
                                                                static_cast<uint32_t>(l.c), op);
      else
        rows_map_kernel<V, int64_t><<<grid, block, 0, stream>>>(m, l.c, op);
      return;
    }
    with_channel_of(l, [&](auto chan_of, auto itag) {
      using I = decltype(itag);
      const I packs = static_cast<I>(l.total() / V);
      planes_map_kernel<V, I><<<kern::blocks_for(packs), kern::kBlock, 0, stream>>>(packs, chan_of, op);
    });
  };
  if (wide)
    launch(std::integral_constant<int, W>{});
  else
    launch(std::integral_constant<int, 1>{});
  TANDEM_CUDA_LAUNCH_CHECK("channel map kernel");
}

// Reductions. An elem gives load<V>(offset): the packs it reads at offset, and add<V>(offset, loaded,
// sums): their contributions to K sums for each of the V elements (it may also write outputs). Each
// thread loads four packs before adding any, so that enough reads are in flight to keep memory busy.
constexpr int kReduceThreads = 256;
constexpr int kSplitGroup = 16;  // splits whose partials one block totals before the channel's last block

// Sums rows [r0, r1) of a [rows][K][c] array of partials for channels [first, first + count) with the
// whole block and calls out(channel, totals) once per channel. Lanes of a group add every lanes-th row
// (four accumulators, combined in a fixed order) and are combined by a fixed shuffle tree: the same
// order on every run. Every thread of the block (a multiple of 32) must call it.
template <int K, typename Out>
__device__ __forceinline__ void sum_partials(const double* src, int r0, int r1, int64_t c, int64_t first,
                                             int64_t count, const Out& out) {
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  int lanes = 1;  // lanes per channel: a power of two up to 32, as many as the block's threads allow
  while (lanes < 32 && lanes * 2 * count <= nthreads) lanes *= 2;
  const int groups = nthreads / lanes;
  for (int64_t base = 0; base < count; base += groups) {  // uniform over the block: every lane shuffles
    const int64_t idx = base + tid / lanes;
    const int lane = tid % lanes;
    const bool valid = tid < groups * lanes && idx < count;
    const int64_t ch = first + idx;
    double tot[K] = {};
    if (valid) {
      double a[4][K] = {};
      int r = r0 + lane;
      for (; r + 3 * lanes < r1; r += 4 * lanes)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int k = 0; k < K; ++k) a[j][k] += __ldcg(src + (int64_t(r + j * lanes) * K + k) * c + ch);
      for (; r < r1; r += lanes)
#pragma unroll
        for (int k = 0; k < K; ++k) a[0][k] += __ldcg(src + (int64_t(r) * K + k) * c + ch);
#pragma unroll
      for (int k = 0; k < K; ++k) tot[k] = (a[0][k] + a[1][k]) + (a[2][k] + a[3][k]);
    }
    for (int off = lanes / 2; off > 0; off /= 2)
#pragma unroll
      for (int k = 0; k < K; ++k) tot[k] += __shfl_down_sync(0xffffffffu, tot[k], off, lanes);
    if (valid && lane == 0) out(ch, tot);
  }
}

// Called by every thread of a block once the block's partial sums (split blockIdx.y of column group
// blockIdx.x, channels [first, first + count)) are in partial[split][K][c]. The last block of each group
// of kSplitGroup splits totals the group into a second-level row (after the splits' rows); the last of
// those totals the groups and calls finish(channel, totals). counters: gridDim.x column counters, then
// gridDim.x * groups group counters, each left zero for the next launch.
template <int K, typename Finish>
__device__ __forceinline__ void complete(double* partial, unsigned* counters, int64_t c, int64_t first, int64_t count,
                                         const Finish& finish) {
  __shared__ bool last;
  const int splits = gridDim.y, split = blockIdx.y, col = blockIdx.x;
  const int groups = (splits + kSplitGroup - 1) / kSplitGroup;
  const bool lead = threadIdx.x == 0 && threadIdx.y == 0;
  __threadfence();
  __syncthreads();
  if (groups > 1) {
    double* level2 = partial + int64_t(splits) * K * c;
    const int g = split / kSplitGroup, g0 = g * kSplitGroup, g1 = min(splits, g0 + kSplitGroup);
    unsigned* gc = counters + gridDim.x + int64_t(col) * groups + g;
    if (lead) last = atomicAdd(gc, 1u) == unsigned(g1 - g0 - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    sum_partials<K>(partial, g0, g1, c, first, count, [&](int64_t ch, const double (&t)[K]) {
      for (int k = 0; k < K; ++k) level2[(int64_t(g) * K + k) * c + ch] = t[k];
    });
    if (lead) *gc = 0;
    __threadfence();
    __syncthreads();
    if (lead) last = atomicAdd(&counters[col], 1u) == unsigned(groups - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    sum_partials<K>(level2, 0, groups, c, first, count, finish);
  } else {
    if (lead) last = atomicAdd(&counters[col], 1u) == unsigned(splits - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    sum_partials<K>(partial, 0, splits, c, first, count, finish);
  }
  if (lead) counters[col] = 0;  // ready for the next launch
}

// Adds the contributions of every stride-th unit from u to the end (n units; unit j at offset_of(j)):
// four packs loaded before any is added.
template <int K, int V, typename I, typename Elem, typename OffsetOf>
__device__ __forceinline__ void accumulate(const Elem& elem, I u, I n, I stride, const OffsetOf& offset_of,
                                           double (&acc)[K][V]) {
  for (; u + 3 * stride < n; u += 4 * stride) {
    const I o0 = offset_of(u), o1 = offset_of(u + stride), o2 = offset_of(u + 2 * stride),
            o3 = offset_of(u + 3 * stride);
    const auto l0 = elem.template load<V>(o0);
    const auto l1 = elem.template load<V>(o1);
    const auto l2 = elem.template load<V>(o2);
    const auto l3 = elem.template load<V>(o3);
    elem.template add<V>(o0, l0, acc);
    elem.template add<V>(o1, l1, acc);
    elem.template add<V>(o2, l2, acc);
    elem.template add<V>(o3, l3, acc);
  }
  for (; u < n; u += stride) {
    const I o = offset_of(u);
    elem.template add<V>(o, elem.template load<V>(o), acc);
  }
}

// Rows: thread (x, y) owns V consecutive channels; the block's y threads (a power of two) and the grid's
// second dimension split the rows. The block's thread rows are summed by a fixed tree in shared memory.
template <int K, int V, typename I, typename Elem, typename Finish>
__global__ void rows_reduce_kernel(I m, I c, Elem elem, Finish finish, double* partial, unsigned* counters) {
  extern __shared__ double sh[];  // [blockDim.y][blockDim.x][K * V]
  const I ch0 = (static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  double acc[K][V] = {};
  if (ch0 < c)
    accumulate<K, V>(elem, static_cast<I>(blockIdx.y) * blockDim.y + threadIdx.y, m,
                     static_cast<I>(gridDim.y) * blockDim.y, [c, ch0](I r) { return r * c + ch0; }, acc);
  constexpr int KV = K * V;
  double* mine = sh + (threadIdx.y * blockDim.x + threadIdx.x) * KV;
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int u = 0; u < V; ++u) mine[k * V + u] = acc[k][u];
  for (unsigned half = blockDim.y / 2; half > 0; half /= 2) {
    __syncthreads();
    if (threadIdx.y < half)
      for (int e = 0; e < KV; ++e) mine[e] += mine[half * blockDim.x * KV + e];
  }
  __syncthreads();
  const I first = static_cast<I>(blockIdx.x) * blockDim.x * V;
  const I count = (first + blockDim.x * V < c ? first + blockDim.x * V : c) - first;
  // The block's totals, one (sum, channel) per thread: sh[0][x][k * V + u] is channel first + x * V + u.
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int e = tid; e < count * K; e += blockDim.x * blockDim.y) {
    const int k = e / count, idx = e % count;
    partial[(int64_t(blockIdx.y) * K + k) * c + first + idx] = sh[(idx / V) * KV + k * V + idx % V];
  }
  complete<K>(partial, counters, c, first, count, finish);
}

// Planes: a column of blocks per channel, split over the grid's second dimension; each thread takes
// packs of V elements within one plane (the plane size a multiple of V).
template <int K, int V, typename I, typename Elem, typename Finish>
__global__ void planes_reduce_kernel(I n, I c, FastDiv packs_div, I s, Elem elem, Finish finish, double* partial,
                                     unsigned* counters) {
  __shared__ double scratch[32];
  const I ch = blockIdx.x, plane_packs = s / V, packs = n * plane_packs;
  double acc[K][V] = {};
  accumulate<K, V>(elem, static_cast<I>(blockIdx.y) * blockDim.x + threadIdx.x, packs,
                   static_cast<I>(gridDim.y) * blockDim.x,
                   [=](I j) {
                     I img;
                     if constexpr (sizeof(I) == 4)
                       img = packs_div.div(j);
                     else
                       img = j / plane_packs;
                     return (img * c + ch) * s + (j - img * plane_packs) * V;
                   },
                   acc);
  for (int k = 0; k < K; ++k) {
    double t = 0.0;
    for (int u = 0; u < V; ++u) t += acc[k][u];
    t = kern::block_sum(t, scratch);
    if (threadIdx.x == 0) partial[(int64_t(blockIdx.y) * K + k) * c + ch] = t;
  }
  complete<K>(partial, counters, c, ch, 1, finish);
}

/// Per-device state of the reductions: completion counters, kept zero between launches.
unsigned* reduce_counters(CudaBackend& be, int device, int64_t needed);

/// Reduces K sums per channel over a layout of T elements (see accumulate for elem), then calls
/// finish(channel, const double (&totals)[K]) once per channel; both are device functors; ptrs are the
/// tensors elem touches (16-byte accesses need them aligned).
template <int K, typename T, typename Elem, typename Finish>
void reduce(CudaBackend& be, int device, const Layout& l, Elem elem, Finish finish,
            std::initializer_list<const void*> ptrs) {
  if (l.c == 0) return;
  DeviceState& st = be.state(device);
  constexpr int W = pack_width<T>();
  const bool wide = W > 1 && aligned16(ptrs) && packable(l, W);
  const int64_t m = l.n * l.s;
  // One wave of blocks fills the GPU; a block takes at least 8 rows (packs) per thread.
  const int64_t target_blocks = int64_t(st.sm_count > 0 ? st.sm_count : 80) * 4;
  auto scratch_for = [&](int64_t cols, int64_t splits, unsigned** counters) {
    const int64_t groups = (splits + kSplitGroup - 1) / kSplitGroup;
    *counters = reduce_counters(be, device, cols * (1 + (groups > 1 ? groups : 0)));
    return Scratch(be.allocator(device), static_cast<size_t>((splits + (groups > 1 ? groups : 0)) * K * l.c) *
                                             sizeof(double));
  };
  auto launch = [&](auto vtag) {
    constexpr int V = decltype(vtag)::value;
    if (l.rows) {
      const int64_t cpacks = l.c / V;
      // Up to 8 threads across (128-byte rows for 16-byte packs): narrow column groups keep the
      // partials of each group few, and many groups total them at once.
      const int64_t tx = pow2_at_least(cpacks, 8), ty = kReduceThreads / tx;
      const int64_t cols = (cpacks + tx - 1) / tx;
      const int64_t splits = std::clamp<int64_t>(
          std::min((m + 8 * ty - 1) / (8 * ty), (target_blocks + cols - 1) / cols), 1, 65535);
      unsigned* counters = nullptr;
      Scratch partial = scratch_for(cols, splits, &counters);
      const dim3 grid(static_cast<unsigned>(cols), static_cast<unsigned>(splits));
      const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
      const size_t shared = static_cast<size_t>(kReduceThreads * K * V) * sizeof(double);
      if (l.small())
        rows_reduce_kernel<K, V, uint32_t><<<grid, block, shared, st.stream>>>(
            static_cast<uint32_t>(m), static_cast<uint32_t>(l.c), elem, finish, partial.as<double>(), counters);
      else
        rows_reduce_kernel<K, V, int64_t><<<grid, block, shared, st.stream>>>(m, l.c, elem, finish,
                                                                               partial.as<double>(), counters);
      TANDEM_CUDA_LAUNCH_CHECK("rows_reduce_kernel");
      return;
    }
    TANDEM_CHECK(l.c <= INT_MAX, "per-channel reduction over ", l.c, " channels");
    const int64_t packs = m / V;
    const int64_t splits = std::clamp<int64_t>(
        std::min((packs + 8 * kReduceThreads - 1) / (8 * kReduceThreads), (target_blocks + l.c - 1) / l.c), 1,
        65535);
    unsigned* counters = nullptr;
    Scratch partial = scratch_for(l.c, splits, &counters);
    const dim3 grid(static_cast<unsigned>(l.c), static_cast<unsigned>(splits));
    if (l.small())
      planes_reduce_kernel<K, V, uint32_t><<<grid, kReduceThreads, 0, st.stream>>>(
          static_cast<uint32_t>(l.n), static_cast<uint32_t>(l.c),
          FastDiv(static_cast<uint32_t>(std::max<int64_t>(l.s / V, 1))), static_cast<uint32_t>(l.s), elem, finish,
          partial.as<double>(), counters);
    else
      planes_reduce_kernel<K, V, int64_t><<<grid, kReduceThreads, 0, st.stream>>>(
          l.n, l.c, FastDiv(), l.s, elem, finish, partial.as<double>(), counters);
    TANDEM_CUDA_LAUNCH_CHECK("planes_reduce_kernel");
  };
  if (wide)
    launch(std::integral_constant<int, W>{});
  else
    launch(std::integral_constant<int, 1>{});
}

}  // namespace tandem::backend::chan
