// Direct kernels for small stride-1 NCHW f32 convolutions with square 3x3 or 5x5 filters (the guide's
// CNN: 1 -> 20 and 20 -> 50 channels at batch 64), where cuDNN's kernels and the im2col products are
// bound by their own passes over memory and launches rather than by arithmetic. cuda_conv.cpp times
// them against the other paths per geometry, inside a recorded graph, and checks their results
// against the other path before taking them. Exact f32 arithmetic, sums in a fixed order.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {

struct Geom32 {
  int n, c, h, w, k, ph, pw, oh, ow;
};

Geom32 narrow(const ConvGeom& g) {
  return {static_cast<int>(g.n),  static_cast<int>(g.c),     static_cast<int>(g.h),
          static_cast<int>(g.w),  static_cast<int>(g.k),     static_cast<int>(g.pad_h),
          static_cast<int>(g.pad_w), static_cast<int>(g.oh), static_cast<int>(g.ow)};
}

constexpr int kFwdChannels = 8;           // output channels per forward block (two float4)
constexpr int kFwdThreads = 64;
constexpr int kSmemFloats = 12 * 1024;    // 48 KiB of shared memory

// y[n][k][oh][ow0 + t] for t < TW and kFwdChannels output channels: each thread keeps a strip of TW
// outputs of every channel of its block in registers; the block's filters sit in shared memory.
// With bias, y gets b[k] added; with relu, y = max(y, 0) after that.
template <int KS, int TW>
__global__ void __launch_bounds__(kFwdThreads) direct_fwd_kernel(const float* __restrict__ x,
                                                                 const float* __restrict__ w,
                                                                 const float* __restrict__ bias, float* __restrict__ y,
                                                                 Geom32 g, int strips_per_row, bool relu) {
  // [c][KS][KS][kFwdChannels]: a tap's eight channel weights are two 16-byte shared-memory loads.
  extern __shared__ float4 wsm4[];
  float* wsm = reinterpret_cast<float*>(wsm4);
  const int n = blockIdx.z, k0 = blockIdx.y * kFwdChannels;
  const int kcount = min(kFwdChannels, g.k - k0);
  const int per_k = g.c * KS * KS;
  for (int i = threadIdx.x; i < kFwdChannels * per_k; i += blockDim.x) {
    const int kb = i / per_k, tap = i % per_k;
    wsm[tap * kFwdChannels + kb] = kb < kcount ? w[static_cast<int64_t>(k0) * per_k + i] : 0.0f;
  }
  __syncthreads();
  const int strip = blockIdx.x * blockDim.x + threadIdx.x;
  if (strip >= g.oh * strips_per_row) return;
  const int oh = strip / strips_per_row, ow0 = (strip % strips_per_row) * TW;
  float acc[kFwdChannels][TW];
#pragma unroll
  for (int kb = 0; kb < kFwdChannels; ++kb)
#pragma unroll
    for (int t = 0; t < TW; ++t) acc[kb][t] = 0.0f;
  for (int c = 0; c < g.c; ++c) {
    const float* __restrict__ plane = x + (static_cast<int64_t>(n) * g.c + c) * g.h * g.w;
#pragma unroll
    for (int r = 0; r < KS; ++r) {
      const int ih = oh + r - g.ph;
      if (ih < 0 || ih >= g.h) continue;
      float xr[TW + KS - 1];
#pragma unroll
      for (int t = 0; t < TW + KS - 1; ++t) {
        const int iw = ow0 + t - g.pw;
        xr[t] = iw >= 0 && iw < g.w ? __ldg(plane + ih * g.w + iw) : 0.0f;
      }
      const float4* wr = wsm4 + (c * KS + r) * KS * (kFwdChannels / 4);
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const float4 lo = wr[s * 2], hi = wr[s * 2 + 1];
        const float wv[kFwdChannels] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int kb = 0; kb < kFwdChannels; ++kb)
#pragma unroll
          for (int t = 0; t < TW; ++t) acc[kb][t] = fmaf(wv[kb], xr[t + s], acc[kb][t]);
      }
    }
  }
#pragma unroll
  for (int kb = 0; kb < kFwdChannels; ++kb) {
    if (kb >= kcount) break;
    float* out = y + ((static_cast<int64_t>(n) * g.k + k0 + kb) * g.oh + oh) * g.ow;
    const float bv = bias ? bias[k0 + kb] : 0.0f;
#pragma unroll
    for (int t = 0; t < TW; ++t) {
      const float v = acc[kb][t] + bv;
      if (ow0 + t < g.ow) out[ow0 + t] = relu ? fmaxf(v, 0.0f) : v;
    }
  }
}

// One block per (part of the batch and of the output rows, input channel c, group of output
// channels); thread (kb, r) sums, for its KS filter taps (kb, c, r, 0..KS-1), dy times the input
// under them over its part. The input plane, zero-padded, sits in shared memory. Each part's sums go
// to partial[part][k][c][r][s]; dw is their total, taken by direct_wgrad_total_kernel in part order.
template <int KS>
__global__ void direct_wgrad_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                    float* __restrict__ partial, Geom32 g, int per_chunk, int row_splits,
                                    int k_group) {
  extern __shared__ float xs[];  // [rows of the part + KS - 1][w + 2 pw]
  const int part = blockIdx.x, chunk = part / row_splits, split = part % row_splits;
  const int c = blockIdx.y, k0 = blockIdx.z * k_group;
  const int kb = threadIdx.x / KS, r = threadIdx.x % KS;
  const int k = k0 + kb;
  const bool active = kb < k_group && k < g.k;
  const int pw_w = g.w + 2 * g.pw;
  const int rows = (g.oh + row_splits - 1) / row_splits;
  const int oh_begin = split * rows, oh_end = min(g.oh, oh_begin + rows);
  const int n_begin = chunk * per_chunk, n_end = min(g.n, n_begin + per_chunk);
  float acc[KS];
#pragma unroll
  for (int s = 0; s < KS; ++s) acc[s] = 0.0f;
  for (int n = n_begin; n < n_end; ++n) {
    __syncthreads();
    const float* __restrict__ plane = x + (static_cast<int64_t>(n) * g.c + c) * g.h * g.w;
    // Only the padded rows under this part's output rows: oh_begin .. oh_end + KS - 2.
    for (int i = threadIdx.x; i < (oh_end - oh_begin + KS - 1) * pw_w; i += blockDim.x) {
      const int ih = oh_begin + i / pw_w - g.ph, iw = i % pw_w - g.pw;
      xs[i] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? __ldg(plane + ih * g.w + iw) : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const float* __restrict__ d = dy + (static_cast<int64_t>(n) * g.k + k) * g.oh * g.ow;
    for (int oh = oh_begin; oh < oh_end; ++oh) {
      const float* xrow = xs + (oh - oh_begin + r) * pw_w;
      const float* drow = d + oh * g.ow;
      // Four outputs at a time: their KS + 3 inputs read once from shared memory for 4 x KS products.
      for (int ow0 = 0; ow0 < g.ow; ow0 += 4) {
        float dv[4], xv[KS + 3];
#pragma unroll
        for (int t = 0; t < 4; ++t) dv[t] = ow0 + t < g.ow ? __ldg(drow + ow0 + t) : 0.0f;
#pragma unroll
        for (int t = 0; t < KS + 3; ++t) xv[t] = ow0 + t < pw_w ? xrow[ow0 + t] : 0.0f;
#pragma unroll
        for (int t = 0; t < 4; ++t)
          if (ow0 + t < g.ow)  // the same products, in the same order, as one output at a time
#pragma unroll
            for (int s = 0; s < KS; ++s) acc[s] = fmaf(dv[t], xv[t + s], acc[s]);
      }
    }
  }
  if (!active) return;
  const int64_t per_part = static_cast<int64_t>(g.k) * g.c * KS * KS;
  float* out = partial + part * per_part + ((static_cast<int64_t>(k) * g.c + c) * KS + r) * KS;
#pragma unroll
  for (int s = 0; s < KS; ++s) out[s] = acc[s];
}

// One warp per weight: lane l sums parts l, l + 32, ... in order, then the lanes' sums are combined
// by a fixed tree, so the total is the same bits on every run.
constexpr int kTotalWarps = 8;
__global__ void __launch_bounds__(kTotalWarps * 32) direct_wgrad_total_kernel(const float* __restrict__ partial,
                                                                              float* __restrict__ dw, int64_t count,
                                                                              int parts) {
  const int lane = threadIdx.x & 31;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kTotalWarps) + threadIdx.x / 32;
  if (i >= count) return;  // whole warps leave together
  float sum = 0.0f;
  for (int p = lane; p < parts; p += 32) sum += partial[p * count + i];
  sum = kern::warp_sum(sum);
  if (lane == 0) dw[i] = sum;
}

// How the weight gradient's work is split: parts of the batch and of the output rows, enough blocks
// to give every SM two.
struct WgradSplit {
  int per_chunk, chunks, row_splits, k_group, k_groups;
  int parts() const { return chunks * row_splits; }
};

WgradSplit wgrad_split(const ConvGeom& g, int sm_count) {
  WgradSplit sp{};
  const int ks = static_cast<int>(g.r);
  sp.k_group = std::min(static_cast<int>(g.k), 256 / ks);
  sp.k_groups = static_cast<int>((g.k + sp.k_group - 1) / sp.k_group);
  sp.row_splits = g.oh >= 16 ? 4 : 1;
  const int64_t others = g.c * sp.k_groups * sp.row_splits;
  const int64_t want = std::max<int64_t>(1, (2 * sm_count + others - 1) / others);
  sp.chunks = static_cast<int>(std::min<int64_t>(g.n, want));
  sp.per_chunk = static_cast<int>((g.n + sp.chunks - 1) / sp.chunks);
  sp.chunks = static_cast<int>((g.n + sp.per_chunk - 1) / sp.per_chunk);
  return sp;
}

}  // namespace

bool direct_conv_fits(const ConvGeom& g) {
  if (g.groups != 1 || g.nhwc || g.stride_h != 1 || g.stride_w != 1 || g.r != g.s || (g.r != 3 && g.r != 5))
    return false;
  if (g.pad_h >= g.r || g.pad_w >= g.s || g.n * g.c * g.h * g.w >= (int64_t(1) << 31) ||
      g.n * g.k * g.oh * g.ow >= (int64_t(1) << 31) || g.n >= 65536)
    return false;
  const int64_t filters = kFwdChannels * g.c * g.r * g.s;
  const int64_t padded_plane = (g.h + 2 * g.pad_h) * (g.w + 2 * g.pad_w);
  return filters <= kSmemFloats && padded_plane <= kSmemFloats;
}

size_t direct_wgrad_bytes(const ConvGeom& g, int sm_count) {
  const WgradSplit sp = wgrad_split(g, sm_count);
  return sp.parts() <= 1 ? 0 : static_cast<size_t>(sp.parts()) * static_cast<size_t>(g.k * g.c * g.r * g.s) * 4;
}

void launch_direct_forward(const float* x, const float* w, const float* bias, bool relu, float* y, const ConvGeom& g,
                           cudaStream_t stream) {
  const Geom32 g32 = narrow(g);
  const int tw = g.ow >= 16 ? 4 : 1;
  const int strips_per_row = static_cast<int>((g.ow + tw - 1) / tw);
  const int strips = static_cast<int>(g.oh) * strips_per_row;
  const dim3 grid((strips + kFwdThreads - 1) / kFwdThreads,
                  static_cast<unsigned>((g.k + kFwdChannels - 1) / kFwdChannels), static_cast<unsigned>(g.n));
  const size_t smem = static_cast<size_t>(kFwdChannels * g.c * g.r * g.s) * sizeof(float);
  if (g.r == 5 && tw == 4)
    direct_fwd_kernel<5, 4><<<grid, kFwdThreads, smem, stream>>>(x, w, bias, y, g32, strips_per_row, relu);
  else if (g.r == 5)
    direct_fwd_kernel<5, 1><<<grid, kFwdThreads, smem, stream>>>(x, w, bias, y, g32, strips_per_row, relu);
  else if (tw == 4)
    direct_fwd_kernel<3, 4><<<grid, kFwdThreads, smem, stream>>>(x, w, bias, y, g32, strips_per_row, relu);
  else
    direct_fwd_kernel<3, 1><<<grid, kFwdThreads, smem, stream>>>(x, w, bias, y, g32, strips_per_row, relu);
  TANDEM_CUDA_LAUNCH_CHECK("direct_fwd_kernel");
}

void launch_direct_wgrad(const float* dy, const float* x, float* dw, float* partial, const ConvGeom& g, int sm_count,
                         cudaStream_t stream) {
  const Geom32 g32 = narrow(g);
  const WgradSplit sp = wgrad_split(g, sm_count);
  float* out = sp.parts() <= 1 ? dw : partial;
  const dim3 grid(static_cast<unsigned>(sp.parts()), static_cast<unsigned>(g.c), static_cast<unsigned>(sp.k_groups));
  const int threads = sp.k_group * static_cast<int>(g.r);
  const int64_t rows = (g.oh + sp.row_splits - 1) / sp.row_splits;
  const size_t smem = static_cast<size_t>((rows + g.r - 1) * (g.w + 2 * g.pad_w)) * sizeof(float);
  if (g.r == 5)
    direct_wgrad_kernel<5><<<grid, threads, smem, stream>>>(dy, x, out, g32, sp.per_chunk, sp.row_splits, sp.k_group);
  else
    direct_wgrad_kernel<3><<<grid, threads, smem, stream>>>(dy, x, out, g32, sp.per_chunk, sp.row_splits, sp.k_group);
  TANDEM_CUDA_LAUNCH_CHECK("direct_wgrad_kernel");
  if (sp.parts() > 1) {
    const int64_t count = g.k * g.c * g.r * g.s;
    const auto blocks = static_cast<unsigned>((count + kTotalWarps - 1) / kTotalWarps);
    direct_wgrad_total_kernel<<<blocks, kTotalWarps * 32, 0, stream>>>(partial, dw, count, sp.parts());
    TANDEM_CUDA_LAUNCH_CHECK("direct_wgrad_total_kernel");
  }
}

}  // namespace tandem::backend
