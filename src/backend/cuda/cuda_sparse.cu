// CUDA kernels for the distributed optimizer's gradient compression: scaled 16-bit casts, exact
// top-k selection by magnitude (radix select, no sort and no host synchronisation), threshold
// selection, and scattering (index, value) pairs back into dense buckets.
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

template <typename T>
__device__ __forceinline__ float load_f(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return v;
}
template <typename T>
__device__ __forceinline__ T store_f(float v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else return v;
}

template <typename S, typename D>
__global__ void scale_cast_kernel(const S* in, D* out, int64_t n, float scale, float clip) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    float v = load_f(in[i]) * scale;
    if (clip > 0.0f) v = fminf(fmaxf(v, -clip), clip);
    out[i] = store_f<D>(v);
  }
}

template <typename S>
void launch_scale_cast_to(const S* in, const Tensor& dst, int64_t n, float scale, float clip, cudaStream_t st) {
  unsigned g = blocks_for(n);
  switch (dst.dtype()) {
    case DType::f32: scale_cast_kernel<<<g, kBlock, 0, st>>>(in, static_cast<float*>(dst.data_ptr()), n, scale, clip); break;
    case DType::f16: scale_cast_kernel<<<g, kBlock, 0, st>>>(in, static_cast<__half*>(dst.data_ptr()), n, scale, clip); break;
    case DType::bf16:
      scale_cast_kernel<<<g, kBlock, 0, st>>>(in, static_cast<__nv_bfloat16*>(dst.data_ptr()), n, scale, clip);
      break;
    default: TANDEM_CHECK(false, "scale_cast: destination must be f32, f16 or bf16, got ", dst.str());
  }
  TANDEM_CUDA_LAUNCH_CHECK("scale_cast_kernel");
}

// Magnitude as an ordered key: for non-negative floats the bit pattern orders like the value.
__device__ __forceinline__ uint32_t mag_key(float v) { return __float_as_uint(v) & 0x7fffffffu; }

struct SelectState {
  uint32_t prefix;    // key bits fixed so far
  uint32_t mask;      // which bits of prefix are fixed
  uint32_t k_rem;     // how many of the elements matching prefix are still to be taken
  uint32_t n_above;   // compaction: elements with key > threshold written so far
  uint32_t n_equal;   // compaction: elements with key == threshold seen so far
};

__global__ void select_init_kernel(SelectState* s, uint32_t k) { *s = SelectState{0u, 0u, k, 0u, 0u}; }

__global__ void radix_histogram_kernel(const float* g, int64_t n, const SelectState* s, int shift, uint32_t* hist) {
  __shared__ uint32_t local[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
  __syncthreads();
  const uint32_t prefix = s->prefix, mask = s->mask;
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    uint32_t key = mag_key(g[i]);
    if ((key & mask) == prefix) atomicAdd(&local[(key >> shift) & 0xffu], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    if (local[i]) atomicAdd(&hist[i], local[i]);
}

// One block of 256 threads: picks the digit holding the k_rem-th largest key among those matching.
__global__ void radix_pick_kernel(SelectState* s, int shift, const uint32_t* hist) {
  __shared__ uint32_t counts[256];
  const int t = threadIdx.x;
  counts[t] = hist[t];
  __syncthreads();
  if (t == 0) {
    uint32_t k = s->k_rem, above = 0;
    int d = 255;
    for (; d > 0; --d) {
      if (above + counts[d] >= k) break;
      above += counts[d];
    }
    s->prefix |= static_cast<uint32_t>(d) << shift;
    s->mask |= 0xffu << shift;
    s->k_rem = k - above;
  }
}

// Writes every element above the threshold key, then exactly k_rem of those equal to it.
__global__ void topk_compact_kernel(const float* g, int64_t n, int64_t k, SelectState* s, int32_t* pairs) {
  const uint32_t thr = s->prefix;
  const uint32_t k_rem = s->k_rem;
  const uint32_t base_equal = static_cast<uint32_t>(k) - k_rem;
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    float v = g[i];
    uint32_t key = mag_key(v);
    int64_t slot = -1;
    if (key > thr) {
      slot = atomicAdd(&s->n_above, 1u);
    } else if (key == thr) {
      uint32_t e = atomicAdd(&s->n_equal, 1u);
      if (e < k_rem) slot = base_equal + e;
    }
    if (slot >= 0) {
      pairs[2 * slot] = static_cast<int32_t>(i);
      pairs[2 * slot + 1] = __float_as_int(v);
    }
  }
}

__global__ void threshold_compact_kernel(const float* g, int64_t n, float thr, int32_t* pairs,
                                         unsigned long long* count) {
  const int lane = threadIdx.x & 31;
  // Every lane of the warp walks the loop the same number of times, so the ballot sees all 32.
  const int64_t stride = thread_count();
  const int64_t start = thread_index();
  const int64_t rounds = (n + stride - 1) / stride;
  for (int64_t r = 0; r < rounds; ++r) {
    int64_t i = start + r * stride;
    float v = i < n ? g[i] : 0.0f;
    bool take = i < n && fabsf(v) >= thr;
    unsigned ballot = __ballot_sync(0xffffffffu, take);
    if (!ballot) continue;
    unsigned long long base = 0;
    if (lane == 0) base = atomicAdd(count, static_cast<unsigned long long>(__popc(ballot)));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (take) {
      unsigned long long slot = base + __popc(ballot & ((1u << lane) - 1u));
      pairs[2 * slot] = static_cast<int32_t>(i);
      pairs[2 * slot + 1] = __float_as_int(v);
    }
  }
}

__global__ void sparse_accumulate_kernel(float* dense, const int32_t* pairs, int64_t n, float scale) {
  for (int64_t i = thread_index(); i < n; i += thread_count())
    dense[pairs[2 * i]] += scale * __int_as_float(pairs[2 * i + 1]);
}

__global__ void sparse_zero_kernel(float* dense, const int32_t* pairs, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) dense[pairs[2 * i]] = 0.0f;
}

}  // namespace

void CudaBackend::scale_cast(const Tensor& src, Tensor& dst, double scale, double clip) {
  DeviceState& st = state_for(src);
  const int64_t n = src.numel();
  if (n == 0) return;
  float s = static_cast<float>(scale), c = static_cast<float>(clip);
  switch (src.dtype()) {
    case DType::f32: return launch_scale_cast_to(src.data<float>(), dst, n, s, c, st.stream);
    case DType::f16: return launch_scale_cast_to(static_cast<const __half*>(src.data_ptr()), dst, n, s, c, st.stream);
    case DType::bf16:
      return launch_scale_cast_to(static_cast<const __nv_bfloat16*>(src.data_ptr()), dst, n, s, c, st.stream);
    default: TANDEM_CHECK(false, "scale_cast: source must be f32, f16 or bf16, got ", src.str());
  }
}

void CudaBackend::sparse_topk(const Tensor& g, int64_t k, Tensor& pairs) {
  require_f32(g, "sparse_topk");
  DeviceState& st = state_for(g);
  const int64_t n = g.numel();
  TANDEM_ASSERT(k >= 1 && k <= n && pairs.numel() == 2 * k && n < (int64_t(1) << 31));
  Allocator& alloc = allocator(st.device);
  Scratch state(alloc, sizeof(SelectState));
  Scratch hist(alloc, 256 * sizeof(uint32_t));
  // Initialised by a kernel: a copy from pageable host memory would synchronise the stream.
  select_init_kernel<<<1, 1, 0, st.stream>>>(state.as<SelectState>(), static_cast<uint32_t>(k));
  TANDEM_CUDA_LAUNCH_CHECK("select_init_kernel");
  unsigned blocks = blocks_for(n);
  for (int shift = 24; shift >= 0; shift -= 8) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(hist.as<uint32_t>(), 0, 256 * sizeof(uint32_t), st.stream));
    radix_histogram_kernel<<<blocks, kBlock, 0, st.stream>>>(g.data<float>(), n, state.as<SelectState>(), shift,
                                                              hist.as<uint32_t>());
    TANDEM_CUDA_LAUNCH_CHECK("radix_histogram_kernel");
    radix_pick_kernel<<<1, 256, 0, st.stream>>>(state.as<SelectState>(), shift, hist.as<uint32_t>());
    TANDEM_CUDA_LAUNCH_CHECK("radix_pick_kernel");
  }
  topk_compact_kernel<<<blocks, kBlock, 0, st.stream>>>(g.data<float>(), n, k, state.as<SelectState>(),
                                                         pairs.data<int32_t>());
  TANDEM_CUDA_LAUNCH_CHECK("topk_compact_kernel");
}

void CudaBackend::sparse_threshold(const Tensor& g, double threshold, Tensor& pairs, Tensor& count) {
  require_f32(g, "sparse_threshold");
  DeviceState& st = state_for(g);
  const int64_t n = g.numel();
  TANDEM_ASSERT(pairs.numel() >= 2 * n && count.dtype() == DType::i64 && n < (int64_t(1) << 31));
  auto* cnt = static_cast<unsigned long long*>(count.data_ptr());
  TANDEM_CUDA_CHECK(cudaMemsetAsync(cnt, 0, sizeof(unsigned long long), st.stream));
  if (n == 0) return;
  threshold_compact_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(g.data<float>(), n, static_cast<float>(threshold),
                                                                     pairs.data<int32_t>(), cnt);
  TANDEM_CUDA_LAUNCH_CHECK("threshold_compact_kernel");
}

void CudaBackend::sparse_accumulate(Tensor& dense, const Tensor& pairs, int64_t n, double scale) {
  require_f32(dense, "sparse_accumulate");
  DeviceState& st = state_for(dense);
  if (n == 0) return;
  sparse_accumulate_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(dense.data<float>(), pairs.data<int32_t>(), n,
                                                                     static_cast<float>(scale));
  TANDEM_CUDA_LAUNCH_CHECK("sparse_accumulate_kernel");
}

void CudaBackend::sparse_zero(Tensor& dense, const Tensor& pairs, int64_t n) {
  require_f32(dense, "sparse_zero");
  DeviceState& st = state_for(dense);
  if (n == 0) return;
  sparse_zero_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(dense.data<float>(), pairs.data<int32_t>(), n);
  TANDEM_CUDA_LAUNCH_CHECK("sparse_zero_kernel");
}

}  // namespace tandem::backend
