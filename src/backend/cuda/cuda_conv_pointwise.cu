// CUDA kernels of strided pointwise convolutions (1x1 filters, a stride above 1, no padding) in
// channels-last storage: the input positions a stride picks, gathered into rows, and rows spread back
// onto those positions (zeros, or what was there, elsewhere).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

// rows[(n, oh, ow), c] = x[n, oh * sh, ow * sw, c]; 16-byte packs of channels (c a multiple of 8).
__global__ void gather_strided_kernel(const uint4* x, uint4* rows, int64_t n, int64_t h, int64_t w, int64_t packs,
                                      int64_t oh, int64_t ow, int64_t sh, int64_t sw) {
  const int64_t total = n * oh * ow * packs;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t p = i % packs, r = i / packs;
    const int64_t ox = r % ow, oy = (r / ow) % oh, b = r / (ow * oh);
    rows[i] = x[((b * h + oy * sh) * w + ox * sw) * packs + p];
  }
}

// dx[n, y, x, c] = rows[(n, y / sh, x / sw), c] at the picked positions; elsewhere 0, or dx as it was
// with accumulate (whose picked positions then add the rows, in the element type's arithmetic via f32).
template <typename T>
__global__ void scatter_strided_kernel(const T* rows, T* dx, int64_t n, int64_t h, int64_t w, int64_t c, int64_t oh,
                                       int64_t ow, int64_t sh, int64_t sw, bool accumulate) {
  const int64_t total = n * h * w * c;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t ch = i % c, r = i / c;
    const int64_t x = r % w, y = (r / w) % h, b = r / (w * h);
    const bool picked = y % sh == 0 && x % sw == 0 && y / sh < oh && x / sw < ow;
    float v = picked ? static_cast<float>(rows[((b * oh + y / sh) * ow + x / sw) * c + ch]) : 0.0f;
    if (accumulate) v += static_cast<float>(dx[i]);
    if (picked || !accumulate) dx[i] = static_cast<T>(v);
  }
}

}  // namespace

void launch_gather_strided_nhwc(const void* x, void* rows, DType dtype, const ConvGeom& g, cudaStream_t stream) {
  const int64_t packs = g.c * static_cast<int64_t>(dtype_size(dtype)) / 16;
  TANDEM_ASSERT(g.c * static_cast<int64_t>(dtype_size(dtype)) % 16 == 0, "gather_strided: ", g.c, " channels");
  const int64_t total = g.n * g.oh * g.ow * packs;
  if (total == 0) return;
  gather_strided_kernel<<<blocks_for(total), kBlock, 0, stream>>>(static_cast<const uint4*>(x), static_cast<uint4*>(rows),
                                                                   g.n, g.h, g.w, packs, g.oh, g.ow, g.stride_h,
                                                                   g.stride_w);
  TANDEM_CUDA_LAUNCH_CHECK("gather_strided_kernel");
}

void launch_scatter_strided_nhwc(const void* rows, void* dx, DType dtype, const ConvGeom& g, bool accumulate,
                                 cudaStream_t stream) {
  const int64_t total = g.n * g.h * g.w * g.c;
  if (total == 0) return;
  const unsigned blocks = blocks_for(total);
  switch (dtype) {
    case DType::bf16:
      scatter_strided_kernel<<<blocks, kBlock, 0, stream>>>(static_cast<const __nv_bfloat16*>(rows),
                                                             static_cast<__nv_bfloat16*>(dx), g.n, g.h, g.w, g.c, g.oh,
                                                             g.ow, g.stride_h, g.stride_w, accumulate);
      break;
    case DType::f16:
      scatter_strided_kernel<<<blocks, kBlock, 0, stream>>>(static_cast<const __half*>(rows), static_cast<__half*>(dx),
                                                             g.n, g.h, g.w, g.c, g.oh, g.ow, g.stride_h, g.stride_w,
                                                             accumulate);
      break;
    case DType::f32:
      scatter_strided_kernel<<<blocks, kBlock, 0, stream>>>(static_cast<const float*>(rows), static_cast<float*>(dx),
                                                             g.n, g.h, g.w, g.c, g.oh, g.ow, g.stride_h, g.stride_w,
                                                             accumulate);
      break;
    default: TANDEM_CHECK(false, "scatter_strided: ", dtype_name(dtype), " is not supported");
  }
  TANDEM_CUDA_LAUNCH_CHECK("scatter_strided_kernel");
}

}  // namespace tandem::backend
