#pragma once
// Internal: launch geometry, grid-stride loops, reductions, 16-byte packs and fast division shared by the
// CUDA kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "tandem/dtype.h"
#include "tandem/error.h"

namespace tandem::backend::kern {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 16;

/// Blocks for a grid-stride loop over n items: one item per thread up to a cap, past which threads loop
/// (the grid stays far below CUDA's limits whatever n is).
inline unsigned blocks_for(int64_t n, int block = kBlock) {
  int64_t b = (n + block - 1) / block;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, kMaxBlocks));
}

__device__ __forceinline__ int64_t thread_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t thread_count() { return int64_t(blockDim.x) * gridDim.x; }

/// Sum over the 32 lanes of a warp; every lane gets the result.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Max over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
/// scratch holds 32 values; the block must not use it concurrently.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = lane < warps ? scratch[lane] : T(0);
  return warp_sum(r);
}

/// Division of unsigned 32-bit values below 2^31 by a fixed divisor through a multiply and a shift.
struct FastDiv {
  uint32_t divisor = 1, magic = 1, shift = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint32_t(1) << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, magic);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t(n) * magic) >> 32);
#endif
    return (t + n) >> shift;
  }
  __host__ __device__ __forceinline__ uint32_t mod(uint32_t n) const { return n - div(n) * divisor; }
};

/// V elements moved by one 16-byte (or narrower) load or store.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, typename T, typename I>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, I i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}

template <int V, typename T, typename I>
__device__ __forceinline__ void store_pack(T* p, I i, const Pack<T, V>& x) {
  *reinterpret_cast<Pack<T, V>*>(p + i) = x;
}

/// How many elements of T one 16-byte access moves.
template <typename T>
constexpr int pack_width() {
  return static_cast<int>(16 / sizeof(T));
}

/// True when every pointer (null ones aside) allows 16-byte accesses.
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

/// Floating element types a kernel may store: f32, f16, bf16. Arithmetic happens in float.
template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else
    return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float f) {
  if constexpr (std::is_same_v<T, float>)
    return f;
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(f);
  else
    return __float2bfloat16_rn(f);
}

/// Calls f with a value of the device type stored by a floating dtype (f32, f16, bf16); throws naming
/// op for any other dtype.
template <typename F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
    default:
      TANDEM_CHECK(false, op, ": dtype ", dtype_name(t), " is not supported on CUDA (use f32, f16 or bf16)");
  }
}

}  // namespace tandem::backend::kern
