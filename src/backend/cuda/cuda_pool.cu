// CUDA kernels: 2-D max and average pooling (NCHW) and their backward passes. The backward passes
// gather (each input element sums the windows that cover it), so they need no atomics and add in the
// same order as a forward-order scatter.
#include <cfloat>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

struct PoolArgs {
  int64_t planes, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
};

PoolArgs pool_args(const PoolGeom& g) {
  return {g.n * g.c, g.h, g.w, g.kh, g.kw, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.oh, g.ow};
}

// Max over the window's in-bounds positions; the first maximum in row-major order wins ties, a NaN
// propagates, and padding never takes part (a window always holds an input position: the op layer keeps pad <= k/2).
__global__ void max_pool_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int32_t* __restrict__ idx,
                                        PoolArgs a) {
  const int64_t total = a.planes * a.oh * a.ow;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t ox = i % a.ow;
    const int64_t t = i / a.ow;
    const int64_t oy = t % a.oh;
    const int64_t plane = t / a.oh;
    const int64_t h0 = oy * a.sh - a.ph, w0 = ox * a.sw - a.pw;
    const int64_t hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;
    const int64_t he = h0 + a.kh < a.h ? h0 + a.kh : a.h, we = w0 + a.kw < a.w ? w0 + a.kw : a.w;
    const float* xp = x + plane * a.h * a.w;
    int64_t best_i = hs * a.w + ws;
    float best = xp[best_i];
    for (int64_t r = hs; r < he; ++r)
      for (int64_t col = ws; col < we; ++col) {
        const float v = xp[r * a.w + col];
        if (v > best || v != v) {  // a NaN wins, as on the CPU
          best = v;
          best_i = r * a.w + col;
        }
      }
    y[i] = best;
    idx[i] = static_cast<int32_t>(best_i);
  }
}

// First and one-past-last output index along one axis whose window covers input position p.
__device__ __forceinline__ void covering(int64_t p, int64_t pad, int64_t k, int64_t stride, int64_t out,
                                         int64_t& first, int64_t& last) {
  const int64_t q = p + pad;
  first = q < k ? 0 : (q - k) / stride + 1;
  last = q / stride + 1;
  if (last > out) last = out;
}

__global__ void max_pool_backward_kernel(const float* __restrict__ dy, const int32_t* __restrict__ idx,
                                         float* __restrict__ dx, PoolArgs a) {
  const int64_t total = a.planes * a.h * a.w;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t col = i % a.w;
    const int64_t t = i / a.w;
    const int64_t row = t % a.h;
    const int64_t plane = t / a.h;
    int64_t y0, y1, x0, x1;
    covering(row, a.ph, a.kh, a.sh, a.oh, y0, y1);
    covering(col, a.pw, a.kw, a.sw, a.ow, x0, x1);
    const int32_t self = static_cast<int32_t>(row * a.w + col);
    const int64_t base = plane * a.oh * a.ow;
    float acc = 0.0f;
    for (int64_t oy = y0; oy < y1; ++oy)
      for (int64_t ox = x0; ox < x1; ++ox) {
        const int64_t o = base + oy * a.ow + ox;
        if (idx[o] == self) acc += dy[o];
      }
    dx[i] = acc;
  }
}

// Mean over the window with padding counted as zeros: the divisor is always kh * kw.
__global__ void avg_pool_forward_kernel(const float* __restrict__ x, float* __restrict__ y, PoolArgs a) {
  const int64_t total = a.planes * a.oh * a.ow;
  const float inv = 1.0f / static_cast<float>(a.kh * a.kw);
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t ox = i % a.ow;
    const int64_t t = i / a.ow;
    const int64_t oy = t % a.oh;
    const int64_t plane = t / a.oh;
    const int64_t h0 = oy * a.sh - a.ph, w0 = ox * a.sw - a.pw;
    const int64_t hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;
    const int64_t he = h0 + a.kh < a.h ? h0 + a.kh : a.h, we = w0 + a.kw < a.w ? w0 + a.kw : a.w;
    const float* xp = x + plane * a.h * a.w;
    float acc = 0.0f;
    for (int64_t r = hs; r < he; ++r)
      for (int64_t col = ws; col < we; ++col) acc += xp[r * a.w + col];
    y[i] = acc * inv;
  }
}

__global__ void avg_pool_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, PoolArgs a) {
  const int64_t total = a.planes * a.h * a.w;
  const float inv = 1.0f / static_cast<float>(a.kh * a.kw);
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t col = i % a.w;
    const int64_t t = i / a.w;
    const int64_t row = t % a.h;
    const int64_t plane = t / a.h;
    int64_t y0, y1, x0, x1;
    covering(row, a.ph, a.kh, a.sh, a.oh, y0, y1);
    covering(col, a.pw, a.kw, a.sw, a.ow, x0, x1);
    const float* dp = dy + plane * a.oh * a.ow;
    float acc = 0.0f;
    for (int64_t oy = y0; oy < y1; ++oy)
      for (int64_t ox = x0; ox < x1; ++ox) acc += dp[oy * a.ow + ox] * inv;
    dx[i] = acc;
  }
}

void check_pool(const PoolGeom& g, const char* op) {
  TANDEM_ASSERT(g.kh >= 1 && g.kw >= 1 && g.stride_h >= 1 && g.stride_w >= 1 && 2 * g.pad_h <= g.kh &&
                    2 * g.pad_w <= g.kw,
                op, ": pooling geometry");
  TANDEM_CHECK(g.h * g.w <= INT32_MAX, op, ": planes of more than 2^31 elements are not supported");
}
}  // namespace

void CudaBackend::max_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y, Tensor& indices) {
  require_f32(x, "max_pool2d");
  require_f32(y, "max_pool2d");
  TANDEM_CHECK(indices.dtype() == DType::i32, "max_pool2d: indices must be i32, got ", indices.str());
  check_pool(g, "max_pool2d");
  const PoolArgs a = pool_args(g);
  const int64_t total = a.planes * a.oh * a.ow;
  TANDEM_ASSERT(y.numel() == total && indices.numel() == total && x.numel() == a.planes * a.h * a.w, "max_pool2d shapes");
  if (total == 0) return;
  DeviceState& st = state_for(y);
  max_pool_forward_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(x.data<float>(), y.data<float>(),
                                                                      indices.data<int32_t>(), a);
  TANDEM_CUDA_LAUNCH_CHECK("max_pool_forward_kernel");
}

void CudaBackend::max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& indices,
                                      const PoolGeom& g, Tensor& dx) {
  require_f32(dy, "max_pool2d backward");
  require_f32(dx, "max_pool2d backward");
  TANDEM_CHECK(indices.dtype() == DType::i32, "max_pool2d backward: indices must be i32, got ", indices.str());
  check_pool(g, "max_pool2d backward");
  const PoolArgs a = pool_args(g);
  const int64_t total = a.planes * a.h * a.w;
  TANDEM_ASSERT(dx.numel() == total && dy.numel() == a.planes * a.oh * a.ow && indices.numel() == dy.numel(),
                "max_pool2d backward shapes");
  if (total == 0) return;
  DeviceState& st = state_for(dx);
  max_pool_backward_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(dy.data<float>(), indices.data<int32_t>(),
                                                                       dx.data<float>(), a);
  TANDEM_CUDA_LAUNCH_CHECK("max_pool_backward_kernel");
}

void CudaBackend::avg_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y) {
  require_f32(x, "avg_pool2d");
  require_f32(y, "avg_pool2d");
  check_pool(g, "avg_pool2d");
  const PoolArgs a = pool_args(g);
  const int64_t total = a.planes * a.oh * a.ow;
  TANDEM_ASSERT(y.numel() == total && x.numel() == a.planes * a.h * a.w, "avg_pool2d shapes");
  if (total == 0) return;
  DeviceState& st = state_for(y);
  avg_pool_forward_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(x.data<float>(), y.data<float>(), a);
  TANDEM_CUDA_LAUNCH_CHECK("avg_pool_forward_kernel");
}

void CudaBackend::avg_pool2d_backward(const Tensor& dy, const PoolGeom& g, Tensor& dx) {
  require_f32(dy, "avg_pool2d backward");
  require_f32(dx, "avg_pool2d backward");
  check_pool(g, "avg_pool2d backward");
  const PoolArgs a = pool_args(g);
  const int64_t total = a.planes * a.h * a.w;
  TANDEM_ASSERT(dx.numel() == total && dy.numel() == a.planes * a.oh * a.ow, "avg_pool2d backward shapes");
  if (total == 0) return;
  DeviceState& st = state_for(dx);
  avg_pool_backward_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(dy.data<float>(), dx.data<float>(), a);
  TANDEM_CUDA_LAUNCH_CHECK("avg_pool_backward_kernel");
}

}  // namespace tandem::backend
