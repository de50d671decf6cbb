// CUDA kernels: the fused pointwise ops of Llama-family blocks, f32, f16 and bf16 (arithmetic in f32).
//
// Both walk rows of a fixed layout: rotary position embeddings on the rows of a packed query-key-value
// projection (the query and key heads rotated, the value heads copied) and SwiGLU over rows holding the gate
// then the up projection. A launch is two-dimensional: threadIdx.x / blockIdx.x pick a thread's item in the
// row (V consecutive elements, 16 bytes where the sizes and addresses allow, else one element), which stays the
// same for every row the thread takes, so the division that maps an item to its head and column runs once per
// thread; threadIdx.y / blockIdx.y pick the rows, in a grid-stride loop.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "backend/elementwise_functors.h"

namespace tandem::backend {

namespace {

using kern::from_float;
using kern::load_pack;
using kern::Pack;
using kern::store_pack;
using kern::to_float;

constexpr int kThreads = 256;

bool cuda_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

// Threads along x cover a row's items (a power of two up to kThreads), the rest of the block takes more rows.
struct RowLaunch {
  dim3 grid, block;
};

RowLaunch row_launch(int64_t rows, int64_t per_row) {
  int bx = 1;
  while (bx < per_row && bx < kThreads) bx <<= 1;
  const int by = kThreads / bx;
  const int64_t gx = (per_row + bx - 1) / bx;
  const int64_t gy = std::clamp<int64_t>((rows + by - 1) / by, 1, 65535);
  return {dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(static_cast<unsigned>(bx),
                                                                           static_cast<unsigned>(by))};
}

__device__ __forceinline__ int item_index() { return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); }
__device__ __forceinline__ int64_t first_row() { return int64_t(blockIdx.y) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t row_step() { return int64_t(gridDim.y) * blockDim.y; }

// Rows of width elements, the first rot of them the heads to rotate: items [0, rot_items) rotate V columns of a
// head's first half and the same columns of its second half (hv = d / 2 / V items per head); items
// [rot_items, per_row) copy V elements each of the rest (the value heads).
template <typename T, int V, bool TRANSPOSE>
__global__ void rotary_kernel(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin,
                              T* __restrict__ y, int64_t rows, int64_t t, int64_t start,
                              const int32_t* __restrict__ positions, int d, int width, int rot, int rot_items, int hv,
                              int per_row) {
  const int j = item_index();
  if (j >= per_row) return;
  const int h = d / 2;
  const bool rotate = j < rot_items;
  int col = 0, off;
  if (rotate) {
    const int head = j / hv;
    col = (j - head * hv) * V;
    off = head * d + col;
  } else {
    off = rot + (j - rot_items) * V;
  }
  const int64_t step = row_step(), pstep = step % t;
  int64_t r = first_row(), p = r % t;
  for (; r < rows; r += step) {
    const int64_t at = r * width + off;
    if (rotate) {
      const int64_t tab = (positions ? int64_t{positions[r]} : start + p) * d + col;
      const Pack<T, V> x1 = load_pack<V>(x, at), x2 = load_pack<V>(x, at + h);
      const Pack<T, V> c1 = load_pack<V>(cos, tab), c2 = load_pack<V>(cos, tab + h);
      const Pack<T, V> s1 = load_pack<V>(sin, tab), s2 = load_pack<V>(sin, tab + h);
      Pack<T, V> y1, y2;
#pragma unroll
      for (int u = 0; u < V; ++u) {
        const float a = to_float(x1.v[u]), b = to_float(x2.v[u]);
        if constexpr (!TRANSPOSE) {
          y1.v[u] = from_float<T>(a * to_float(c1.v[u]) - b * to_float(s1.v[u]));
          y2.v[u] = from_float<T>(b * to_float(c2.v[u]) + a * to_float(s2.v[u]));
        } else {
          y1.v[u] = from_float<T>(a * to_float(c1.v[u]) + b * to_float(s2.v[u]));
          y2.v[u] = from_float<T>(b * to_float(c2.v[u]) - a * to_float(s1.v[u]));
        }
      }
      store_pack<V>(y, at, y1);
      store_pack<V>(y, at + h, y2);
    } else {
      store_pack<V>(y, at, load_pack<V>(x, at));
    }
    p += pstep;
    if (p >= t) p -= t;
  }
}

// Row r of x holds the gate [0, hidden) then the up projection [hidden, 2 hidden); item j takes columns
// [j V, j V + V) of both.
template <typename T, int V>
__global__ void swiglu_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int hidden, int per_row) {
  const int j = item_index();
  if (j >= per_row) return;
  const int col = j * V;
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const int64_t at = r * 2 * hidden + col;
    const Pack<T, V> g = load_pack<V>(x, at), u = load_pack<V>(x, at + hidden);
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float a = to_float(g.v[k]);
      o.v[k] = from_float<T>(a * ewf::sigmoid_(a) * to_float(u.v[k]));
    }
    store_pack<V>(y, r * hidden + col, o);
  }
}

template <typename T, int V>
__global__ void swiglu_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, int64_t rows,
                                   int hidden, int per_row) {
  const int j = item_index();
  if (j >= per_row) return;
  const int col = j * V;
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const int64_t at = r * 2 * hidden + col;
    const Pack<T, V> g = load_pack<V>(x, at), u = load_pack<V>(x, at + hidden), d = load_pack<V>(dy, r * hidden + col);
    Pack<T, V> dg, du;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float a = to_float(g.v[k]), s = ewf::sigmoid_(a), gy = to_float(d.v[k]);
      dg.v[k] = from_float<T>(gy * to_float(u.v[k]) * s * (1.0f + a * (1.0f - s)));
      du.v[k] = from_float<T>(gy * a * s);
    }
    store_pack<V>(dx, at, dg);
    store_pack<V>(dx, at + hidden, du);
  }
}

void check_int_extent(int64_t v, const char* op, const char* what) {
  TANDEM_CHECK(v < (int64_t(1) << 31), op, ": ", what, " of ", v, " elements exceeds the CUDA kernel's 2^31 - 1");
}

}  // namespace

bool CudaBackend::rotary_packed(const Tensor& x, const Tensor& cos, const Tensor& sin, const RotaryGeom& g, Tensor& y) {
  if (!cuda_float(x.dtype())) return false;
  const char* op = "rotary_packed";
  const int64_t rows = g.batch * g.t;
  if (rows == 0 || g.width() == 0) return true;
  TANDEM_ASSERT(g.d > 0 && g.d % 2 == 0 && x.numel() == g.batch * g.t * g.width() &&
                    y.numel() == x.numel() && y.dtype() == x.dtype() && cos.dtype() == x.dtype() &&
                    sin.dtype() == x.dtype() && cos.numel() == sin.numel() && cos.numel() >= (g.start + g.t) * g.d,
                op, ": ", x.str(), " into ", y.str(), " with tables ", cos.str(), ", ", sin.str());
  check_int_extent(g.width(), op, "a row");
  TANDEM_ASSERT(!g.positions.defined() || (g.positions.dtype() == DType::i32 && g.positions.is_contiguous() &&
                                            g.positions.numel() == rows && g.positions.device() == x.device()),
                op, ": positions ", g.positions.str());
  // Positions below the tables' rows are the caller's contract (the windows' kernel makes them below the context).
  const int32_t* positions = g.positions.defined() ? g.positions.data<int32_t>() : nullptr;
  DeviceState& st = state_for(x);
  kern::dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pc = static_cast<const T*>(cos.data_ptr());
    const T* ps = static_cast<const T*>(sin.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    auto launch = [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      const int hv = static_cast<int>(g.d / 2 / V), rot_items = static_cast<int>(g.rotated) * hv;
      const int per_row = rot_items + static_cast<int>(g.copied * g.d / V);
      const RowLaunch l = row_launch(rows, per_row);
      auto kernel = g.transpose ? rotary_kernel<T, V, true> : rotary_kernel<T, V, false>;
      kernel<<<l.grid, l.block, 0, st.stream>>>(px, pc, ps, py, rows, g.t, g.start, positions, static_cast<int>(g.d),
                                                static_cast<int>(g.width()), static_cast<int>(g.rotated * g.d),
                                                rot_items, hv, per_row);
    };
    constexpr int kV = kern::pack_width<T>();
    if ((g.d / 2) % kV == 0 && kern::aligned16({px, pc, ps, py}))
      launch(std::integral_constant<int, kV>{});
    else
      launch(std::integral_constant<int, 1>{});
    TANDEM_CUDA_LAUNCH_CHECK("rotary_kernel");
  });
  return true;
}

bool CudaBackend::swiglu_forward(const Tensor& x, int64_t rows, int64_t hidden, Tensor& y) {
  if (!cuda_float(x.dtype())) return false;
  const char* op = "swiglu";
  TANDEM_ASSERT(x.numel() == rows * 2 * hidden && y.numel() == rows * hidden && y.dtype() == x.dtype(), op, ": ",
                x.str(), " into ", y.str());
  if (rows == 0 || hidden == 0) return true;
  check_int_extent(2 * hidden, op, "a row");
  DeviceState& st = state_for(x);
  kern::dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    auto launch = [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      const int per_row = static_cast<int>(hidden / V);
      const RowLaunch l = row_launch(rows, per_row);
      swiglu_kernel<T, V><<<l.grid, l.block, 0, st.stream>>>(px, py, rows, static_cast<int>(hidden), per_row);
    };
    constexpr int kV = kern::pack_width<T>();
    if (hidden % kV == 0 && kern::aligned16({px, py}))
      launch(std::integral_constant<int, kV>{});
    else
      launch(std::integral_constant<int, 1>{});
    TANDEM_CUDA_LAUNCH_CHECK("swiglu_kernel");
  });
  return true;
}

bool CudaBackend::swiglu_backward(const Tensor& dy, const Tensor& x, int64_t rows, int64_t hidden, Tensor& dx) {
  if (!cuda_float(x.dtype())) return false;
  const char* op = "swiglu backward";
  TANDEM_ASSERT(x.numel() == rows * 2 * hidden && dy.numel() == rows * hidden && dx.numel() == x.numel() &&
                    dy.dtype() == x.dtype() && dx.dtype() == x.dtype(),
                op, ": ", dy.str(), " and ", x.str(), " into ", dx.str());
  if (rows == 0 || hidden == 0) return true;
  check_int_extent(2 * hidden, op, "a row");
  DeviceState& st = state_for(x);
  kern::dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(dy.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    auto launch = [&](auto vtag) {
      constexpr int V = decltype(vtag)::value;
      const int per_row = static_cast<int>(hidden / V);
      const RowLaunch l = row_launch(rows, per_row);
      swiglu_grad_kernel<T, V><<<l.grid, l.block, 0, st.stream>>>(pg, px, pd, rows, static_cast<int>(hidden), per_row);
    };
    constexpr int kV = kern::pack_width<T>();
    if (hidden % kV == 0 && kern::aligned16({pg, px, pd}))
      launch(std::integral_constant<int, kV>{});
    else
      launch(std::integral_constant<int, 1>{});
    TANDEM_CUDA_LAUNCH_CHECK("swiglu_grad_kernel");
  });
  return true;
}

}  // namespace tandem::backend
