// CUDA kernels of the FP8 casts: the scaled cast to core/fp8.h's codes (with the tensor's maximum taken on
// the way), the transposed cast, the decode, the maximum alone and the scale update. They encode with the same
// functions as the CPU backend, so both give the same bytes; none of them waits for the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "core/fp8.h"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::from_float;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;
using kern::to_float;

// Merges a thread's maximum of abs_bits into amax (raw bits of a non-negative f32, or NaN): a warp's maximum,
// then one atomic per warp. Every thread of the warp must call it.
__device__ __forceinline__ void merge_amax(float* amax, unsigned m) {
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(reinterpret_cast<unsigned*>(amax), m);
}

template <typename S>
__global__ void quantize_kernel(const S* x, const float* scale, uint8_t* q, int64_t n, bool e4m3, float* amax) {
  const float s = *scale;
  unsigned m = 0;
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    const float v = to_float(x[i]);
    q[i] = fp8::encode(v * s, e4m3, true);
    m = max(m, fp8::abs_bits(v));
  }
  if (amax) merge_amax(amax, m);  // after the loop: every lane of the warp takes part
}

template <typename S>
__global__ void amax_kernel(const S* x, int64_t n, float* amax) {
  unsigned m = 0;
  for (int64_t i = thread_index(); i < n; i += thread_count()) m = max(m, fp8::abs_bits(to_float(x[i])));
  merge_amax(amax, m);
}

constexpr int kTile = 32, kTileRows = 8;

// One 32 x 32 tile of x [rows, cols] a block (32 x 8 threads): the codes written along x's rows into q and,
// through shared memory, along x's columns into qt [cols, rows].
template <typename S>
__global__ void quantize_transposed_kernel(const S* x, const float* scale, int64_t rows, int64_t cols, bool e4m3,
                                           uint8_t* q, uint8_t* qt, float* amax) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  unsigned m = 0;
  for (int j = ty; j < kTile; j += kTileRows) {
    const int64_t r = r0 + j, c = c0 + tx;
    if (r < rows && c < cols) {
      const float v = to_float(x[r * cols + c]);
      const uint8_t code = fp8::encode(v * s, e4m3, true);
      if (q) q[r * cols + c] = code;
      tile[j][tx] = code;
      m = max(m, fp8::abs_bits(v));
    }
  }
  if (amax) merge_amax(amax, m);  // blockDim.x is 32: every warp is whole
  __syncthreads();
  for (int j = ty; j < kTile; j += kTileRows) {
    const int64_t c = c0 + j, r = r0 + tx;
    if (c < cols && r < rows) qt[c * rows + r] = tile[tx][j];
  }
}

template <typename D>
__global__ void dequantize_kernel(const uint8_t* q, const float* scale_inv, D* y, int64_t n, bool e4m3) {
  const float si = *scale_inv;
  for (int64_t i = thread_index(); i < n; i += thread_count()) y[i] = from_float<D>(fp8::decode(q[i], e4m3) * si);
}

__global__ void scale_update_kernel(float* history, int64_t rows, int64_t count, float* scale, float* scale_inv,
                                    float fp8_max, float margin_factor, bool use_history_max, float* verdict) {
  for (int64_t i = thread_index(); i < count; i += thread_count()) {
    const bool finite =
        fp8::update_scale(history, rows, count, i, scale, scale_inv, fp8_max, margin_factor, use_history_max);
    if (!finite && verdict) *verdict = __int_as_float(0x7fc00000);
  }
}

void check_one_f32(const Tensor& t, const char* op, const char* what) {
  TANDEM_CHECK(t.dtype() == DType::f32 && t.numel() == 1 && t.device().is_cuda(), op, ": ", what,
               " must be one f32 value on a GPU, got ", t.str());
}

float* optional_amax(const Tensor& amax, const char* op) {
  if (!amax.defined()) return nullptr;
  check_one_f32(amax, op, "amax");
  return amax.data<float>();
}

void check_codes(const Tensor& q, int64_t n, const char* op) {
  TANDEM_CHECK(q.dtype() == DType::u8 && q.numel() == n && q.device().is_cuda(), op, ": codes ", q.str(), " for ",
               n, " elements (u8 on a GPU)");
}

// Calls f with x's elements as their device type: f32, bf16 or f16.
template <typename F>
void with_source(const Tensor& x, const char* op, F&& f) {
  switch (x.dtype()) {
    case DType::f32: return f(static_cast<const float*>(x.data_ptr()));
    case DType::bf16: return f(static_cast<const __nv_bfloat16*>(x.data_ptr()));
    case DType::f16: return f(static_cast<const __half*>(x.data_ptr()));
    default: TANDEM_CHECK(false, op, ": ", x.str(), " is not f32, bf16 or f16");
  }
}

}  // namespace

void CudaBackend::fp8_amax(const Tensor& x, Tensor& amax) {
  check_one_f32(amax, "fp8_amax", "amax");
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceState& st = state_for(x);
  with_source(x, "fp8_amax", [&](auto* in) {
    amax_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(in, n, amax.data<float>());
  });
  TANDEM_CUDA_LAUNCH_CHECK("fp8 amax_kernel");
}

void CudaBackend::fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format fmt, Tensor& q, Tensor& amax) {
  check_one_f32(scale, "fp8_quantize", "the scale");
  const int64_t n = x.numel();
  check_codes(q, n, "fp8_quantize");
  float* am = optional_amax(amax, "fp8_quantize");
  if (n == 0) return;
  DeviceState& st = state_for(x);
  with_source(x, "fp8_quantize", [&](auto* in) {
    quantize_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(in, scale.data<float>(),
                                                             static_cast<uint8_t*>(q.data_ptr()), n,
                                                             fmt == Fp8Format::e4m3, am);
  });
  TANDEM_CUDA_LAUNCH_CHECK("fp8 quantize_kernel");
}

void CudaBackend::fp8_quantize_transposed(const Tensor& x, const Tensor& scale, Fp8Format fmt, int64_t rows,
                                          int64_t cols, Tensor& q, Tensor& qt, Tensor& amax) {
  const char* op = "fp8_quantize_transposed";
  check_one_f32(scale, op, "the scale");
  TANDEM_CHECK(x.numel() == rows * cols, op, ": ", x.str(), " is not [", rows, ", ", cols, "]");
  check_codes(qt, rows * cols, op);
  if (q.defined()) check_codes(q, rows * cols, op);
  float* am = optional_amax(amax, op);
  if (rows == 0 || cols == 0) return;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  TANDEM_CHECK(row_tiles < 65536, op, ": ", rows, " rows are more than this kernel's grid takes");
  DeviceState& st = state_for(x);
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles));
  const dim3 block(kTile, kTileRows);
  uint8_t* qp = q.defined() ? static_cast<uint8_t*>(q.data_ptr()) : nullptr;
  with_source(x, op, [&](auto* in) {
    quantize_transposed_kernel<<<grid, block, 0, st.stream>>>(in, scale.data<float>(), rows, cols,
                                                              fmt == Fp8Format::e4m3, qp,
                                                              static_cast<uint8_t*>(qt.data_ptr()), am);
  });
  TANDEM_CUDA_LAUNCH_CHECK("fp8 quantize_transposed_kernel");
}

void CudaBackend::fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format fmt, Tensor& y) {
  check_one_f32(scale_inv, "fp8_dequantize", "scale_inv");
  const int64_t n = y.numel();
  check_codes(q, n, "fp8_dequantize");
  if (n == 0) return;
  DeviceState& st = state_for(y);
  const uint8_t* in = static_cast<const uint8_t*>(q.data_ptr());
  const bool e4 = fmt == Fp8Format::e4m3;
  switch (y.dtype()) {
    case DType::f32:
      dequantize_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(in, scale_inv.data<float>(), y.data<float>(), n, e4);
      break;
    case DType::bf16:
      dequantize_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(
          in, scale_inv.data<float>(), static_cast<__nv_bfloat16*>(y.data_ptr()), n, e4);
      break;
    case DType::f16:
      dequantize_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(in, scale_inv.data<float>(),
                                                                 static_cast<__half*>(y.data_ptr()), n, e4);
      break;
    default: TANDEM_CHECK(false, "fp8_dequantize: output ", y.str(), " is not f32, bf16 or f16");
  }
  TANDEM_CUDA_LAUNCH_CHECK("fp8 dequantize_kernel");
}

void CudaBackend::fp8_scale_update(Tensor& history, Tensor& scale, Tensor& scale_inv, float fp8_max,
                                   float margin_factor, bool use_history_max, Tensor& verdict) {
  TANDEM_CHECK(history.dtype() == DType::f32 && history.dim() == 2 && history.device().is_cuda() &&
                   scale.dtype() == DType::f32 && scale_inv.dtype() == DType::f32 &&
                   scale.numel() == history.size(1) && scale_inv.numel() == history.size(1) && history.size(0) >= 1,
               "fp8_scale_update: history ", history.str(), ", scale ", scale.str(), ", scale_inv ", scale_inv.str());
  float* v = nullptr;
  if (verdict.defined()) {
    check_one_f32(verdict, "fp8_scale_update", "the verdict");
    v = verdict.data<float>();
  }
  const int64_t count = history.size(1);
  if (count == 0) return;
  DeviceState& st = state_for(history);
  scale_update_kernel<<<blocks_for(count), kBlock, 0, st.stream>>>(history.data<float>(), history.size(0), count,
                                                                   scale.data<float>(), scale_inv.data<float>(),
                                                                   fp8_max, margin_factor, use_history_max, v);
  TANDEM_CUDA_LAUNCH_CHECK("fp8 scale_update_kernel");
}

void CudaBackend::fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                           const Tensor& b_scale_inv, int64_t m, int64_t n, int64_t k, Tensor& c) {
  if (lt_fp8_matmul(a, fa, a_scale_inv, b, fb, b_scale_inv, m, n, k, c)) return;
  Backend::fp8_gemm(a, fa, a_scale_inv, b, fb, b_scale_inv, m, n, k, c);
}

}  // namespace tandem::backend
