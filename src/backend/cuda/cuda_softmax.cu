// CUDA kernels: softmax and log-softmax along any axis (f32, f16, bf16; arithmetic in f32), their
// backward, and the scaled, causally masked softmax of attention scores.
//
// Rows (the normalised axis last) that fit in registers go one warp per row: the row is read once with
// 16-byte loads, the maximum and the sum of exponentials are warp shuffles, and the result is written
// once. Longer rows take one block per row (an online maximum and sum in one pass, then the write).
// A normalised axis with others after it is walked by one thread per column, so that neighbouring
// threads read neighbouring addresses.
#include <algorithm>
#include <initializer_list>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "backend/cuda/cuda_rowwise.cuh"

namespace tandem::backend {

namespace {

using kern::from_float;
using kern::to_float;
using rows::load_floats;
using rows::store_floats;
using rows::warp_max;
using rows::warp_sum;

constexpr int kWarps = 4;           // warps per block of the warp-per-row kernels
constexpr int kRowThreads = 512;    // threads of the block-per-row kernels

// Adds v to an online (maximum m, sum s of exp(x - m)) pair.
__device__ __forceinline__ void add_value(float& m, float& s, float v) {
  if (v == -INFINITY) return;  // adds nothing (and exp(-inf - -inf) would be NaN)
  if (v > m) {
    s = s * __expf(m - v) + 1.0f;
    m = v;
  } else {
    s += __expf(v - m);
  }
}

// Which entries of a row count: all c, or with a causal mask (tq > 0) the first (row % tq) + 1.
__device__ __forceinline__ int64_t valid_length(int64_t row, int64_t c, int64_t causal_tq) {
  return causal_tq > 0 ? min(c, row % causal_tq + 1) : c;
}

// One warp per row, the row held in NV vectors of VEC elements per lane (element (v * 32 + lane) * VEC + u).
// y may be x (the row is read whole before it is written).
template <typename T, int VEC, int NV>
__global__ void softmax_warp_kernel(const T* x, T* y, int64_t n, int64_t c, float scale,
                                    int64_t causal_tq, bool log) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = kern::thread_index() >> 5; r < n; r += warps) {
    const T* xr = x + r * c;
    const int64_t valid = valid_length(r, c, causal_tq);
    float v[NV][VEC];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t col = (int64_t(k) * 32 + lane) * VEC;
      if (col < c) {
        load_floats<VEC>(xr + col, v[k]);
      } else {
#pragma unroll
        for (int u = 0; u < VEC; ++u) v[k][u] = 0.0f;
      }
#pragma unroll
      for (int u = 0; u < VEC; ++u) {
        v[k][u] = col + u < valid ? v[k][u] * scale : -INFINITY;
        mx = fmaxf(mx, v[k][u]);
      }
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
      for (int u = 0; u < VEC; ++u) {
        const float e = __expf(v[k][u] - mx);  // masked entries: exp(-inf) = 0
        sum += e;
        if (!log) v[k][u] = e;
      }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum, lse = mx + __logf(sum);
    T* yr = y + r * c;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t col = (int64_t(k) * 32 + lane) * VEC;
      if (col < c) {
        float o[VEC];
#pragma unroll
        for (int u = 0; u < VEC; ++u) o[u] = log ? v[k][u] - lse : v[k][u] * inv;
        store_floats<VEC>(yr + col, o);
      }
    }
  }
}

// Adds VEC values to an online (maximum, sum) pair with one rescale (the vector's maximum first).
template <int VEC>
__device__ __forceinline__ void add_vector(float& m, float& s, const float (&v)[VEC]) {
  float mv = v[0];
#pragma unroll
  for (int u = 1; u < VEC; ++u) mv = fmaxf(mv, v[u]);
  if (mv == -INFINITY) return;
  if (mv > m) {
    s *= __expf(m - mv);
    m = mv;
  }
  float part = 0.0f;
#pragma unroll
  for (int u = 0; u < VEC; ++u) part += __expf(v[u] - m);
  s += part;
}

// One block per row for rows too long for a warp's registers: an online maximum and sum of exponentials
// in one pass, then the output; the middle of each row 16 bytes at a time wherever the row starts (x and y
// split alike). Each element is read and written by the same thread: y may be x.
template <typename T, int VEC>
__global__ void softmax_block_kernel(const T* x, T* y, int64_t n, int64_t c, float scale, int64_t causal_tq,
                                     bool log) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = x + r * c;
    T* yr = y + r * c;
    const int64_t valid = valid_length(r, c, causal_tq);
    const rows::RowSplit sp = rows::split_row<VEC>(xr, c);
    auto masked = [&](float v, int64_t j) { return j < valid ? v * scale : -INFINITY; };
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x) add_value(m, s, masked(to_float(xr[j]), j));
    for (int64_t j0 = sp.head + int64_t(threadIdx.x) * VEC; j0 < sp.body_end; j0 += int64_t(blockDim.x) * VEC) {
      float v[VEC];
      load_floats<VEC>(xr + j0, v);
#pragma unroll
      for (int u = 0; u < VEC; ++u) v[u] = masked(v[u], j0 + u);
      add_vector<VEC>(m, s, v);
    }
    for (int64_t j = sp.body_end + threadIdx.x; j < c; j += blockDim.x) add_value(m, s, masked(to_float(xr[j]), j));
    const float mx = rows::block_max(m, scratch);
    const float part = m == -INFINITY ? 0.0f : s * __expf(m - mx);
    const float sum = rows::block_sum(part, scratch);
    const float inv = 1.0f / sum, lse = mx + __logf(sum);
    // Masked entries: probability 0, log-probability -inf.
    auto out = [&](float v, int64_t j) {
      const float w = masked(v, j);
      return log ? w - lse : __expf(w - mx) * inv;
    };
    for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x) yr[j] = from_float<T>(out(to_float(xr[j]), j));
    for (int64_t j0 = sp.head + int64_t(threadIdx.x) * VEC; j0 < sp.body_end; j0 += int64_t(blockDim.x) * VEC) {
      float v[VEC];
      load_floats<VEC>(xr + j0, v);
#pragma unroll
      for (int u = 0; u < VEC; ++u) v[u] = out(v[u], j0 + u);
      store_floats<VEC>(yr + j0, v);
    }
    for (int64_t j = sp.body_end + threadIdx.x; j < c; j += blockDim.x) yr[j] = from_float<T>(out(to_float(xr[j]), j));
  }
}

// The normalised axis followed by `inner` others: one thread per (outer, inner) column, c elements inner apart.
template <typename T>
__global__ void softmax_strided_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t c,
                                       int64_t inner, bool log) {
  const int64_t cols = outer * inner;
  for (int64_t q = kern::thread_index(); q < cols; q += kern::thread_count()) {
    const int64_t base = (q / inner) * c * inner + q % inner;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < c; ++j) {
      add_value(m, s, to_float(x[base + j * inner]));
    }
    const float inv = 1.0f / s, lse = m + __logf(s);
    for (int64_t j = 0; j < c; ++j) {
      const float v = to_float(x[base + j * inner]);
      y[base + j * inner] = from_float<T>(log ? v - lse : __expf(v - m) * inv);
    }
  }
}

// Backward, one warp per row: dx = y (dy - sum dy y), or with log dx = dy - exp(y) sum dy. dx may be dy.
template <typename T, int VEC, int NV>
__global__ void softmax_backward_warp_kernel(const T* dy, const T* __restrict__ y, T* dx, int64_t n, int64_t c,
                                             bool log) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = kern::thread_index() >> 5; r < n; r += warps) {
    float g[NV][VEC], p[NV][VEC];
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t col = (int64_t(k) * 32 + lane) * VEC;
      if (col < c) {
        load_floats<VEC>(dy + r * c + col, g[k]);
        load_floats<VEC>(y + r * c + col, p[k]);
      } else {
#pragma unroll
        for (int u = 0; u < VEC; ++u) g[k][u] = p[k][u] = 0.0f;
      }
#pragma unroll
      for (int u = 0; u < VEC; ++u) acc += log ? g[k][u] : g[k][u] * p[k][u];
    }
    acc = warp_sum(acc);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t col = (int64_t(k) * 32 + lane) * VEC;
      if (col < c) {
        float o[VEC];
#pragma unroll
        for (int u = 0; u < VEC; ++u) o[u] = log ? g[k][u] - __expf(p[k][u]) * acc : p[k][u] * (g[k][u] - acc);
        store_floats<VEC>(dx + r * c + col, o);
      }
    }
  }
}

// Backward, one block per row (dy, y and dx split alike; dx may be dy).
template <typename T, int VEC>
__global__ void softmax_backward_block_kernel(const T* dy, const T* __restrict__ y, T* dx, int64_t n, int64_t c,
                                              bool log) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* gr = dy + r * c;
    const T* pr = y + r * c;
    T* dr = dx + r * c;
    const rows::RowSplit sp = rows::split_row<VEC>(pr, c);
    auto term = [&](float g, float p) { return log ? g : g * p; };
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x) acc += term(to_float(gr[j]), to_float(pr[j]));
    for (int64_t j0 = sp.head + int64_t(threadIdx.x) * VEC; j0 < sp.body_end; j0 += int64_t(blockDim.x) * VEC) {
      float g[VEC], p[VEC];
      load_floats<VEC>(gr + j0, g);
      load_floats<VEC>(pr + j0, p);
#pragma unroll
      for (int u = 0; u < VEC; ++u) acc += term(g[u], p[u]);
    }
    for (int64_t j = sp.body_end + threadIdx.x; j < c; j += blockDim.x) acc += term(to_float(gr[j]), to_float(pr[j]));
    acc = rows::block_sum(acc, scratch);
    auto grad = [&](float g, float p) { return log ? g - __expf(p) * acc : p * (g - acc); };
    for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x) dr[j] = from_float<T>(grad(to_float(gr[j]), to_float(pr[j])));
    for (int64_t j0 = sp.head + int64_t(threadIdx.x) * VEC; j0 < sp.body_end; j0 += int64_t(blockDim.x) * VEC) {
      float g[VEC], p[VEC];
      load_floats<VEC>(gr + j0, g);
      load_floats<VEC>(pr + j0, p);
#pragma unroll
      for (int u = 0; u < VEC; ++u) g[u] = grad(g[u], p[u]);
      store_floats<VEC>(dr + j0, g);
    }
    for (int64_t j = sp.body_end + threadIdx.x; j < c; j += blockDim.x)
      dr[j] = from_float<T>(grad(to_float(gr[j]), to_float(pr[j])));
  }
}

template <typename T>
__global__ void softmax_backward_strided_kernel(const T* dy, const T* __restrict__ y, T* dx, int64_t outer, int64_t c,
                                                int64_t inner, bool log) {
  const int64_t cols = outer * inner;
  for (int64_t q = kern::thread_index(); q < cols; q += kern::thread_count()) {
    const int64_t base = (q / inner) * c * inner + q % inner;
    float acc = 0.0f;
    for (int64_t j = 0; j < c; ++j) {
      const int64_t i = base + j * inner;
      acc += log ? to_float(dy[i]) : to_float(dy[i]) * to_float(y[i]);
    }
    for (int64_t j = 0; j < c; ++j) {
      const int64_t i = base + j * inner;
      const float g = to_float(dy[i]), p = to_float(y[i]);
      dx[i] = from_float<T>(log ? g - __expf(p) * acc : p * (g - acc));
    }
  }
}

// Calls f(std::integral_constant VEC, NV) for the warp kernel that holds rows of c, or returns false.
template <typename T, typename F>
bool with_warp_shape(int64_t c, std::initializer_list<const void*> ptrs, F&& f) {
  constexpr int V = rows::kVec<T>;
  const bool vec = rows::vector_ok<T>(c, ptrs);
  const int nv = rows::vectors_per_lane(c, vec ? V : 1);
  if (nv == 0) return false;
  auto go = [&](auto vtag) {
    constexpr int VV = decltype(vtag)::value;
    switch (nv) {
      case 1: f(std::integral_constant<int, VV>{}, std::integral_constant<int, 1>{}); break;
      case 2: f(std::integral_constant<int, VV>{}, std::integral_constant<int, 2>{}); break;
      case 4: f(std::integral_constant<int, VV>{}, std::integral_constant<int, 4>{}); break;
      default: f(std::integral_constant<int, VV>{}, std::integral_constant<int, 8>{}); break;
    }
  };
  if (vec)
    go(std::integral_constant<int, V>{});
  else
    go(std::integral_constant<int, 1>{});
  return true;
}

__global__ void attention_rng_state_kernel(uint64_t seed, uint64_t offset, const unsigned long long* replays,
                                           int64_t* out) {
  out[0] = static_cast<int64_t>(seed);
  out[1] = static_cast<int64_t>(offset + (static_cast<uint64_t>(*replays) << 40));
}

unsigned row_block_grid(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>(n, 1, kern::kMaxBlocks)); }

template <typename T>
void launch_softmax_rows(const T* x, T* y, int64_t n, int64_t c, float scale, int64_t causal_tq, bool log,
                         cudaStream_t stream) {
  const bool warp = with_warp_shape<T>(c, {x, y}, [&](auto vtag, auto ntag) {
    constexpr int V = decltype(vtag)::value, NV = decltype(ntag)::value;
    softmax_warp_kernel<T, V, NV><<<rows::warp_row_blocks(n, kWarps), kWarps * 32, 0, stream>>>(x, y, n, c, scale,
                                                                                                causal_tq, log);
  });
  if (!warp) {
    if (rows::same_misalignment({x, y}))
      softmax_block_kernel<T, rows::kVec<T>><<<row_block_grid(n), kRowThreads, 0, stream>>>(x, y, n, c, scale,
                                                                                          causal_tq, log);
    else
      softmax_block_kernel<T, 1><<<row_block_grid(n), kRowThreads, 0, stream>>>(x, y, n, c, scale, causal_tq, log);
  }
  TANDEM_CUDA_LAUNCH_CHECK("softmax kernel");
}

void check_types(const char* op, std::initializer_list<const Tensor*> ts) {
  const DType t = (*ts.begin())->dtype();
  for (const Tensor* x : ts)
    TANDEM_CHECK(x->dtype() == t, op, ": ", x->str(), " and ", (*ts.begin())->str(), " differ in dtype");
}

// Scores of keys before a query's document: -1e30 (attention_mask_documents), one thread per score.
template <typename T>
__global__ void mask_documents_kernel(T* s, const int32_t* __restrict__ pos, int64_t n, int64_t tq, int64_t tk,
                                      int64_t heads) {
  for (int64_t e = kern::thread_index(); e < n; e += kern::thread_count()) {
    const int64_t r = e / tk, j = e % tk, i = r % tq, b = r / tq / heads;
    if (j < i - pos[b * tq + i]) s[e] = static_cast<T>(-1e30f);
  }
}
}  // namespace

void CudaBackend::attention_mask_documents(Tensor& s, int64_t heads, const Tensor& doc_pos) {
  TANDEM_ASSERT(s.dim() == 3 && s.is_contiguous() && (s.dtype() == DType::f32 || s.dtype() == DType::f64) &&
                    doc_pos.dtype() == DType::i32 && doc_pos.dim() == 2 && doc_pos.is_contiguous() && heads > 0 &&
                    s.size(0) == doc_pos.size(0) * heads && s.size(1) == doc_pos.size(1),
                "attention_mask_documents: scores ", s.str(), ", positions ", doc_pos.str(), ", ", heads, " heads");
  const int64_t n = s.numel();
  if (n == 0) return;
  DeviceState& st = state_for(s);
  const int32_t* pos = doc_pos.data<int32_t>();
  if (s.dtype() == DType::f32)
    mask_documents_kernel<float><<<kern::blocks_for(n), kern::kBlock, 0, st.stream>>>(
        s.data<float>(), pos, n, s.size(1), s.size(2), heads);
  else
    mask_documents_kernel<double><<<kern::blocks_for(n), kern::kBlock, 0, st.stream>>>(
        s.data<double>(), pos, n, s.size(1), s.size(2), heads);
  TANDEM_CUDA_LAUNCH_CHECK("mask_documents_kernel");
}

void CudaBackend::softmax_forward(const Tensor& x, int64_t outer, int64_t c, int64_t inner, bool log, Tensor& y) {
  const char* op = log ? "log_softmax" : "softmax";
  check_types(op, {&x, &y});
  TANDEM_ASSERT(x.numel() == outer * c * inner && y.numel() == x.numel(), op, " of ", x.str(), " as [", outer, ", ", c,
                ", ", inner, "]");
  if (x.numel() == 0) return;
  DeviceState& st = state_for(y);
  kern::dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    if (inner == 1) return launch_softmax_rows<T>(px, py, outer, c, 1.0f, 0, log, st.stream);
    softmax_strided_kernel<T><<<kern::blocks_for(outer * inner), kern::kBlock, 0, st.stream>>>(px, py, outer, c, inner,
                                                                                                log);
    TANDEM_CUDA_LAUNCH_CHECK("softmax_strided_kernel");
  });
}

void CudaBackend::softmax_backward(const Tensor& dy, const Tensor& y, int64_t outer, int64_t c, int64_t inner, bool log,
                                   Tensor& dx) {
  const char* op = log ? "log_softmax backward" : "softmax backward";
  check_types(op, {&y, &dy, &dx});
  TANDEM_ASSERT(y.numel() == outer * c * inner && dy.numel() == y.numel() && dx.numel() == y.numel(), op, " of ",
                y.str());
  if (y.numel() == 0) return;
  DeviceState& st = state_for(dx);
  kern::dispatch_float(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(dy.data_ptr());
    const T* py = static_cast<const T*>(y.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    if (inner == 1) {
      const bool warp = with_warp_shape<T>(c, {pg, py, pd}, [&](auto vtag, auto ntag) {
        constexpr int V = decltype(vtag)::value, NV = decltype(ntag)::value;
        softmax_backward_warp_kernel<T, V, NV>
            <<<rows::warp_row_blocks(outer, kWarps), kWarps * 32, 0, st.stream>>>(pg, py, pd, outer, c, log);
      });
      if (!warp) {
        if (rows::same_misalignment({pg, py, pd}))
          softmax_backward_block_kernel<T, rows::kVec<T>>
              <<<row_block_grid(outer), kRowThreads, 0, st.stream>>>(pg, py, pd, outer, c, log);
        else
          softmax_backward_block_kernel<T, 1><<<row_block_grid(outer), kRowThreads, 0, st.stream>>>(pg, py, pd, outer,
                                                                                                    c, log);
      }
      TANDEM_CUDA_LAUNCH_CHECK("softmax backward kernel");
      return;
    }
    softmax_backward_strided_kernel<T><<<kern::blocks_for(outer * inner), kern::kBlock, 0, st.stream>>>(
        pg, py, pd, outer, c, inner, log);
    TANDEM_CUDA_LAUNCH_CHECK("softmax_backward_strided_kernel");
  });
}

void CudaBackend::attention_softmax(const Tensor& s, int64_t batch, int64_t tq, int64_t tk, double scale, bool causal,
                                    Tensor& y) {
  check_types("scaled_dot_product_attention", {&s, &y});
  TANDEM_ASSERT(s.numel() == batch * tq * tk && y.numel() == s.numel(), "attention_softmax of ", s.str());
  if (s.numel() == 0) return;
  DeviceState& st = state_for(y);
  kern::dispatch_float(s.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    launch_softmax_rows<T>(static_cast<const T*>(s.data_ptr()), static_cast<T*>(y.data_ptr()), batch * tq, tk,
                           static_cast<float>(scale), causal ? tq : 0, false, st.stream);
  });
}

namespace {
template <typename T>
__global__ void document_bias_kernel(const int32_t* __restrict__ pos, int64_t n, int64_t t, float masked,
                                     T* __restrict__ bias) {
  for (int64_t e = kern::thread_index(); e < n; e += kern::thread_count()) {
    const int64_t r = e / t, j = e % t, i = r % t;
    bias[e] = from_float<T>(j < i - pos[r] ? masked : 0.0f);
  }
}
}  // namespace

void launch_document_bias(const int32_t* pos, int64_t b, int64_t t, bool bf16, void* bias, cudaStream_t stream) {
  const int64_t n = b * t * t;
  if (n == 0) return;
  // Far below any score, within each type's range: exp of it less the row's maximum is 0.
  if (bf16)
    document_bias_kernel<__nv_bfloat16><<<kern::blocks_for(n), kern::kBlock, 0, stream>>>(
        pos, n, t, -1e30f, static_cast<__nv_bfloat16*>(bias));
  else
    document_bias_kernel<__half><<<kern::blocks_for(n), kern::kBlock, 0, stream>>>(pos, n, t, -60000.0f,
                                                                                   static_cast<__half*>(bias));
  TANDEM_CUDA_LAUNCH_CHECK("document_bias_kernel");
}

void launch_attention_rng_state(uint64_t seed, uint64_t offset, const unsigned long long* replays, int64_t* out,
                                cudaStream_t stream) {
  attention_rng_state_kernel<<<1, 1, 0, stream>>>(seed, offset, replays, out);
  TANDEM_CUDA_LAUNCH_CHECK("attention_rng_state_kernel");
}

}  // namespace tandem::backend
