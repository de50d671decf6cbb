// CUDA kernels: 2-D max and average pooling and their backward passes, for NCHW and NHWC (channels
// last) storage and f32 / f16 / bf16 elements (compared and summed in f32). The backward passes gather
// (each input element sums the windows that cover it), so they need no atomics and add in the same
// order as a forward-order scatter. Index arithmetic is 32-bit whenever the tensors allow it.
#include <cfloat>
#include <initializer_list>
#include <climits>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_channel.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::from_float;
using kern::kBlock;
using kern::to_float;

// Division by a fixed divisor: multiply-shift for 32-bit indices, plain division for 64-bit ones.
struct Div32 {
  chan::FastDiv d;
  __device__ __forceinline__ int32_t div(int32_t n) const { return static_cast<int32_t>(d.div(static_cast<uint32_t>(n))); }
};
struct Div64 {
  int64_t d;
  __device__ __forceinline__ int64_t div(int64_t n) const { return n / d; }
};

template <typename I>
using DivOf = std::conditional_t<sizeof(I) == 4, Div32, Div64>;

template <typename I>
DivOf<I> make_div(int64_t d) {
  if constexpr (sizeof(I) == 4)
    return Div32{chan::FastDiv(static_cast<uint32_t>(std::max<int64_t>(d, 1)))};
  else
    return Div64{std::max<int64_t>(d, 1)};
}

template <typename I>
struct PoolArgs {
  I n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
  DivOf<I> c_div, h_div, w_div, oh_div, ow_div;
  I ph_end, pw_end;  // padding after the input (bottom, right)
  bool count_pad;    // average: divide by the window's positions inside the padded input, or inside the input
};

template <typename I>
PoolArgs<I> pool_args(const PoolGeom& g) {
  return {static_cast<I>(g.n),      static_cast<I>(g.c),        static_cast<I>(g.h),        static_cast<I>(g.w),
          static_cast<I>(g.kh),     static_cast<I>(g.kw),       static_cast<I>(g.stride_h), static_cast<I>(g.stride_w),
          static_cast<I>(g.pad_h),  static_cast<I>(g.pad_w),    static_cast<I>(g.oh),       static_cast<I>(g.ow),
          make_div<I>(g.c),         make_div<I>(g.h),           make_div<I>(g.w),           make_div<I>(g.oh),
          make_div<I>(g.ow),        static_cast<I>(g.pad_h_end()), static_cast<I>(g.pad_w_end()), g.count_pad};
}

// Positions of the window of output row o that the average divides by: those inside the padded input
// [-pad, in + pad_end) with count_pad, else those inside the input (as the CPU backend counts them).
template <typename I>
__device__ __forceinline__ I window_count(I o, I stride, I pad, I pad_end, I k, I in, bool count_pad) {
  const I lo = o * stride - pad, hi = lo + k;
  const I first = count_pad ? -pad : I(0), last = count_pad ? in + pad_end : in;
  return (hi < last ? hi : last) - (lo > first ? lo : first);
}

// 1 / the divisor of the window at output position (oy, ox).
template <typename I>
__device__ __forceinline__ float avg_scale(const PoolArgs<I>& a, I oy, I ox) {
  const I rows = window_count(oy, a.sh, a.ph, a.ph_end, a.kh, a.h, a.count_pad);
  const I cols = window_count(ox, a.sw, a.pw, a.pw_end, a.kw, a.w, a.count_pad);
  return 1.0f / static_cast<float>(rows * cols);
}

// Splits a flat index over an [n, c, rows, cols] tensor (stored NCHW or NHWC) into the spatial position,
// the offset of its plane's (row 0, col 0) and the step between neighbouring spatial positions.
template <bool NHWC, typename I, typename D>
__device__ __forceinline__ void split_index(I i, I c, const D& c_div, I rows, const D& rows_div, I cols,
                                            const D& cols_div, I& row, I& col, I& plane_base, I& step, I& img,
                                            I& ch) {
  if constexpr (NHWC) {
    I t = c_div.div(i);
    ch = i - t * c;
    I t2 = cols_div.div(t);
    col = t - t2 * cols;
    img = rows_div.div(t2);
    row = t2 - img * rows;
    plane_base = img * rows * cols * c + ch;
    step = c;
  } else {
    I t = cols_div.div(i);
    col = i - t * cols;
    I p = rows_div.div(t);
    row = t - p * rows;
    img = p;  // the plane index n * c + ch stands for image and channel together
    ch = 0;
    plane_base = p * rows * cols;
    step = 1;
  }
}

// The offset of (0, 0) in the same image and channel of a tensor with other spatial sizes.
template <bool NHWC, typename I>
__device__ __forceinline__ I other_base(I img, I ch, I c, I rows, I cols) {
  return NHWC ? img * rows * cols * c + ch : img * rows * cols;
}

template <typename I>
__device__ __forceinline__ I grid_index() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ __forceinline__ I grid_stride() {
  return static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
}

// Max over the window's in-bounds positions; the first maximum in row-major order wins ties, a NaN
// propagates, and padding never takes part (a window always holds an input position: the op layer keeps
// pad <= k/2 and starts a ceil-mode window inside the input). indices holds the winner's row * w + col.
template <typename T, bool NHWC, typename I>
__global__ void max_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ idx,
                                        PoolArgs<I> a) {
  const I total = a.n * a.c * a.oh * a.ow;
  for (I i = grid_index<I>(); i < total; i += grid_stride<I>()) {
    I oy, ox, obase, step, img, ch;
    split_index<NHWC>(i, a.c, a.c_div, a.oh, a.oh_div, a.ow, a.ow_div, oy, ox, obase, step, img, ch);
    const I xbase = other_base<NHWC>(img, ch, a.c, a.h, a.w);
    const I h0 = oy * a.sh - a.ph, w0 = ox * a.sw - a.pw;
    const I hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;
    const I he = h0 + a.kh < a.h ? h0 + a.kh : a.h, we = w0 + a.kw < a.w ? w0 + a.kw : a.w;
    I best_i = hs * a.w + ws;
    float best = to_float(x[xbase + best_i * step]);
    for (I r = hs; r < he; ++r)
      for (I col = ws; col < we; ++col) {
        const float v = to_float(x[xbase + (r * a.w + col) * step]);
        if (v > best || v != v) {  // a NaN wins, as on the CPU
          best = v;
          best_i = r * a.w + col;
        }
      }
    y[i] = from_float<T>(best);
    idx[i] = static_cast<int32_t>(best_i);
  }
}

// Windows that tile the input exactly (stride = window, no padding, nothing left over): each output
// position owns its window of dx and writes all of it, its gradient at the winner and zeros elsewhere
// (0 + g, as the gathering kernel sums it). A quarter of the threads of the gather for 2x2 windows,
// and no search for the windows covering a position.
template <typename T, bool NHWC, typename I>
__global__ void max_pool_backward_tiled_kernel(const T* __restrict__ dy, const int32_t* __restrict__ idx,
                                               T* __restrict__ dx, PoolArgs<I> a) {
  const I total = a.n * a.c * a.oh * a.ow;
  for (I i = grid_index<I>(); i < total; i += grid_stride<I>()) {
    I oy, ox, obase, step, img, ch;
    split_index<NHWC>(i, a.c, a.c_div, a.oh, a.oh_div, a.ow, a.ow_div, oy, ox, obase, step, img, ch);
    const I xbase = other_base<NHWC>(img, ch, a.c, a.h, a.w);
    const T g = from_float<T>(0.0f + to_float(dy[i]));
    const T zero = from_float<T>(0.0f);
    const I win = idx[i];
    for (I r = oy * a.kh; r < (oy + 1) * a.kh; ++r)
      for (I col = ox * a.kw; col < (ox + 1) * a.kw; ++col) {
        const I self = r * a.w + col;
        dx[xbase + self * step] = self == win ? g : zero;
      }
  }
}

// First and one-past-last output index along one axis whose window covers input position p.
template <typename I>
__device__ __forceinline__ void covering(I p, I pad, I k, I stride, I out, I& first, I& last) {
  const I q = p + pad;
  first = q < k ? 0 : (q - k) / stride + 1;
  last = q / stride + 1;
  if (last > out) last = out;
}

template <typename T, bool NHWC, typename I>
__global__ void max_pool_backward_kernel(const T* __restrict__ dy, const int32_t* __restrict__ idx,
                                         T* __restrict__ dx, PoolArgs<I> a) {
  const I total = a.n * a.c * a.h * a.w;
  for (I i = grid_index<I>(); i < total; i += grid_stride<I>()) {
    I row, col, base, step, img, ch;
    split_index<NHWC>(i, a.c, a.c_div, a.h, a.h_div, a.w, a.w_div, row, col, base, step, img, ch);
    const I obase = other_base<NHWC>(img, ch, a.c, a.oh, a.ow);
    I y0, y1, x0, x1;
    covering(row, a.ph, a.kh, a.sh, a.oh, y0, y1);
    covering(col, a.pw, a.kw, a.sw, a.ow, x0, x1);
    const int32_t self = static_cast<int32_t>(row * a.w + col);
    float acc = 0.0f;
    for (I oy = y0; oy < y1; ++oy)
      for (I ox = x0; ox < x1; ++ox) {
        const I o = obase + (oy * a.ow + ox) * step;
        if (idx[o] == self) acc += to_float(dy[o]);
      }
    dx[i] = from_float<T>(acc);
  }
}

// Channels-last storage with a channel count that packs: each thread takes V consecutive channels of
// one spatial position with 16-byte loads and stores (the index pack as V int32). The same windows, order
// and tie rule as the kernels above, so the results are the same bits.
// Splits the index of a pack of an [n, rows, cols, c] tensor (cp packs per position) into the pack within
// its position, the column, the row and the image.
template <typename I>
__device__ __forceinline__ void split_packed(I i, I cp, const DivOf<I>& cp_div, I cols, const DivOf<I>& cols_div, I rows,
                                             const DivOf<I>& rows_div, I& p, I& col, I& row, I& img) {
  const I t = cp_div.div(i);
  p = i - t * cp;
  const I t2 = cols_div.div(t);
  col = t - t2 * cols;
  img = rows_div.div(t2);
  row = t2 - img * rows;
}

template <typename T, int V, typename I>
__global__ void max_pool_forward_packed_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ idx,
                                               PoolArgs<I> a, I cp, DivOf<I> cp_div) {
  const I total = a.n * a.oh * a.ow * cp;
  for (I i = grid_index<I>(); i < total; i += grid_stride<I>()) {
    I p, ox, oy, img;
    split_packed(i, cp, cp_div, a.ow, a.ow_div, a.oh, a.oh_div, p, ox, oy, img);
    const I xbase = img * a.h * a.w * a.c + p * V;
    const I h0 = oy * a.sh - a.ph, w0 = ox * a.sw - a.pw;
    const I hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;
    const I he = h0 + a.kh < a.h ? h0 + a.kh : a.h, we = w0 + a.kw < a.w ? w0 + a.kw : a.w;
    float best[V];
    int32_t win[V];
    {
      const chan::Pack<T, V> v = chan::load_pack<V>(x, xbase + (hs * a.w + ws) * a.c);
#pragma unroll
      for (int u = 0; u < V; ++u) {
        best[u] = to_float(v.v[u]);
        win[u] = static_cast<int32_t>(hs * a.w + ws);
      }
    }
    for (I r = hs; r < he; ++r)
      for (I col = ws; col < we; ++col) {
        const chan::Pack<T, V> v = chan::load_pack<V>(x, xbase + (r * a.w + col) * a.c);
#pragma unroll
        for (int u = 0; u < V; ++u) {
          const float f = to_float(v.v[u]);
          if (f > best[u] || f != f) {  // a NaN wins, as on the CPU
            best[u] = f;
            win[u] = static_cast<int32_t>(r * a.w + col);
          }
        }
      }
    chan::Pack<T, V> out;
    chan::Pack<int32_t, 4> w4;
#pragma unroll
    for (int u = 0; u < V; ++u) out.v[u] = from_float<T>(best[u]);
    chan::store_pack<V>(y, i * V, out);
#pragma unroll
    for (int q = 0; q < V; q += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u) w4.v[u] = win[q + u];
      chan::store_pack<4>(idx, i * V + q, w4);
    }
  }
}

template <typename T, int V, typename I>
__global__ void max_pool_backward_packed_kernel(const T* __restrict__ dy, const int32_t* __restrict__ idx,
                                                T* __restrict__ dx, PoolArgs<I> a, I cp, DivOf<I> cp_div) {
  const I total = a.n * a.h * a.w * cp;
  for (I i = grid_index<I>(); i < total; i += grid_stride<I>()) {
    I p, col, row, img;
    split_packed(i, cp, cp_div, a.w, a.w_div, a.h, a.h_div, p, col, row, img);
    const I obase = img * a.oh * a.ow * a.c + p * V;
    I y0, y1, x0, x1;
    covering(row, a.ph, a.kh, a.sh, a.oh, y0, y1);
    covering(col, a.pw, a.kw, a.sw, a.ow, x0, x1);
    const int32_t self = static_cast<int32_t>(row * a.w + col);
    float acc[V] = {};
    for (I oy = y0; oy < y1; ++oy)
      for (I ox = x0; ox < x1; ++ox) {
        const I o = obase + (oy * a.ow + ox) * a.c;
        const chan::Pack<T, V> g = chan::load_pack<V>(dy, o);
#pragma unroll
        for (int q = 0; q < V; q += 4) {
          const chan::Pack<int32_t, 4> w4 = chan::load_pack<4>(idx, o + q);
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (w4.v[u] == self) acc[q + u] += to_float(g.v[q + u]);
        }
      }
    chan::Pack<T, V> out;
#pragma unroll
    for (int u = 0; u < V; ++u) out.v[u] = from_float<T>(acc[u]);
    chan::store_pack<V>(dx, i * V, out);
  }
}

// Whether the packed channels-last kernels apply: 16-byte packs of channels (at least 4 per pack, so
// that the indices go as 16-byte packs too) and aligned pointers.
template <typename T>
bool packs_channels(const PoolGeom& g, std::initializer_list<const void*> ptrs) {
  constexpr int V = chan::pack_width<T>();
  return g.nhwc && V >= 4 && g.c % V == 0 && chan::aligned16(ptrs);
}

// Mean over the window: the sum of its input elements over avg_scale's divisor (kh * kw wherever the window
// lies inside the padded input and padding counts).
template <typename T, bool NHWC, typename I>
__global__ void avg_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, PoolArgs<I> a) {
  const I total = a.n * a.c * a.oh * a.ow;
  for (I i = grid_index<I>(); i < total; i += grid_stride<I>()) {
    I oy, ox, obase, step, img, ch;
    split_index<NHWC>(i, a.c, a.c_div, a.oh, a.oh_div, a.ow, a.ow_div, oy, ox, obase, step, img, ch);
    const I xbase = other_base<NHWC>(img, ch, a.c, a.h, a.w);
    const I h0 = oy * a.sh - a.ph, w0 = ox * a.sw - a.pw;
    const I hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;
    const I he = h0 + a.kh < a.h ? h0 + a.kh : a.h, we = w0 + a.kw < a.w ? w0 + a.kw : a.w;
    float acc = 0.0f;
    for (I r = hs; r < he; ++r)
      for (I col = ws; col < we; ++col) acc += to_float(x[xbase + (r * a.w + col) * step]);
    y[i] = from_float<T>(acc * avg_scale(a, oy, ox));
  }
}

template <typename T, bool NHWC, typename I>
__global__ void avg_pool_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, PoolArgs<I> a) {
  const I total = a.n * a.c * a.h * a.w;
  for (I i = grid_index<I>(); i < total; i += grid_stride<I>()) {
    I row, col, base, step, img, ch;
    split_index<NHWC>(i, a.c, a.c_div, a.h, a.h_div, a.w, a.w_div, row, col, base, step, img, ch);
    const I obase = other_base<NHWC>(img, ch, a.c, a.oh, a.ow);
    I y0, y1, x0, x1;
    covering(row, a.ph, a.kh, a.sh, a.oh, y0, y1);
    covering(col, a.pw, a.kw, a.sw, a.ow, x0, x1);
    float acc = 0.0f;
    for (I oy = y0; oy < y1; ++oy)
      for (I ox = x0; ox < x1; ++ox) acc += to_float(dy[obase + (oy * a.ow + ox) * step]) * avg_scale(a, oy, ox);
    dx[i] = from_float<T>(acc);
  }
}

void check_pool(const PoolGeom& g, const char* op) {
  TANDEM_ASSERT(g.kh >= 1 && g.kw >= 1 && g.stride_h >= 1 && g.stride_w >= 1 && 2 * g.pad_h <= g.kh &&
                    2 * g.pad_w <= g.kw && 2 * g.pad_h_end() <= g.kh && 2 * g.pad_w_end() <= g.kw,
                op, ": pooling geometry");
  TANDEM_CHECK(g.h * g.w <= INT32_MAX, op, ": planes of more than 2^31 elements are not supported");
}

// Runs launch(T{}, nhwc tag, index tag) for the tensors' element type, layout and the narrowest index
// type that holds every offset.
template <typename F>
void dispatch_pool(const PoolGeom& g, DType t, const char* op, F&& launch) {
  const int64_t biggest = g.n * g.c * std::max(g.h * g.w, g.oh * g.ow);
  kern::dispatch_float(t, op, [&](auto tag) {
    auto with_index = [&](auto itag) {
      if (g.nhwc)
        launch(tag, std::true_type{}, itag);
      else
        launch(tag, std::false_type{}, itag);
    };
    if (biggest < (INT_MAX >> 1))  // room for the grid stride past the last index
      with_index(int32_t{});
    else
      with_index(int64_t{});
  });
}
}  // namespace

void CudaBackend::max_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y, Tensor& indices) {
  TANDEM_CHECK(x.dtype() == y.dtype(), "max_pool2d: input ", x.str(), " and output ", y.str(), " differ in dtype");
  TANDEM_CHECK(indices.dtype() == DType::i32, "max_pool2d: indices must be i32, got ", indices.str());
  check_pool(g, "max_pool2d");
  const int64_t total = g.n * g.c * g.oh * g.ow;
  TANDEM_ASSERT(y.numel() == total && indices.numel() == total && x.numel() == g.n * g.c * g.h * g.w,
                "max_pool2d shapes");
  if (total == 0) return;
  DeviceState& st = state_for(y);
  dispatch_pool(g, x.dtype(), "max_pool2d", [&](auto tag, auto nhwc, auto itag) {
    using T = decltype(tag);
    using I = decltype(itag);
    if (packs_channels<T>(g, {x.data_ptr(), y.data_ptr(), indices.data_ptr()})) {
      constexpr int V = chan::pack_width<T>();
      const I cp = static_cast<I>(g.c / V);
      max_pool_forward_packed_kernel<T, V, I><<<blocks_for(total / V), kBlock, 0, st.stream>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), indices.data<int32_t>(), pool_args<I>(g),
          cp, make_div<I>(cp));
      return;
    }
    max_pool_forward_kernel<T, decltype(nhwc)::value, I><<<blocks_for(total), kBlock, 0, st.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), indices.data<int32_t>(), pool_args<I>(g));
  });
  TANDEM_CUDA_LAUNCH_CHECK("max_pool_forward_kernel");
}

void CudaBackend::max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& indices,
                                      const PoolGeom& g, Tensor& dx) {
  TANDEM_CHECK(dy.dtype() == dx.dtype(), "max_pool2d backward: gradients ", dy.str(), " and ", dx.str(),
               " differ in dtype");
  TANDEM_CHECK(indices.dtype() == DType::i32, "max_pool2d backward: indices must be i32, got ", indices.str());
  check_pool(g, "max_pool2d backward");
  const int64_t total = g.n * g.c * g.h * g.w;
  TANDEM_ASSERT(dx.numel() == total && dy.numel() == g.n * g.c * g.oh * g.ow && indices.numel() == dy.numel(),
                "max_pool2d backward shapes");
  if (total == 0) return;
  DeviceState& st = state_for(dx);
  const bool tiled = g.kh == g.stride_h && g.kw == g.stride_w && g.pad_h == 0 && g.pad_w == 0 &&
                     g.oh * g.kh == g.h && g.ow * g.kw == g.w;
  dispatch_pool(g, dx.dtype(), "max_pool2d backward", [&](auto tag, auto nhwc, auto itag) {
    using T = decltype(tag);
    using I = decltype(itag);
    if (packs_channels<T>(g, {dy.data_ptr(), indices.data_ptr(), dx.data_ptr()})) {
      constexpr int V = chan::pack_width<T>();
      const I cp = static_cast<I>(g.c / V);
      max_pool_backward_packed_kernel<T, V, I><<<blocks_for(total / V), kBlock, 0, st.stream>>>(
          static_cast<const T*>(dy.data_ptr()), indices.data<int32_t>(), static_cast<T*>(dx.data_ptr()),
          pool_args<I>(g), cp, make_div<I>(cp));
      return;
    }
    if (tiled) {
      max_pool_backward_tiled_kernel<T, decltype(nhwc)::value, I><<<blocks_for(dy.numel()), kBlock, 0, st.stream>>>(
          static_cast<const T*>(dy.data_ptr()), indices.data<int32_t>(), static_cast<T*>(dx.data_ptr()),
          pool_args<I>(g));
      return;
    }
    max_pool_backward_kernel<T, decltype(nhwc)::value, I><<<blocks_for(total), kBlock, 0, st.stream>>>(
        static_cast<const T*>(dy.data_ptr()), indices.data<int32_t>(), static_cast<T*>(dx.data_ptr()),
        pool_args<I>(g));
  });
  TANDEM_CUDA_LAUNCH_CHECK("max_pool_backward_kernel");
}

void CudaBackend::avg_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y) {
  TANDEM_CHECK(x.dtype() == y.dtype(), "avg_pool2d: input ", x.str(), " and output ", y.str(), " differ in dtype");
  check_pool(g, "avg_pool2d");
  const int64_t total = g.n * g.c * g.oh * g.ow;
  TANDEM_ASSERT(y.numel() == total && x.numel() == g.n * g.c * g.h * g.w, "avg_pool2d shapes");
  if (total == 0) return;
  DeviceState& st = state_for(y);
  dispatch_pool(g, x.dtype(), "avg_pool2d", [&](auto tag, auto nhwc, auto itag) {
    using T = decltype(tag);
    using I = decltype(itag);
    avg_pool_forward_kernel<T, decltype(nhwc)::value, I><<<blocks_for(total), kBlock, 0, st.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), pool_args<I>(g));
  });
  TANDEM_CUDA_LAUNCH_CHECK("avg_pool_forward_kernel");
}

void CudaBackend::avg_pool2d_backward(const Tensor& dy, const PoolGeom& g, Tensor& dx) {
  TANDEM_CHECK(dy.dtype() == dx.dtype(), "avg_pool2d backward: gradients ", dy.str(), " and ", dx.str(),
               " differ in dtype");
  check_pool(g, "avg_pool2d backward");
  const int64_t total = g.n * g.c * g.h * g.w;
  TANDEM_ASSERT(dx.numel() == total && dy.numel() == g.n * g.c * g.oh * g.ow, "avg_pool2d backward shapes");
  if (total == 0) return;
  DeviceState& st = state_for(dx);
  dispatch_pool(g, dx.dtype(), "avg_pool2d backward", [&](auto tag, auto nhwc, auto itag) {
    using T = decltype(tag);
    using I = decltype(itag);
    avg_pool_backward_kernel<T, decltype(nhwc)::value, I><<<blocks_for(total), kBlock, 0, st.stream>>>(
        static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()), pool_args<I>(g));
  });
  TANDEM_CUDA_LAUNCH_CHECK("avg_pool_backward_kernel");
}

}  // namespace tandem::backend
