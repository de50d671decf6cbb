// CUDA kernels: dtype conversion and strided copies, batches gathered from a data set on the device,
// fills, counter-based random fills, dropout masks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "core/counter_rng.h"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

/// Calls f with a value of the device type that stores dtype t.
template <typename F>
void dispatch_device_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::u8: return f(uint8_t{});
  }
  TANDEM_ASSERT(false, "unknown dtype");
}

template <typename T>
constexpr bool is_16bit_float = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <typename T>
__device__ __forceinline__ float half_to_float(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else
    return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T float_to_half(float f) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(f);
  else
    return __float2bfloat16_rn(f);
}

// The same conversion chain as the CPU backend, so both agree bit for bit: into a 16-bit float through
// double then float (one rounding each), out of one through float.
template <typename S, typename D>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else if constexpr (is_16bit_float<D>) {
    double wide;
    if constexpr (is_16bit_float<S>)
      wide = static_cast<double>(half_to_float(v));
    else
      wide = static_cast<double>(v);
    return float_to_half<D>(static_cast<float>(wide));
  } else if constexpr (is_16bit_float<S>) {
    return static_cast<D>(half_to_float(v));
  } else {
    return static_cast<D>(v);
  }
}

constexpr int kMaxDims = 8;

struct StridedLayout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
};

template <typename S, typename D>
__global__ void convert_contiguous_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) dst[i] = convert<S, D>(src[i]);
}

template <typename S, typename D>
__global__ void convert_strided_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n, StridedLayout l) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    int64_t rem = i, off = 0;
    for (int k = l.ndim - 1; k > 0; --k) {
      const int64_t q = rem / l.shape[k];
      off += (rem - q * l.shape[k]) * l.stride[k];
      rem = q;
    }
    off += rem * l.stride[0];
    dst[i] = convert<S, D>(src[off]);
  }
}

// Drops extents of 1 and merges dimensions that are contiguous with the next, so most views need
// few index divisions (a plain copy needs none).
StridedLayout coalesce(const Tensor& t) {
  int64_t shape[64], stride[64];
  int nd = 0;
  TANDEM_CHECK(t.dim() <= 64, "copy: tensors of more than 64 dimensions are not supported, got ", t.str());
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.shape()[d] == 1) continue;
    shape[nd] = t.shape()[d];
    stride[nd] = t.strides()[d];
    ++nd;
  }
  StridedLayout l{};
  int out = 0;
  int64_t cur_shape = 1, cur_stride = 1;
  bool open = false;
  int64_t merged_shape[64], merged_stride[64];
  for (int d = nd - 1; d >= 0; --d) {  // innermost first
    if (open && stride[d] == cur_stride * cur_shape) {
      cur_shape *= shape[d];
      continue;
    }
    if (open) {
      merged_shape[out] = cur_shape;
      merged_stride[out] = cur_stride;
      ++out;
    }
    cur_shape = shape[d];
    cur_stride = stride[d];
    open = true;
  }
  if (open) {
    merged_shape[out] = cur_shape;
    merged_stride[out] = cur_stride;
    ++out;
  }
  TANDEM_CHECK(out <= kMaxDims, "copy: a view with ", out, " non-mergeable dimensions is not supported on CUDA (at most ",
               kMaxDims, "); make it contiguous in steps");
  l.ndim = out;
  for (int k = 0; k < out; ++k) {  // back to outermost first
    l.shape[k] = merged_shape[out - 1 - k];
    l.stride[k] = merged_stride[out - 1 - k];
  }
  return l;
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ p, int64_t n, T v) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) p[i] = v;
}

// The CPU build (x86-64-v3) fuses lo + span * u into one FMA; so does this, explicitly, so that both
// round once and agree exactly.
__global__ void uniform_kernel(float* __restrict__ p, int64_t n, uint64_t seed, uint64_t offset, double lo,
                               double span) {
  for (int64_t i = thread_index(); i < n; i += thread_count())
    p[i] = static_cast<float>(fma(span, rng::uniform(seed, offset + static_cast<uint64_t>(i)), lo));
}

__global__ void normal_kernel(float* __restrict__ p, int64_t n, uint64_t seed, uint64_t offset, double mean,
                              double std) {
  for (int64_t i = thread_index(); i < n; i += thread_count())
    p[i] = static_cast<float>(fma(std, rng::normal(seed, offset + static_cast<uint64_t>(i)), mean));
}

template <typename T>
__global__ void dropout_kernel(T* __restrict__ m, int64_t n, uint64_t seed, uint64_t offset,
                               const unsigned long long* __restrict__ replays, float p, float keep) {
  // Each replay of a recorded step draws from its own range of 2^40 counters.
  offset += static_cast<uint64_t>(*replays) << 40;
  for (int64_t i = thread_index(); i < n; i += thread_count())
    m[i] = kern::from_float<T>(rng::uniform_f(seed, offset + static_cast<uint64_t>(i)) >= p ? keep : 0.0f);
}

// One block row per sample (blockIdx.x), its columns spread over blockIdx.y; four bytes at a time
// where every sample starts 4-byte aligned. The first sample's place in order is read from cursor[0];
// the last block to finish (counted in cursor[1]) advances it by the batch and zeroes the count: every
// block has read it by then.
template <bool kVec4>
__global__ void gather_samples_kernel(const uint8_t* __restrict__ images, const int32_t* __restrict__ labels,
                                      const int32_t* __restrict__ order, long long* cursor, int64_t sample,
                                      float divisor, float* __restrict__ x, int32_t* __restrict__ y) {
  __shared__ long long begin;
  if (threadIdx.x == 0) begin = *reinterpret_cast<volatile long long*>(cursor);
  __syncthreads();
  const int64_t i = blockIdx.x, s = order[begin + i];
  if (blockIdx.y == 0 && threadIdx.x == 0) y[i] = labels[s];
  const uint8_t* src = images + s * sample;
  float* dst = x + i * sample;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x,
                step = static_cast<int64_t>(gridDim.y) * blockDim.x;
  if constexpr (kVec4) {
    for (int64_t j = first; j < sample / 4; j += step) {
      const uchar4 v = reinterpret_cast<const uchar4*>(src)[j];
      reinterpret_cast<float4*>(dst)[j] =
          make_float4(static_cast<float>(v.x) / divisor, static_cast<float>(v.y) / divisor,
                      static_cast<float>(v.z) / divisor, static_cast<float>(v.w) / divisor);
    }
  } else {
    for (int64_t j = first; j < sample; j += step) dst[j] = static_cast<float>(src[j]) / divisor;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // No fence: the block's read of the cursor has completed (every thread's work above used it),
    // and a fence here would wait for the block's stores to drain, a microsecond per batch.
    const unsigned long long blocks = static_cast<unsigned long long>(gridDim.x) * gridDim.y;
    auto* done = reinterpret_cast<unsigned long long*>(cursor + 1);
    if (atomicAdd(done, 1ull) == blocks - 1) {  // the last block: all others have read the cursor
      cursor[0] = begin + gridDim.x;
      *done = 0;
    }
  }
}

// The host value of a fill, converted as the CPU backend converts it, as raw bits.
template <typename T>
uint64_t fill_bits(double value) {
  T v;
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    v = T(static_cast<float>(value));
  else
    v = static_cast<T>(value);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <typename U>
void launch_fill(void* p, int64_t n, uint64_t bits, cudaStream_t stream) {
  U v;
  std::memcpy(&v, &bits, sizeof(U));
  fill_kernel<U><<<blocks_for(n), kBlock, 0, stream>>>(static_cast<U*>(p), n, v);
  TANDEM_CUDA_LAUNCH_CHECK("fill_kernel");
}
}  // namespace

void CudaBackend::copy_strided(const Tensor& src, Tensor& dst) {
  TANDEM_ASSERT(src.numel() == dst.numel() && dst.is_contiguous(), "copy_strided ", src.str(), " -> ", dst.str());
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceState& st = state_for(dst);
  TANDEM_ASSERT(src.device() == dst.device(), "copy_strided across devices");
  const StridedLayout l = coalesce(src);
  const bool contiguous = l.ndim == 0 || (l.ndim == 1 && l.stride[0] == 1);
  if (contiguous && src.dtype() == dst.dtype()) {
    if (src.data_ptr() != dst.data_ptr())
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                        st.stream));
    return;
  }
  dispatch_device_type(src.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_device_type(dst.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      const S* s = static_cast<const S*>(src.data_ptr());
      D* d = static_cast<D*>(dst.data_ptr());
      if (contiguous) {
        convert_contiguous_kernel<S, D><<<blocks_for(n), kBlock, 0, st.stream>>>(s, d, n);
        TANDEM_CUDA_LAUNCH_CHECK("convert_contiguous_kernel");
      } else {
        convert_strided_kernel<S, D><<<blocks_for(n), kBlock, 0, st.stream>>>(s, d, n, l);
        TANDEM_CUDA_LAUNCH_CHECK("convert_strided_kernel");
      }
    });
  });
}

void CudaBackend::fill(Tensor& t, double value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  DeviceState& st = state_for(t);
  uint64_t bits = 0;
  switch (t.dtype()) {
    case DType::f32: bits = fill_bits<float>(value); break;
    case DType::f64: bits = fill_bits<double>(value); break;
    case DType::f16: bits = fill_bits<Half>(value); break;
    case DType::bf16: bits = fill_bits<BFloat16>(value); break;
    case DType::i32: bits = fill_bits<int32_t>(value); break;
    case DType::i64: bits = fill_bits<int64_t>(value); break;
    case DType::u8: bits = fill_bits<uint8_t>(value); break;
  }
  if (bits == 0) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), st.stream));
    return;
  }
  switch (dtype_size(t.dtype())) {
    case 1: return launch_fill<uint8_t>(t.data_ptr(), n, bits, st.stream);
    case 2: return launch_fill<uint16_t>(t.data_ptr(), n, bits, st.stream);
    case 4: return launch_fill<uint32_t>(t.data_ptr(), n, bits, st.stream);
    case 8: return launch_fill<uint64_t>(t.data_ptr(), n, bits, st.stream);
  }
  TANDEM_ASSERT(false, "fill of ", t.str());
}

void CudaBackend::gather_samples(const Tensor& images, const Tensor& labels, const Tensor& order, Tensor& cursor,
                                 float divisor, Tensor& x, Tensor& y) {
  const int64_t n = x.size(0);
  if (n == 0) return;
  TANDEM_CHECK(n <= INT_MAX, "gather_samples: ", n, " samples in one batch");
  DeviceState& st = state_for(x);
  const int64_t sample = images.numel() / std::max<int64_t>(images.size(0), 1);
  const bool vec4 = sample % 4 == 0;
  const int64_t per_block = vec4 ? sample / 4 : sample;
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>(std::clamp<int64_t>((per_block + kBlock - 1) / kBlock, 1, 64)));
  auto kernel = vec4 ? gather_samples_kernel<true> : gather_samples_kernel<false>;
  TANDEM_CHECK(cursor.dtype() == DType::i64 && cursor.numel() == 2 && cursor.device() == x.device(),
               "gather_samples: the cursor must be i64 [2] on ", x.device().str(), ", got ", cursor.str());
  kernel<<<grid, kBlock, 0, st.stream>>>(images.data<uint8_t>(), labels.data<int32_t>(), order.data<int32_t>(),
                                         reinterpret_cast<long long*>(cursor.data<int64_t>()), sample, divisor,
                                         x.data<float>(), y.data<int32_t>());
  TANDEM_CUDA_LAUNCH_CHECK("gather_samples_kernel");
}

void CudaBackend::random_uniform(Tensor& t, uint64_t seed, uint64_t offset, double lo, double hi) {
  require_f32(t, "random_uniform");
  const int64_t n = t.numel();
  if (n == 0) return;
  DeviceState& st = state_for(t);
  uniform_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(static_cast<float*>(t.data_ptr()), n, seed, offset, lo,
                                                           hi - lo);
  TANDEM_CUDA_LAUNCH_CHECK("uniform_kernel");
}

void CudaBackend::random_normal(Tensor& t, uint64_t seed, uint64_t offset, double mean, double std) {
  require_f32(t, "random_normal");
  const int64_t n = t.numel();
  if (n == 0) return;
  DeviceState& st = state_for(t);
  normal_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(static_cast<float*>(t.data_ptr()), n, seed, offset, mean,
                                                          std);
  TANDEM_CUDA_LAUNCH_CHECK("normal_kernel");
}

void CudaBackend::dropout_mask(Tensor& mask, uint64_t seed, uint64_t offset, double p) {
  const int64_t n = mask.numel();
  if (n == 0) return;
  DeviceState& st = state_for(mask);
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  kern::dispatch_float(mask.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(static_cast<T*>(mask.data_ptr()), n, seed, offset,
                                                             st.replays, static_cast<float>(p), keep);
  });
  TANDEM_CUDA_LAUNCH_CHECK("dropout_kernel");
}

namespace {
__global__ void count_replay_kernel(unsigned long long* replays) { *replays += 1; }
}  // namespace

void launch_count_replay(unsigned long long* replays, cudaStream_t stream) {
  count_replay_kernel<<<1, 1, 0, stream>>>(replays);
  TANDEM_CUDA_LAUNCH_CHECK("count_replay_kernel");
}

}  // namespace tandem::backend
