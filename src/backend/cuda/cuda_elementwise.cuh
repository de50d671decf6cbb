#pragma once
// Internal: the generic elementwise kernel of the CUDA backend. One functor per op
// (backend/elementwise_functors.h) runs in it; operands are read through their strides (0 where
// broadcast) over the walk backend/elementwise.h builds. The op families' instantiations are compiled
// apart (cuda_elementwise_{unary,grad,binary}.cu), and none of them depends on the backend's interface,
// so that they are built in parallel and not again when that interface changes.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "backend/elementwise.h"
#include "backend/elementwise_functors.h"

namespace tandem::backend::ewcuda {

/// One elementwise launch: the output (dense, walked in its storage order) and n operands, all of one
/// dtype, with the walk over them.
struct Launch {
  DType dtype;
  void* out;
  const void* in[ew::kMaxArgs - 1];
  ew::Geometry g;
  cudaStream_t stream;
};

// The launchers of each op family (dtypes checked by the caller).
void unary(Unary op, const EwArgs& args, const Launch& l);
void unary_grad(Unary op, const EwArgs& args, const Launch& l);
void binary(Binary op, const Launch& l);
void ternary(Ternary op, const Launch& l);
void axpy(double alpha, const Launch& l);

// ---- the kernel
/// The type a stored type computes in: float for f32, f16 and bf16; integers as themselves.
template <typename T>
using Compute = std::conditional_t<std::is_integral_v<T>, T, float>;

template <typename T>
__device__ __forceinline__ Compute<T> load_c(T v) {
  if constexpr (std::is_integral_v<T>)
    return v;
  else
    return kern::to_float(v);
}

template <typename T>
__device__ __forceinline__ T store_c(Compute<T> v) {
  if constexpr (std::is_integral_v<T>)
    return v;
  else
    return kern::from_float<T>(v);
}

template <typename T, int N>
struct Operands {
  const T* p[N];
};

template <int N, typename F, typename C>
__device__ __forceinline__ C call(const F& f, const C (&x)[N]) {
  if constexpr (N == 1)
    return f(x[0]);
  else if constexpr (N == 2)
    return f(x[0], x[1]);
  else
    return f(x[0], x[1], x[2]);
}

/// Every operand read in the output's order or one element (bit k of `scalar`): packs of V elements move
/// in 16-byte accesses in a grid-stride loop, the tail one by one.
template <int V, int N, typename T, typename F>
__global__ void __launch_bounds__(kern::kBlock) ew_flat_kernel(F f, T* out, Operands<T, N> in, unsigned scalar,
                                                               int64_t n) {
  using C = Compute<T>;
  C sv[N];
#pragma unroll
  for (int k = 0; k < N; ++k) sv[k] = (scalar >> k) & 1u ? load_c(in.p[k][0]) : C(0);
  const int64_t packs = n / V;
  for (int64_t p = kern::thread_index(); p < packs; p += kern::thread_count()) {
    kern::Pack<T, V> v[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (!((scalar >> k) & 1u)) v[k] = kern::load_pack<V>(in.p[k], p * V);
    kern::Pack<T, V> o;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      C x[N];
#pragma unroll
      for (int k = 0; k < N; ++k) x[k] = (scalar >> k) & 1u ? sv[k] : load_c(v[k].v[u]);
      o.v[u] = store_c<T>(call<N>(f, x));
    }
    kern::store_pack<V>(out, p * V, o);
  }
  for (int64_t i = packs * V + kern::thread_index(); i < n; i += kern::thread_count()) {
    C x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = (scalar >> k) & 1u ? sv[k] : load_c(in.p[k][i]);
    out[i] = store_c<T>(call<N>(f, x));
  }
}

/// The walk as the strided kernel takes it: fewer than 2^31 elements, extents with multiply-shift division.
template <int N>
struct Walk {
  int ndim;
  kern::FastDiv sizes[ew::kMaxDims];
  int64_t strides[N][ew::kMaxDims];
};

/// Any strides: output element i is split into the walk's coordinates (innermost first), which give each
/// operand's offset.
template <int N, typename T, typename F>
__global__ void __launch_bounds__(kern::kBlock) ew_strided_kernel(F f, T* out, Operands<T, N> in, Walk<N> w,
                                                                  uint32_t n) {
  using C = Compute<T>;
  for (uint32_t i = static_cast<uint32_t>(kern::thread_index()); i < n;
       i += static_cast<uint32_t>(kern::thread_count())) {
    uint32_t q = i;
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = w.ndim - 1; d > 0; --d) {
      const uint32_t next = w.sizes[d].div(q);
      const int64_t r = static_cast<int64_t>(q - next * w.sizes[d].divisor);
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * w.strides[k][d];
      q = next;
    }
    C x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = load_c(in.p[k][off[k] + static_cast<int64_t>(q) * w.strides[k][0]]);
    out[i] = store_c<T>(call<N>(f, x));
  }
}

// ---- launching it (host)
inline constexpr int64_t kStridedLimit = (int64_t(1) << 31) - 1;

/// The strided kernel over g (n elements from out and in[]): walks of kStridedLimit elements or more are
/// cut along their outermost dimension into pieces below it.
template <int N, typename T, typename F>
void launch_strided(const F& f, T* out, const T* const* in, const ew::Geometry& g, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (n < kStridedLimit) {
    Walk<N> w{};
    w.ndim = g.ndim;
    for (int d = 0; d < g.ndim; ++d) {
      w.sizes[d] = kern::FastDiv(static_cast<uint32_t>(g.sizes[d]));
      for (int k = 0; k < N; ++k) w.strides[k][d] = g.strides[k][d];
    }
    Operands<T, N> ops;
    for (int k = 0; k < N; ++k) ops.p[k] = in[k];
    ew_strided_kernel<N><<<kern::blocks_for(n), kern::kBlock, 0, stream>>>(f, out, ops, w,
                                                                           static_cast<uint32_t>(n));
    TANDEM_CUDA_LAUNCH_CHECK("ew_strided_kernel");
    return;
  }
  const int64_t inner = n / g.sizes[0];
  const T* sub_in[N];
  if (inner < kStridedLimit) {  // pieces of whole rows of the outermost dimension
    const int64_t rows = kStridedLimit / inner;
    for (int64_t r0 = 0; r0 < g.sizes[0]; r0 += rows) {
      ew::Geometry piece = g;
      piece.sizes[0] = std::min(rows, g.sizes[0] - r0);
      for (int k = 0; k < N; ++k) sub_in[k] = in[k] + r0 * g.strides[k][0];
      launch_strided<N>(f, out + r0 * inner, sub_in, piece, piece.sizes[0] * inner, stream);
    }
    return;
  }
  ew::Geometry rest = g;  // one row at a time: the walk of the inner dimensions
  rest.ndim = g.ndim - 1;
  for (int d = 0; d < rest.ndim; ++d) {
    rest.sizes[d] = g.sizes[d + 1];
    for (int k = 0; k < N; ++k) rest.strides[k][d] = g.strides[k][d + 1];
  }
  for (int64_t r = 0; r < g.sizes[0]; ++r) {
    for (int k = 0; k < N; ++k) sub_in[k] = in[k] + r * g.strides[k][0];
    launch_strided<N>(f, out + r * inner, sub_in, rest, inner, stream);
  }
}

/// Runs functor f over the launch: the vectorised kernel when every operand is in the output's order (or
/// one element) and the pointers allow 16-byte accesses, else the strided one.
template <typename T, int N, typename F>
void run(const F& f, const Launch& l) {
  const ew::Geometry& g = l.g;
  T* out = static_cast<T*>(l.out);
  const T* in[N];
  for (int k = 0; k < N; ++k) in[k] = static_cast<const T*>(l.in[k]);
  if (g.numel == 0) return;
  if (g.flat()) {
    constexpr int V = kern::pack_width<T>();
    unsigned scalar = 0;
    bool aligned = kern::aligned16({out});
    for (int k = 0; k < N; ++k) {
      if (g.strides[k][0] == 0)
        scalar |= 1u << k;
      else
        aligned = aligned && kern::aligned16({in[k]});
    }
    if (aligned) {
      Operands<T, N> ops;
      for (int k = 0; k < N; ++k) ops.p[k] = in[k];
      ew_flat_kernel<V, N><<<kern::blocks_for(std::max<int64_t>(g.numel / V, 1)), kern::kBlock, 0, l.stream>>>(
          f, out, ops, scalar, g.numel);
      TANDEM_CUDA_LAUNCH_CHECK("ew_flat_kernel");
      return;
    }
  }
  launch_strided<N>(f, out, in, g, g.numel, l.stream);
}

/// Calls f(tag) with the device type stored by a floating dtype (f32, f16, bf16), or by i32 / i64 when
/// ints (the caller checked the dtype).
template <typename F>
void dispatch_types(DType t, bool ints, const char* op, F&& f) {
  if (ints && t == DType::i32) return f(int32_t{});
  if (ints && t == DType::i64) return f(int64_t{});
  kern::dispatch_float(t, op, f);
}

}  // namespace tandem::backend::ewcuda
