#pragma once
// Internal: what the row-wise kernels (softmax, layer normalisation, losses) share: 16-byte vector loads
// and stores of f32 / f16 / bf16 converted to float, warp and block reductions of floats, and the
// choice of a vector width for a row length and a pair of addresses.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend::rows {

using kern::from_float;
using kern::to_float;

/// N elements of T read or written as one aligned access (16 bytes when N * sizeof(T) == 16).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

/// Loads N consecutive elements at p as floats, 16 bytes (or N elements, when fewer) per access; p is aligned
/// to the access.
template <int N, typename T>
__device__ __forceinline__ void load_floats(const T* __restrict__ p, float (&out)[N]) {
  constexpr int kChunk = N * sizeof(T) <= 16 ? N : 16 / static_cast<int>(sizeof(T));
#pragma unroll
  for (int c0 = 0; c0 < N; c0 += kChunk) {
    const Vec<T, kChunk> v = *reinterpret_cast<const Vec<T, kChunk>*>(p + c0);
#pragma unroll
    for (int u = 0; u < kChunk; ++u) out[c0 + u] = to_float(v.v[u]);
  }
}

/// Stores N floats as T at p, as load_floats reads them.
template <int N, typename T>
__device__ __forceinline__ void store_floats(T* __restrict__ p, const float (&in)[N]) {
  constexpr int kChunk = N * sizeof(T) <= 16 ? N : 16 / static_cast<int>(sizeof(T));
#pragma unroll
  for (int c0 = 0; c0 < N; c0 += kChunk) {
    Vec<T, kChunk> v;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) v.v[u] = from_float<T>(in[c0 + u]);
    *reinterpret_cast<Vec<T, kChunk>*>(p + c0) = v;
  }
}

/// The DType of a device element type.
template <typename T>
constexpr DType device_dtype() {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, __half>)
    return DType::f16;
  else
    return DType::bf16;
}

/// Sum over the warp; every lane gets it.
__device__ __forceinline__ float warp_sum(float v) { return kern::warp_sum(v); }
/// Max over the warp; every lane gets it.
__device__ __forceinline__ float warp_max(float v) { return kern::warp_max(v); }

/// Sum over the block (blockDim.x a multiple of 32); every thread gets it. scratch: 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) { return kern::block_sum(v, scratch); }

/// Max over the block; every thread gets it. scratch: 32 floats of shared memory.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(r);
}

/// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

/// True when rows of c elements of T at every given address can be read 16 bytes at a time.
template <typename T>
inline bool vector_ok(int64_t c, std::initializer_list<const void*> ptrs) {
  if (c % kVec<T> != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

/// A row of elements split so that its middle can be read 16 bytes at a time wherever the row starts:
/// [0, head) before the first 16-byte boundary, whole vectors of VEC elements in [head, body_end), and the
/// rest [body_end, c). With VEC == 1 the whole row is "body".
struct RowSplit {
  int64_t head, body_end;
};

/// The split of the row of c elements of T at p (aligned to sizeof(T)) for VEC-element vectors.
template <int VEC, typename T>
__device__ __forceinline__ RowSplit split_row(const T* p, int64_t c) {
  if constexpr (VEC == 1) {
    return {0, c};
  } else {
    const int64_t mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) & 15) / static_cast<int64_t>(sizeof(T));
    const int64_t head = min(c, mis == 0 ? int64_t(0) : VEC - mis);
    return {head, head + (c - head) / VEC * VEC};
  }
}

/// True when every given address has the same offset from a 16-byte boundary as the first, so that rows at
/// the same element offset split alike (split_row on one of them serves all).
inline bool same_misalignment(std::initializer_list<const void*> ptrs) {
  const void* first = *ptrs.begin();
  for (const void* p : ptrs)
    if (p && first && (reinterpret_cast<uintptr_t>(p) & 15) != (reinterpret_cast<uintptr_t>(first) & 15)) return false;
  return true;
}

/// Vectors per lane (1, 2, 4 or 8) for a warp to hold a row of c elements in registers, or 0 when it does
/// not fit (more than 8 vectors of `vec` elements per lane).
inline int vectors_per_lane(int64_t c, int vec) {
  const int64_t per_lane = (c + 32 * vec - 1) / (32 * vec);
  for (int nv : {1, 2, 4, 8})
    if (per_lane <= nv) return nv;
  return 0;
}

/// Blocks for a grid-stride loop of `warps` warps per block over `rows` rows (one row per warp at a time).
inline unsigned warp_row_blocks(int64_t rows, int warps) {
  const int64_t b = (rows + warps - 1) / warps;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, kern::kMaxBlocks));
}

}  // namespace tandem::backend::rows
