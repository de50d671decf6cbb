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

/// V elements moved by one 16-byte (or narrower) load or store.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, typename T, typename I>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, I i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}

template <int V, typename T, typename I>
__device__ __forceinline__ void store_pack(T* p, I i, const Pack<T, V>& x) {
  *reinterpret_cast<Pack<T, V>*>(p + i) = x;
}

/// How many elements of T one 16-byte access moves.
template <typename T>
constexpr int pack_width() {
  return static_cast<int>(16 / sizeof(T));
}

/// True when every pointer (null ones aside) allows 16-byte accesses.
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

/// Whether packs of V elements never straddle two channels' runs: consecutive channels (rows whose width
/// is a multiple of V) or one channel (planes whose size is a multiple of V).
inline bool packable(const Layout& l, int v) { return l.rows ? l.c % v == 0 : l.s % v == 0; }

// op.apply<V>(i0, ch0, step) handles elements i0 .. i0 + V - 1, element u of channel ch0 + u * step.
template <int V, typename I, typename ChanOf, typename Op>
__global__ void map_kernel(I packs, ChanOf chan_of, I step, Op op) {
  for (I p = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += static_cast<I>(blockDim.x) * gridDim.x) {
    const I i0 = p * V;
    op.template apply<V>(i0, static_cast<I>(chan_of(i0)), step);
  }
}

/// Launches a per-element map over the layout on stream: op.apply<V>(i0, ch0, step) for packs of V
/// elements of T (16-byte accesses when the pointers and the layout allow, else one element at a time).
template <typename T, typename Op>
void map(const Layout& l, cudaStream_t stream, Op op, std::initializer_list<const void*> ptrs) {
  if (l.total() == 0) return;
  constexpr int V = pack_width<T>();
  const bool wide = V > 1 && aligned16(ptrs) && packable(l, V);
  with_channel_of(l, [&](auto chan_of, auto itag) {
    using I = decltype(itag);
    const I step = l.rows ? 1 : 0;
    if (wide) {
      const I packs = static_cast<I>(l.total() / V);
      map_kernel<V, I><<<kern::blocks_for(packs), kern::kBlock, 0, stream>>>(packs, chan_of, step, op);
    } else {
      const I packs = static_cast<I>(l.total());
      map_kernel<1, I><<<kern::blocks_for(packs), kern::kBlock, 0, stream>>>(packs, chan_of, step, op);
    }
  });
  TANDEM_CUDA_LAUNCH_CHECK("channel map_kernel");
}

constexpr int kReduceThreads = 512;

// Writes a block's partial sums (K per channel, V channels from ch0; `mine` for threads that own
// channels) into the workspace; the last block of the group (counted in counters[slot]) totals the
// partials of the group's channels [first, first + count) and calls finish(channel, totals) for each.
// The totals are formed by groups of lanes, each lane adding every G-th split in order and the lanes
// combined by a fixed shuffle tree: the same order on every run. Every thread of the block must call it.
template <int K, int V, typename Finish>
__device__ __forceinline__ void complete(double* partial, unsigned* counters, int64_t slot, int64_t c, int64_t ch0,
                                         bool mine, const double (&sums)[K][V], int64_t first, int64_t count,
                                         const Finish& finish) {
  __shared__ bool last;
  const int splits = gridDim.y;
  if (mine)
    for (int k = 0; k < K; ++k)
      for (int u = 0; u < V; ++u) partial[(int64_t(blockIdx.y) * K + k) * c + ch0 + u] = sums[k][u];
  __threadfence();
  __syncthreads();
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  if (tid == 0) last = atomicAdd(&counters[slot], 1u) == unsigned(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Lanes per channel: a power of two up to 32, as many as the block's threads allow.
  int lanes = 1;
  while (lanes < 32 && lanes * 2 * count <= nthreads) lanes *= 2;
  const int groups = nthreads / lanes;
  for (int64_t base = 0; base < count; base += groups) {  // uniform over the block: every lane shuffles
    const int64_t idx = base + tid / lanes;
    const int lane = tid % lanes;
    const bool valid = tid < groups * lanes && idx < count;
    const int64_t ch = first + idx;
    double tot[K] = {};
    if (valid)
      for (int sp = lane; sp < splits; sp += lanes)
        for (int k = 0; k < K; ++k) tot[k] += __ldcg(partial + (int64_t(sp) * K + k) * c + ch);
    for (int off = lanes / 2; off > 0; off /= 2)
      for (int k = 0; k < K; ++k) tot[k] += __shfl_down_sync(0xffffffffu, tot[k], off, lanes);
    if (valid && lane == 0) finish(ch, tot);
  }
  if (tid == 0) counters[slot] = 0;  // ready for the next launch
}

// Rows: thread (x, y) owns V consecutive channels; the block's y threads and the grid's second
// dimension split the rows. elem.add<V>(offset, sums) adds the contributions of the V elements from
// `offset` (and may write outputs).
template <int K, int V, typename I, typename Elem, typename Finish>
__global__ void rows_reduce_kernel(I m, I c, Elem elem, Finish finish, double* partial, unsigned* counters) {
  extern __shared__ double sh[];  // one value per thread
  const I ch0 = (static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  double acc[K][V] = {};
  if (ch0 < c)
    for (I r = static_cast<I>(blockIdx.y) * blockDim.y + threadIdx.y; r < m;
         r += static_cast<I>(gridDim.y) * blockDim.y)
      elem.template add<V>(r * c + ch0, acc);
  // Sum over the block's thread rows, in order, one (sum, channel) at a time.
  double tot[K][V];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int k = 0; k < K; ++k)
    for (int u = 0; u < V; ++u) {
      sh[tid] = acc[k][u];
      __syncthreads();
      double t = 0.0;
      if (threadIdx.y == 0)
        for (unsigned y = 0; y < blockDim.y; ++y) t += sh[y * blockDim.x + threadIdx.x];
      tot[k][u] = t;
      __syncthreads();
    }
  const I first = static_cast<I>(blockIdx.x) * blockDim.x * V;
  const I count = (first + blockDim.x * V < c ? first + blockDim.x * V : c) - first;
  complete<K, V>(partial, counters, blockIdx.x, c, ch0, threadIdx.y == 0 && ch0 < c, tot, first, count, finish);
}

// Planes: a block (x) per channel, split over the grid's second dimension; each thread takes packs of
// V elements within one plane (the plane size a multiple of V).
template <int K, int V, typename I, typename Elem, typename Finish>
__global__ void planes_reduce_kernel(I n, I c, FastDiv packs_div, I s, Elem elem, Finish finish, double* partial,
                                     unsigned* counters) {
  __shared__ double scratch[32];
  const I ch = blockIdx.x, plane_packs = s / V, packs = n * plane_packs;
  double acc[K][V] = {};
  for (I j = static_cast<I>(blockIdx.y) * blockDim.x + threadIdx.x; j < packs;
       j += static_cast<I>(gridDim.y) * blockDim.x) {
    I img;
    if constexpr (sizeof(I) == 4)
      img = packs_div.div(j);
    else
      img = j / plane_packs;
    elem.template add<V>((img * c + ch) * s + (j - img * plane_packs) * V, acc);
  }
  double tot[K][1];
  for (int k = 0; k < K; ++k) {
    double t = 0.0;
    for (int u = 0; u < V; ++u) t += acc[k][u];
    tot[k][0] = kern::block_sum(t, scratch);
  }
  complete<K, 1>(partial, counters, ch, c, ch, threadIdx.x == 0, tot, ch, 1, finish);
}

/// Per-device state of the reductions: completion counters, kept zero between launches.
unsigned* reduce_counters(CudaBackend& be, int device, int64_t needed);

/// Reduces K sums per channel over a layout of T elements: elem.add<V>(offset, double (&sums)[K][V]) per
/// pack of V elements, then finish(channel, const double (&totals)[K]) once per channel. Both are
/// device functors; ptrs are the tensors elem touches (16-byte accesses need them aligned).
template <int K, typename T, typename Elem, typename Finish>
void reduce(CudaBackend& be, int device, const Layout& l, Elem elem, Finish finish,
            std::initializer_list<const void*> ptrs) {
  if (l.c == 0) return;
  DeviceState& st = be.state(device);
  constexpr int W = pack_width<T>();
  const bool wide = W > 1 && aligned16(ptrs) && packable(l, W);
  const int64_t m = l.n * l.s;
  const int64_t target_blocks = int64_t(st.sm_count > 0 ? st.sm_count : 80) * 4;
  auto launch = [&](auto vtag) {
    constexpr int V = decltype(vtag)::value;
    if (l.rows) {
      const int64_t cpacks = l.c / V;
      const int64_t tx = std::min<int64_t>(32, cpacks), ty = kReduceThreads / tx;
      const int64_t col_blocks = (cpacks + tx - 1) / tx;
      const int64_t splits =
          std::clamp<int64_t>(std::min((m + 4 * ty - 1) / (4 * ty), (target_blocks + col_blocks - 1) / col_blocks), 1,
                              65535);
      unsigned* counters = reduce_counters(be, device, col_blocks);
      Scratch partial(be.allocator(device), static_cast<size_t>(splits * K * l.c) * sizeof(double));
      const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
      const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
      const size_t shared = static_cast<size_t>(tx * ty) * sizeof(double);
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
        std::min((packs + 4 * kern::kBlock - 1) / (4 * kern::kBlock), (target_blocks + l.c - 1) / l.c), 1, 65535);
    unsigned* counters = reduce_counters(be, device, l.c);
    Scratch partial(be.allocator(device), static_cast<size_t>(splits * K * l.c) * sizeof(double));
    const dim3 grid(static_cast<unsigned>(l.c), static_cast<unsigned>(splits));
    if (l.small())
      planes_reduce_kernel<K, V, uint32_t><<<grid, kern::kBlock, 0, st.stream>>>(
          static_cast<uint32_t>(l.n), static_cast<uint32_t>(l.c),
          FastDiv(static_cast<uint32_t>(std::max<int64_t>(l.s / V, 1))), static_cast<uint32_t>(l.s), elem, finish,
          partial.as<double>(), counters);
    else
      planes_reduce_kernel<K, V, int64_t><<<grid, kern::kBlock, 0, st.stream>>>(l.n, l.c, FastDiv(), l.s, elem,
                                                                                 finish, partial.as<double>(),
                                                                                 counters);
    TANDEM_CUDA_LAUNCH_CHECK("planes_reduce_kernel");
  };
  if (wide)
    launch(std::integral_constant<int, W>{});
  else
    launch(std::integral_constant<int, 1>{});
}

}  // namespace tandem::backend::chan
