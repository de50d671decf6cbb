// CUDA kernels: reductions over the middle extent of [outer, n, inner] views (f32, f16, bf16, in f32), and
// the exact gradient of the product.
//
// Three shapes of work, chosen on the host from the extents:
// - rows (inner == 1, n past a warp): a warp per row, its lanes reading consecutive elements;
// - columns of a tile (inner > 1, or short rows, when the columns alone give too little work): a block
//   per 2-D tile of the inner columns, threads along inner read consecutive elements and the block's
//   other dimension splits n, joined in shared memory;
// - one thread per column, when there are columns enough to fill the device.
// Where a reduction is long and the outputs few, n is also split across blocks (grid.y): each block
// writes its partial state, and a last kernel joins them in a fixed order. Every launch geometry
// depends on the extents and the device only, so results repeat bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {

using ReduceOp = Backend::ReduceOp;
using kern::from_float;
using kern::to_float;

constexpr unsigned kFull = 0xffffffffu;

// Reduction states. merge is commutative (up to rounding), since lanes and tiles meet in tree order;
// the arg ops break ties by position, so the first extreme wins whatever the order.
struct SumOp {
  struct S {
    float s;
  };
  __device__ static S init() { return {0.f}; }
  __device__ static void add(S& a, float v, int64_t) { a.s += v; }
  __device__ static void merge(S& a, const S& b) { a.s += b.s; }
  __device__ static S shfl_down(const S& a, int o) { return {__shfl_down_sync(kFull, a.s, o)}; }
  __device__ static float result(const S& a, int64_t, float arg) { return a.s * arg; }
};

struct ProdOp {
  struct S {
    float s;
  };
  __device__ static S init() { return {1.f}; }
  __device__ static void add(S& a, float v, int64_t) { a.s *= v; }
  __device__ static void merge(S& a, const S& b) { a.s *= b.s; }
  __device__ static S shfl_down(const S& a, int o) { return {__shfl_down_sync(kFull, a.s, o)}; }
  __device__ static float result(const S& a, int64_t, float) { return a.s; }
};

template <bool kMax>
struct ExtremeOp {
  struct S {
    float m;
  };
  __device__ static S init() { return {kMax ? -INFINITY : INFINITY}; }
  __device__ static void add(S& a, float v, int64_t) {
    if (isnan(a.m)) return;  // NaN wins and stays
    if (isnan(v) || (kMax ? v > a.m : v < a.m)) a.m = v;
  }
  __device__ static void merge(S& a, const S& b) { add(a, b.m, 0); }
  __device__ static S shfl_down(const S& a, int o) { return {__shfl_down_sync(kFull, a.m, o)}; }
  __device__ static float result(const S& a, int64_t, float) { return a.m; }
};

template <bool kMax>
struct ArgOp {
  struct S {
    float v;
    long long k;  // -1: no element yet
  };
  __device__ static bool better(float v1, long long k1, float v2, long long k2) {
    if (k2 < 0) return true;
    if (k1 < 0) return false;
    const bool n1 = isnan(v1), n2 = isnan(v2);
    if (n1 || n2) return n1 && (!n2 || k1 < k2);
    if (v1 != v2) return kMax ? v1 > v2 : v1 < v2;
    return k1 < k2;
  }
  __device__ static S init() { return {0.f, -1}; }
  __device__ static void add(S& a, float v, int64_t k) {
    if (better(v, k, a.v, a.k)) a = {v, static_cast<long long>(k)};
  }
  __device__ static void merge(S& a, const S& b) {
    if (better(b.v, b.k, a.v, a.k)) a = b;
  }
  __device__ static S shfl_down(const S& a, int o) {
    return {__shfl_down_sync(kFull, a.v, o), __shfl_down_sync(kFull, a.k, o)};
  }
  __device__ static long long index(const S& a) { return a.k; }
};

// Welford's running mean and squared deviations; Chan's rule joins two.
struct VarOp {
  struct S {
    float n, mean, m2;
  };
  __device__ static S init() { return {0.f, 0.f, 0.f}; }
  __device__ static void add(S& a, float v, int64_t) {
    a.n += 1.f;
    const float d = v - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (v - a.mean);
  }
  __device__ static void merge(S& a, const S& b) {
    if (b.n == 0.f) return;
    if (a.n == 0.f) {
      a = b;
      return;
    }
    const float total = a.n + b.n, d = b.mean - a.mean, w = b.n / total;
    a.mean += d * w;
    a.m2 += b.m2 + d * d * a.n * w;
    a.n = total;
  }
  __device__ static S shfl_down(const S& a, int o) {
    return {__shfl_down_sync(kFull, a.n, o), __shfl_down_sync(kFull, a.mean, o), __shfl_down_sync(kFull, a.m2, o)};
  }
  __device__ static float result(const S& a, int64_t count, float correction) {
    if (count == 0) return NAN;
    return a.m2 / fmaxf(static_cast<float>(count) - correction, 0.f);
  }
};

// The running maximum and the sum of exp(v - maximum).
struct LseOp {
  struct S {
    float m, s;
  };
  __device__ static S init() { return {-INFINITY, 0.f}; }
  __device__ static void join(S& a, float m, float s) {
    if (s == 0.f) return;
    if (a.s == 0.f) {
      a = {m, s};
    } else if (m > a.m) {
      a.s = a.s * __expf(a.m - m) + s;
      a.m = m;
    } else if (m == a.m) {
      a.s += s;
    } else {
      a.s += s * __expf(m - a.m);
    }
  }
  __device__ static void add(S& a, float v, int64_t) {
    if (v == -INFINITY) return;
    if (isnan(v)) {
      a = {NAN, 1.f};
      return;
    }
    if (isnan(a.m)) return;
    join(a, v, 1.f);
  }
  __device__ static void merge(S& a, const S& b) {
    if (isnan(a.m) || b.s == 0.f) return;
    if (isnan(b.m)) {
      a = b;
      return;
    }
    join(a, b.m, b.s);
  }
  __device__ static S shfl_down(const S& a, int o) {
    return {__shfl_down_sync(kFull, a.m, o), __shfl_down_sync(kFull, a.s, o)};
  }
  __device__ static float result(const S& a, int64_t, float) { return a.s == 0.f ? -INFINITY : a.m + logf(a.s); }
};

template <typename Op>
constexpr bool is_arg_op = std::is_same_v<Op, ArgOp<true>> || std::is_same_v<Op, ArgOp<false>>;

template <typename Op, typename Out>
__device__ __forceinline__ void write_result(Out* out, int64_t c, const typename Op::S& s, int64_t n, float arg) {
  if constexpr (is_arg_op<Op>)
    out[c] = Op::index(s);
  else
    out[c] = from_float<Out>(Op::result(s, n, arg));
}

// A warp per (row, range of n): lanes read consecutive elements, four loads in flight each.
template <typename Op, typename T, typename Out>
__global__ void reduce_rows_kernel(const T* __restrict__ x, int64_t outer, int64_t n, int64_t chunk,
                                   typename Op::S* __restrict__ partial, Out* __restrict__ out, float arg) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= outer) return;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * chunk, k1 = min(n, k0 + chunk);
  const T* p = x + row * n;
  typename Op::S s = Op::init();
  int64_t k = k0 + lane;
  for (; k + 96 < k1; k += 128) {
    const float v0 = to_float(p[k]), v1 = to_float(p[k + 32]), v2 = to_float(p[k + 64]), v3 = to_float(p[k + 96]);
    Op::add(s, v0, k);
    Op::add(s, v1, k + 32);
    Op::add(s, v2, k + 64);
    Op::add(s, v3, k + 96);
  }
  for (; k < k1; k += 32) Op::add(s, to_float(p[k]), k);
  for (int o = 16; o > 0; o >>= 1) {
    const typename Op::S other = Op::shfl_down(s, o);
    Op::merge(s, other);
  }
  if (lane != 0) return;
  if (gridDim.y == 1)
    write_result<Op>(out, row, s, n, arg);
  else
    partial[static_cast<int64_t>(blockIdx.y) * outer + row] = s;
}

// A block per (outer index, tile of blockDim.x inner columns, range of n); threadIdx.y splits the range.
template <typename Op, typename T, typename Out>
__global__ void reduce_tile_kernel(const T* __restrict__ x, int64_t outer, int64_t n, int64_t inner, int64_t chunk,
                                   int64_t tiles, typename Op::S* __restrict__ partial, Out* __restrict__ out,
                                   float arg) {
  extern __shared__ unsigned char smem_raw[];
  auto* sm = reinterpret_cast<typename Op::S*>(smem_raw);
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t o = blockIdx.x / tiles, i = (blockIdx.x % tiles) * bx + tx;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * chunk, k1 = min(n, k0 + chunk);
  typename Op::S s = Op::init();
  if (i < inner) {
    const T* p = x + o * n * inner + i;
    for (int64_t k = k0 + ty; k < k1; k += by) Op::add(s, to_float(p[k * inner]), k);
  }
  sm[ty * bx + tx] = s;
  __syncthreads();
  for (int h = by >> 1; h > 0; h >>= 1) {
    if (ty < h) Op::merge(sm[ty * bx + tx], sm[(ty + h) * bx + tx]);
    __syncthreads();
  }
  if (ty != 0 || i >= inner) return;
  const int64_t c = o * inner + i;
  if (gridDim.y == 1)
    write_result<Op>(out, c, sm[tx], n, arg);
  else
    partial[static_cast<int64_t>(blockIdx.y) * outer * inner + c] = sm[tx];
}

// A thread per column (o, i), over the whole of n.
template <typename Op, typename T, typename Out>
__global__ void reduce_columns_kernel(const T* __restrict__ x, int64_t outer, int64_t n, int64_t inner,
                                      Out* __restrict__ out, float arg) {
  const int64_t cols = outer * inner;
  for (int64_t c = kern::thread_index(); c < cols; c += kern::thread_count()) {
    const int64_t o = c / inner, i = c - o * inner;
    const T* p = x + o * n * inner + i;
    typename Op::S s = Op::init();
    for (int64_t k = 0; k < n; ++k) Op::add(s, to_float(p[k * inner]), k);
    write_result<Op>(out, c, s, n, arg);
  }
}

// Joins the partial states of each column, range by range in order.
template <typename Op, typename Out>
__global__ void reduce_join_kernel(const typename Op::S* __restrict__ partial, int64_t cols, int64_t chunks, int64_t n,
                                   Out* __restrict__ out, float arg) {
  for (int64_t c = kern::thread_index(); c < cols; c += kern::thread_count()) {
    typename Op::S s = partial[c];
    for (int64_t r = 1; r < chunks; ++r) Op::merge(s, partial[r * cols + c]);
    write_result<Op>(out, c, s, n, arg);
  }
}

int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v && p < 32) p <<= 1;
  return p;
}

template <typename Op, typename T, typename Out>
void launch_reduce(const T* x, int64_t outer, int64_t n, int64_t inner, float arg, Out* out, DeviceState& st,
                   Allocator& alloc) {
  using S = typename Op::S;
  const int64_t cols = outer * inner;
  const int64_t target_blocks = static_cast<int64_t>(st.sm_count) * 8;  // 256-thread blocks: 2048 threads per SM
  auto split = [&](int64_t blocks, int64_t min_chunk, int64_t& chunk) {
    int64_t chunks = 1;
    if (blocks < target_blocks) chunks = std::min((target_blocks + blocks - 1) / blocks, (n + min_chunk - 1) / min_chunk);
    chunks = std::clamp<int64_t>(chunks, 1, 65535);
    chunk = (n + chunks - 1) / chunks;
    return std::max<int64_t>(1, (n + chunk - 1) / std::max<int64_t>(chunk, 1));
  };
  auto join = [&](const S* partial, int64_t chunks) {
    reduce_join_kernel<Op, Out><<<kern::blocks_for(cols), kern::kBlock, 0, st.stream>>>(partial, cols, chunks, n, out,
                                                                                        arg);
    TANDEM_CUDA_LAUNCH_CHECK("reduce_join_kernel");
  };
  if (inner == 1 && n > 32) {
    constexpr int kWarps = 8;
    const int64_t blocks = (outer + kWarps - 1) / kWarps;
    TANDEM_CHECK(blocks <= INT_MAX, "reduce: ", outer, " rows are more than one launch takes");
    int64_t chunk = n;
    const int64_t chunks = split(blocks, 4096, chunk);
    Scratch partial(alloc, chunks > 1 ? static_cast<size_t>(chunks * cols) * sizeof(S) : 0);
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(chunks));
    reduce_rows_kernel<Op, T, Out><<<grid, kWarps * 32, 0, st.stream>>>(x, outer, n, chunk, partial.as<S>(), out, arg);
    TANDEM_CUDA_LAUNCH_CHECK("reduce_rows_kernel");
    if (chunks > 1) join(partial.as<S>(), chunks);
    return;
  }
  if (n <= 32 || cols >= static_cast<int64_t>(st.sm_count) * 2048) {
    reduce_columns_kernel<Op, T, Out><<<kern::blocks_for(cols), kern::kBlock, 0, st.stream>>>(x, outer, n, inner, out,
                                                                                               arg);
    TANDEM_CUDA_LAUNCH_CHECK("reduce_columns_kernel");
    return;
  }
  const int bx = pow2_at_least(inner), by = 256 / bx;
  const int64_t tiles = (inner + bx - 1) / bx, blocks = outer * tiles;
  TANDEM_CHECK(blocks <= INT_MAX, "reduce: ", blocks, " tiles are more than one launch takes");
  int64_t chunk = n;
  const int64_t chunks = split(blocks, static_cast<int64_t>(by) * 16, chunk);
  Scratch partial(alloc, chunks > 1 ? static_cast<size_t>(chunks * cols) * sizeof(S) : 0);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(chunks)), block(bx, by);
  reduce_tile_kernel<Op, T, Out><<<grid, block, 256 * sizeof(S), st.stream>>>(x, outer, n, inner, chunk, tiles,
                                                                              partial.as<S>(), out, arg);
  TANDEM_CUDA_LAUNCH_CHECK("reduce_tile_kernel");
  if (chunks > 1) join(partial.as<S>(), chunks);
}

// Per column: the product before each position written forwards, then multiplied by the product after
// it and the gradient, backwards.
template <typename T>
__global__ void prod_backward_kernel(const T* __restrict__ x, const T* __restrict__ g, int64_t outer, int64_t n,
                                     int64_t inner, T* __restrict__ dx) {
  const int64_t cols = outer * inner;
  for (int64_t c = kern::thread_index(); c < cols; c += kern::thread_count()) {
    const int64_t o = c / inner, i = c - o * inner;
    const T* p = x + o * n * inner + i;
    T* d = dx + o * n * inner + i;
    float run = 1.f;
    for (int64_t k = 0; k < n; ++k) {
      d[k * inner] = from_float<T>(run);
      run *= to_float(p[k * inner]);
    }
    run = to_float(g[c]);
    for (int64_t k = n - 1; k >= 0; --k) {
      d[k * inner] = from_float<T>(to_float(d[k * inner]) * run);
      run *= to_float(p[k * inner]);
    }
  }
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double arg,
                         Tensor& out) {
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == outer * inner, "reduce extents ", outer, "x", n, "x",
                inner, " for ", x.str(), " into ", out.str());
  const bool arg_op = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  TANDEM_ASSERT(arg_op ? out.dtype() == DType::i64 : out.dtype() == x.dtype(), "reduce into ", out.str());
  if (outer * inner == 0) return;
  DeviceState& st = state_for(out);
  Allocator& alloc = allocator(st.device);
  const float a = static_cast<float>(arg);
  kern::dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    if (arg_op) {
      auto* po = reinterpret_cast<long long*>(out.data<int64_t>());
      if (op == ReduceOp::ArgMax)
        launch_reduce<ArgOp<true>>(px, outer, n, inner, a, po, st, alloc);
      else
        launch_reduce<ArgOp<false>>(px, outer, n, inner, a, po, st, alloc);
      return;
    }
    T* po = static_cast<T*>(out.data_ptr());
    switch (op) {
      case ReduceOp::Sum: return launch_reduce<SumOp>(px, outer, n, inner, a, po, st, alloc);
      case ReduceOp::Prod: return launch_reduce<ProdOp>(px, outer, n, inner, a, po, st, alloc);
      case ReduceOp::Max: return launch_reduce<ExtremeOp<true>>(px, outer, n, inner, a, po, st, alloc);
      case ReduceOp::Min: return launch_reduce<ExtremeOp<false>>(px, outer, n, inner, a, po, st, alloc);
      case ReduceOp::Var: return launch_reduce<VarOp>(px, outer, n, inner, a, po, st, alloc);
      case ReduceOp::LogSumExp: return launch_reduce<LseOp>(px, outer, n, inner, a, po, st, alloc);
      default: break;
    }
  });
}

void CudaBackend::prod_backward(const Tensor& x, const Tensor& g, int64_t outer, int64_t n, int64_t inner,
                                Tensor& dx) {
  TANDEM_ASSERT(x.numel() == outer * n * inner && g.numel() == outer * inner && dx.numel() == x.numel(),
                "prod_backward extents");
  if (dx.numel() == 0) return;
  DeviceState& st = state_for(dx);
  kern::dispatch_float(x.dtype(), "prod_backward", [&](auto tag) {
    using T = decltype(tag);
    prod_backward_kernel<T><<<kern::blocks_for(outer * inner), kern::kBlock, 0, st.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(g.data_ptr()), outer, n, inner,
        static_cast<T*>(dx.data_ptr()));
    TANDEM_CUDA_LAUNCH_CHECK("prod_backward_kernel");
  });
}

}  // namespace tandem::backend
