// CPU backend: max and average pooling over NCHW planes, one plane per task.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

using cpu::kParallelElems;

namespace {

// Window rows [lo, hi) of the input covered by output row o, clipped to the input (padding excluded).
inline void window(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t in, int64_t& lo, int64_t& hi) {
  lo = o * stride - pad;
  hi = std::min(lo + k, in);
  lo = std::max<int64_t>(lo, 0);
}

// Positions of the window of output row o that the average divides by: those inside the padded input
// [-pad, in + pad_end) with count_pad, else those inside the input. Without ceil mode's last window every
// window lies inside the padded input, and with count_pad this is k.
inline int64_t window_count(int64_t o, int64_t stride, int64_t pad, int64_t pad_end, int64_t k, int64_t in,
                            bool count_pad) {
  const int64_t lo = o * stride - pad, hi = lo + k;
  const int64_t first = count_pad ? -pad : 0, last = count_pad ? in + pad_end : in;
  return std::min(hi, last) - std::max(lo, first);
}

// A candidate replaces the running maximum when strictly larger (so the first maximum wins ties)
// or NaN (NaN propagates, as in the other frameworks).
template <typename T>
inline bool beats(T v, T best) {
  return v > best || v != v;
}

// The common 2x2 window with stride 2 and no padding, written without per-element bounds logic.
template <typename T>
void max_pool_2x2(const T* x, const PoolGeom& g, T* y, int32_t* idx) {
  const int64_t planes = g.n * g.c;
  cpu::parallel_for(planes, cpu::grain_for(g.h * g.w), [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) {
      const T* xp = x + pl * g.h * g.w;
      T* yp = y + pl * g.oh * g.ow;
      int32_t* ip = idx + pl * g.oh * g.ow;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        const T* r0 = xp + 2 * oh * g.w;
        const T* r1 = r0 + g.w;
        const auto base = static_cast<int32_t>(2 * oh * g.w);
        const auto w = static_cast<int32_t>(g.w);
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          const auto c0 = static_cast<int32_t>(2 * ow);
          T best = r0[2 * ow];
          int32_t bi = base + c0;
          const T v1 = r0[2 * ow + 1], v2 = r1[2 * ow], v3 = r1[2 * ow + 1];
          if (beats(v1, best)) best = v1, bi = base + c0 + 1;
          if (beats(v2, best)) best = v2, bi = base + w + c0;
          if (beats(v3, best)) best = v3, bi = base + w + c0 + 1;
          yp[oh * g.ow + ow] = best;
          ip[oh * g.ow + ow] = bi;
        }
      }
    }
  });
}

template <typename T>
void max_pool_forward(const T* x, const PoolGeom& g, T* y, int32_t* idx) {
  if (g.kh == 2 && g.kw == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 && g.pad_w == 0 &&
      2 * g.oh <= g.h && 2 * g.ow <= g.w)  // no window past the input (ceil mode, trailing padding)
    return max_pool_2x2(x, g, y, idx);
  const int64_t planes = g.n * g.c;
  cpu::parallel_for(planes, cpu::grain_for(g.oh * g.ow * g.kh * g.kw), [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) {
      const T* xp = x + pl * g.h * g.w;
      T* yp = y + pl * g.oh * g.ow;
      int32_t* ip = idx + pl * g.oh * g.ow;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        int64_t h0, h1;
        window(oh, g.stride_h, g.pad_h, g.kh, g.h, h0, h1);
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          int64_t w0, w1;
          window(ow, g.stride_w, g.pad_w, g.kw, g.w, w0, w1);
          // The op layer keeps padding below half the window and starts a ceil-mode window inside the input,
          // so every window holds an input element.
          int64_t bi = h0 * g.w + w0;
          T best = xp[bi];
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) {
              const T v = xp[ih * g.w + iw];
              if (beats(v, best)) best = v, bi = ih * g.w + iw;
            }
          yp[oh * g.ow + ow] = best;
          ip[oh * g.ow + ow] = static_cast<int32_t>(bi);
        }
      }
    }
  });
}

template <typename T>
void max_pool_backward(const T* dy, const int32_t* idx, const PoolGeom& g, T* dx) {
  const int64_t planes = g.n * g.c, in_sz = g.h * g.w, out_sz = g.oh * g.ow;
  cpu::parallel_for(planes, cpu::grain_for(in_sz), [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) {
      T* dxp = dx + pl * in_sz;
      const T* dyp = dy + pl * out_sz;
      const int32_t* ip = idx + pl * out_sz;
      std::memset(dxp, 0, sizeof(T) * in_sz);
      for (int64_t j = 0; j < out_sz; ++j) dxp[ip[j]] += dyp[j];
    }
  });
}

// 1 / the divisor of the window at output position (oh, ow).
template <typename T>
inline T avg_scale(const PoolGeom& g, int64_t oh, int64_t ow) {
  const int64_t rows = window_count(oh, g.stride_h, g.pad_h, g.pad_h_end(), g.kh, g.h, g.count_pad);
  const int64_t cols = window_count(ow, g.stride_w, g.pad_w, g.pad_w_end(), g.kw, g.w, g.count_pad);
  return T(1) / static_cast<T>(rows * cols);
}

template <typename T>
void avg_pool_forward(const T* x, const PoolGeom& g, T* y) {
  const int64_t planes = g.n * g.c;
  cpu::parallel_for(planes, cpu::grain_for(g.oh * g.ow * g.kh * g.kw), [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) {
      const T* xp = x + pl * g.h * g.w;
      T* yp = y + pl * g.oh * g.ow;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        int64_t h0, h1;
        window(oh, g.stride_h, g.pad_h, g.kh, g.h, h0, h1);
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          int64_t w0, w1;
          window(ow, g.stride_w, g.pad_w, g.kw, g.w, w0, w1);
          T s = T(0);
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) s += xp[ih * g.w + iw];
          yp[oh * g.ow + ow] = s * avg_scale<T>(g, oh, ow);
        }
      }
    }
  });
}

template <typename T>
void avg_pool_backward(const T* dy, const PoolGeom& g, T* dx) {
  const int64_t planes = g.n * g.c;
  cpu::parallel_for(planes, cpu::grain_for(g.oh * g.ow * g.kh * g.kw), [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) {
      T* dxp = dx + pl * g.h * g.w;
      const T* dyp = dy + pl * g.oh * g.ow;
      std::memset(dxp, 0, sizeof(T) * g.h * g.w);
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        int64_t h0, h1;
        window(oh, g.stride_h, g.pad_h, g.kh, g.h, h0, h1);
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          int64_t w0, w1;
          window(ow, g.stride_w, g.pad_w, g.kw, g.w, w0, w1);
          const T v = dyp[oh * g.ow + ow] * avg_scale<T>(g, oh, ow);
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) dxp[ih * g.w + iw] += v;
        }
      }
    }
  });
}

void check_pool(const PoolGeom& g, const Tensor& x, const Tensor& y) {
  TANDEM_ASSERT(x.numel() == g.n * g.c * g.h * g.w && y.numel() == g.n * g.c * g.oh * g.ow,
                "pooling geometry does not match ", x.str(), " -> ", y.str());
}

void check_indices(const PoolGeom& g, const Tensor& indices, const Tensor& y) {
  TANDEM_ASSERT(indices.dtype() == DType::i32 && indices.numel() == y.numel(), "max_pool2d indices ", indices.str());
  TANDEM_CHECK(g.h * g.w <= INT32_MAX, "max_pool2d: input planes of ", g.h * g.w,
               " elements exceed the 32-bit index range");
}

}  // namespace

void CpuBackend::max_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y, Tensor& indices) {
  TANDEM_ASSERT(!g.nhwc, "the CPU backend takes NCHW inputs only");
  check_pool(g, x, y);
  check_indices(g, indices, y);
  dispatch_float(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    max_pool_forward<T>(static_cast<const T*>(x.data_ptr()), g, static_cast<T*>(y.data_ptr()),
                        indices.data<int32_t>());
  });
}

void CpuBackend::max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& indices,
                                     const PoolGeom& g, Tensor& dx) {
  TANDEM_ASSERT(!g.nhwc, "the CPU backend takes NCHW inputs only");
  check_pool(g, dx, dy);
  check_indices(g, indices, dy);
  dispatch_float(dy.dtype(), "max_pool2d backward", [&](auto tag) {
    using T = decltype(tag);
    max_pool_backward<T>(static_cast<const T*>(dy.data_ptr()), indices.data<int32_t>(), g,
                         static_cast<T*>(dx.data_ptr()));
  });
}

void CpuBackend::avg_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y) {
  TANDEM_ASSERT(!g.nhwc, "the CPU backend takes NCHW inputs only");
  check_pool(g, x, y);
  dispatch_float(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    avg_pool_forward<T>(static_cast<const T*>(x.data_ptr()), g, static_cast<T*>(y.data_ptr()));
  });
}

void CpuBackend::avg_pool2d_backward(const Tensor& dy, const PoolGeom& g, Tensor& dx) {
  TANDEM_ASSERT(!g.nhwc, "the CPU backend takes NCHW inputs only");
  check_pool(g, dx, dy);
  dispatch_float(dy.dtype(), "avg_pool2d backward", [&](auto tag) {
    using T = decltype(tag);
    avg_pool_backward<T>(static_cast<const T*>(dy.data_ptr()), g, static_cast<T*>(dx.data_ptr()));
  });
}

}  // namespace tandem::backend
