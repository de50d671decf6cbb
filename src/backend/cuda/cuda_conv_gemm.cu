// The data movement of convolution as matrix products (cuda_conv.cpp times it against cuDNN per
// geometry and keeps the faster): im2col unfolds input patches into columns, col2im gathers column
// gradients back into the input's gradient (each element sums its own patches: no atomics, the
// same bits on every run), and a [n, k, p] -> [k, n, p] transpose lines the output gradient up with
// the columns for the weight gradient. NCHW f32, fewer than 2^30 elements (checked by the caller).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {

using kern::blocks_for;
using kern::kBlock;

struct Geom32 {
  int n, c, h, w, k, r, s, sh, sw, ph, pw, oh, ow;
};

Geom32 narrow(const ConvGeom& g) {
  return {static_cast<int>(g.n),        static_cast<int>(g.c),        static_cast<int>(g.h),
          static_cast<int>(g.w),        static_cast<int>(g.k),        static_cast<int>(g.r),
          static_cast<int>(g.s),        static_cast<int>(g.stride_h), static_cast<int>(g.stride_w),
          static_cast<int>(g.pad_h),    static_cast<int>(g.pad_w),    static_cast<int>(g.oh),
          static_cast<int>(g.ow)};
}

// col[n * stride_n + (c, r, s) * stride_crs + p] = x[n, c, oh * sh - ph + r, ow * sw - pw + s] (0 outside).
// One thread per (n, c, p) writes the whole kernel window of its position: the index arithmetic is
// done once for R * S values, and with R, S known at compile time (> 0) the window unrolls.
template <int R, int S>
__global__ void im2col_kernel(const float* __restrict__ x, float* __restrict__ col, Geom32 g, int stride_n,
                              int stride_crs, int total) {
  const int kr = R > 0 ? R : g.r, ks = S > 0 ? S : g.s;
  const int rs = kr * ks, p_count = g.oh * g.ow;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int p = i % p_count, t = i / p_count;
    const int c = t % g.c, n = t / g.c;
    const int h0 = (p / g.ow) * g.sh - g.ph, w0 = (p % g.ow) * g.sw - g.pw;
    const float* __restrict__ plane = x + static_cast<int64_t>(n * g.c + c) * g.h * g.w;
    float* __restrict__ out = col + static_cast<int64_t>(n) * stride_n + static_cast<int64_t>(c * rs) * stride_crs + p;
#pragma unroll
    for (int r = 0; r < (R > 0 ? R : 64); ++r) {
      if (R == 0 && r >= kr) break;
      const int h = h0 + r;
#pragma unroll
      for (int s = 0; s < (S > 0 ? S : 64); ++s) {
        if (S == 0 && s >= ks) break;
        const int w = w0 + s;
        const bool inside = h >= 0 && h < g.h && w >= 0 && w < g.w;
        out[static_cast<int64_t>(r * ks + s) * stride_crs] = inside ? __ldg(plane + h * g.w + w) : 0.0f;
      }
    }
  }
}

// dx[n, c, h, w] = the sum, over the kernel offsets (r, s) whose output position lies on the grid,
// of dcol[n, (c, r, s), (oh, ow)], in a fixed order. With the kernel size known at compile time (R, S
// > 0) the loop unrolls into independent predicated loads, which the GPU overlaps instead of waiting
// for each in turn.
template <int R, int S>
__global__ void col2im_kernel(const float* __restrict__ dcol, float* __restrict__ dx, Geom32 g, int total) {
  const int kr = R > 0 ? R : g.r, ks = S > 0 ? S : g.s;
  const int rs = kr * ks, p_count = g.oh * g.ow;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int w = i % g.w, h = (i / g.w) % g.h, c = (i / (g.w * g.h)) % g.c, n = i / (g.w * g.h * g.c);
    const float* base = dcol + (static_cast<int64_t>(n) * g.c * rs + c * rs) * p_count;
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < (R > 0 ? R : 64); ++r) {
      if (R == 0 && r >= kr) break;
      const int hh = h + g.ph - r;
      const int oh = hh / g.sh;
      const bool row_ok = hh >= 0 && oh * g.sh == hh && oh < g.oh;
#pragma unroll
      for (int s = 0; s < (S > 0 ? S : 64); ++s) {
        if (S == 0 && s >= ks) break;
        const int ww = w + g.pw - s;
        const int ow = ww / g.sw;
        const bool ok = row_ok && ww >= 0 && ow * g.sw == ww && ow < g.ow;
        acc += ok ? __ldg(base + (r * ks + s) * p_count + oh * g.ow + ow) : 0.0f;
      }
    }
    dx[i] = acc;
  }
}

// out[k, n, p] = in[n, k, p]
__global__ void nkp_to_knp_kernel(const float* __restrict__ in, float* __restrict__ out, int n_count, int k_count,
                                  int p_count, int total) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int p = i % p_count, t = i / p_count;
    const int n = t % n_count, k = t / n_count;
    out[i] = in[(n * k_count + k) * p_count + p];
  }
}

}  // namespace

void launch_im2col(const float* x, float* col, const ConvGeom& g, int64_t stride_n, int64_t stride_crs,
                   cudaStream_t stream) {
  const int64_t total = g.n * g.c * g.oh * g.ow;
  if (total == 0 || g.r * g.s == 0) return;
  const unsigned blocks = blocks_for(total);
  const Geom32 g32 = narrow(g);
  const int sn = static_cast<int>(stride_n), sc = static_cast<int>(stride_crs), n = static_cast<int>(total);
  if (g.r == 5 && g.s == 5)
    im2col_kernel<5, 5><<<blocks, kBlock, 0, stream>>>(x, col, g32, sn, sc, n);
  else if (g.r == 3 && g.s == 3)
    im2col_kernel<3, 3><<<blocks, kBlock, 0, stream>>>(x, col, g32, sn, sc, n);
  else
    im2col_kernel<0, 0><<<blocks, kBlock, 0, stream>>>(x, col, g32, sn, sc, n);
  TANDEM_CUDA_LAUNCH_CHECK("im2col_kernel");
}

void launch_col2im(const float* dcol, float* dx, const ConvGeom& g, cudaStream_t stream) {
  const int64_t total = g.n * g.c * g.h * g.w;
  if (total == 0) return;
  const unsigned blocks = blocks_for(total);
  const Geom32 g32 = narrow(g);
  const int n = static_cast<int>(total);
  if (g.r == 5 && g.s == 5)
    col2im_kernel<5, 5><<<blocks, kBlock, 0, stream>>>(dcol, dx, g32, n);
  else if (g.r == 3 && g.s == 3)
    col2im_kernel<3, 3><<<blocks, kBlock, 0, stream>>>(dcol, dx, g32, n);
  else
    col2im_kernel<0, 0><<<blocks, kBlock, 0, stream>>>(dcol, dx, g32, n);
  TANDEM_CUDA_LAUNCH_CHECK("col2im_kernel");
}

void launch_nkp_to_knp(const float* in, float* out, int64_t n, int64_t k, int64_t p, cudaStream_t stream) {
  const int64_t total = n * k * p;
  if (total == 0) return;
  nkp_to_knp_kernel<<<blocks_for(total), kBlock, 0, stream>>>(in, out, static_cast<int>(n), static_cast<int>(k),
                                                              static_cast<int>(p), static_cast<int>(total));
  TANDEM_CUDA_LAUNCH_CHECK("nkp_to_knp_kernel");
}

}  // namespace tandem::backend
