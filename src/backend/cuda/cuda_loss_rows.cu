// CUDA kernels of the N-D loss ops: softmax cross-entropy and negative log-likelihood per row against class
// indices (with an ignored index), and elementwise squared error and binary cross-entropy. Inputs are f32,
// f16 or bf16, read as they are; losses and weights are f32.
//
// The cross-entropy forward reads each row of logits once (an online maximum and sum of exponentials)
// and keeps only the row's log-sum-exp, so that the backward recomputes the probabilities from the logits
// instead of reading a stored copy: a language model's [tokens, vocabulary] logits are read twice and its
// gradient written once in all. A target outside [0, classes) that is not the ignored index is recorded in
// the device's error record (thrown at the next synchronisation) and makes that row's loss NaN.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "backend/cuda/cuda_rowwise.cuh"

namespace tandem::backend {

namespace {

constexpr int kWarps = 8;           // warps per block of the warp-per-row kernels
constexpr int kRowThreads = 512;    // threads of the block-per-row kernels
constexpr int64_t kWarpClasses = 1024;  // rows up to this many classes go one warp per row
constexpr int64_t kLongRow = 16384;     // the fused classifier's rows from this many classes: 1024-thread blocks

__device__ void report_target(ErrorSink sink, int64_t row, int64_t target, int64_t classes) {
  if (atomicCAS(sink.claim, 0, 1) != 0) return;
  sink.rec->row = row;
  sink.rec->label = target;
  sink.rec->classes = classes;
  __threadfence_system();
  sink.rec->flag = 1;
}

// exp(a * log2(e) - b) in one fused multiply-add and the special-function unit's 2^x (ex2.approx, as
// __expf uses it): with b = z log2(e), exp(a - z).
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float exp_shifted(float a, float b_log2) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(fmaf(a, kLog2e, -b_log2)));
  return r;
}

// Merges an online (maximum, sum of exp(x - maximum)) pair with another.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

__device__ __forceinline__ void add_value(float& m, float& s, float v) {
  if (v == -INFINITY) return;  // adds nothing (and exp(-inf - -inf) would be NaN)
  if (v > m) {
    s = s * __expf(m - v) + 1.0f;
    m = v;
  } else {
    s += __expf(v - m);
  }
}

// Writes a row's loss, lse (unless null) and validity once its log-sum-exp z is known (by one thread).
template <typename T, typename L>
__device__ __forceinline__ void finish_row(const T* __restrict__ xr, L target, int64_t ignore, int64_t row, int64_t c,
                                           float z, float* loss, float* lse, float* valid, ErrorSink sink) {
  const int64_t t = static_cast<int64_t>(target);
  if (lse) lse[row] = z;
  if (t == ignore) {
    loss[row] = 0.0f;
    valid[row] = 0.0f;
  } else if (t < 0 || t >= c) {
    report_target(sink, row, t, c);
    loss[row] = NAN;
    valid[row] = 1.0f;
  } else {
    loss[row] = z - kern::to_float(xr[t]);
    valid[row] = 1.0f;
  }
}

template <typename T, typename L>
__global__ void xent_warp_kernel(const T* __restrict__ x, const L* __restrict__ targets, int64_t n, int64_t c,
                                 int64_t ignore, float* __restrict__ loss, float* __restrict__ lse,
                                 float* __restrict__ valid, ErrorSink sink) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = kern::thread_index() >> 5; r < n; r += warps) {
    const T* xr = x + r * c;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = lane; j < c; j += 32) add_value(m, s, kern::to_float(xr[j]));
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
    }
    if (lane == 0) finish_row(xr, targets[r], ignore, r, c, m + __logf(s), loss, lse, valid, sink);
  }
}

// Adds VEC values to an online (maximum, sum) pair with one rescale: the vector's maximum first, then its
// exponentials (independent of each other, so they overlap).
template <int VEC>
__device__ __forceinline__ void add_vector(float& m, float& s, const float (&v)[VEC]) {
  float mv = v[0];
#pragma unroll
  for (int u = 1; u < VEC; ++u) mv = fmaxf(mv, v[u]);
  if (mv == -INFINITY) return;
  if (mv > m) {
    s *= __expf(m - mv);  // m = -inf at the start: s is 0 and stays 0
    m = mv;
  }
  float part = 0.0f;
  const float ml = m * kLog2e;
#pragma unroll
  for (int u = 0; u < VEC; ++u) part += exp_shifted(v[u], ml);
  s += part;
}

// The online (maximum, sum of exponentials) of a row, each thread of the block taking a part of it: the middle
// 16 bytes at a time whatever the row's alignment (rows of an odd class count start anywhere).
template <typename T, int VEC>
__device__ __forceinline__ void row_online(const T* xr, const rows::RowSplit& sp, int64_t c, float& m, float& s) {
  m = -INFINITY;
  s = 0.0f;
  for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x) add_value(m, s, kern::to_float(xr[j]));
  for (int64_t j0 = sp.head + int64_t(threadIdx.x) * VEC; j0 < sp.body_end; j0 += int64_t(blockDim.x) * VEC) {
    float v[VEC];
    rows::load_floats<VEC>(xr + j0, v);
    add_vector<VEC>(m, s, v);
  }
  for (int64_t j = sp.body_end + threadIdx.x; j < c; j += blockDim.x) add_value(m, s, kern::to_float(xr[j]));
}

// Merges the block's (maximum, sum) pairs; warp 0 ends with the row's. sm, ss: 32 floats of shared scratch
// each, free on entry (the caller synchronises before reusing them).
__device__ __forceinline__ void block_merge(float& m, float& s, float* sm, float* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < nw ? sm[lane] : -INFINITY;
    s = lane < nw ? ss[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
    }
  }
}

// One block per row for rows of many classes (a vocabulary): the row is read once.
template <typename T, typename L, int VEC>
__global__ void xent_block_kernel(const T* __restrict__ x, const L* __restrict__ targets, int64_t n, int64_t c,
                                  int64_t ignore, float* __restrict__ loss, float* __restrict__ lse,
                                  float* __restrict__ valid, ErrorSink sink) {
  __shared__ float sm[32], ss[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = x + r * c;
    float m, s;
    row_online<T, VEC>(xr, rows::split_row<VEC>(xr, c), c, m, s);
    __syncthreads();  // the scratch may still be read for the previous row
    block_merge(m, s, sm, ss);
    if (threadIdx.x == 0) finish_row(xr, targets[r], ignore, r, c, m + __logf(s), loss, lse, valid, sink);
  }
}

// The fused classifier's forward: each row's loss as xent_block_kernel gives it, then the row overwritten by
// its gradient at unit weight, softmax - onehot (0 in ignored rows). The second read of the row finds it in L2:
// long rows (a vocabulary) take 1024-thread blocks, at most two to a multiprocessor, so that the rows in
// flight (264 of GPT-2's 100 KB rows on an H200) stay well inside L2; with 512-thread blocks four to a
// multiprocessor held more than L2 and the second read went to memory. The one-hot's 1 is subtracted by
// one thread after the row is written, from the target's logit kept before. (Holding the row in registers
// instead, one 512-thread block a row, measured 4x slower at GPT-2's vocabulary.) Blocks of 32 threads serve
// short rows. Only the first `classes` columns are classes: the others (a token table's padding) are left out of
// the maximum and the sum and written 0, so that they add nothing to either gradient product.
template <typename T, typename L, int VEC>
__global__ void xent_forward_grad_kernel(T* x, const L* __restrict__ targets, int64_t n, int64_t c, int64_t classes,
                                         int64_t ignore, float* __restrict__ loss, float* __restrict__ valid,
                                         ErrorSink sink) {
  __shared__ float sm[32], ss[32], z_row, xt_row;
  const T zero = kern::from_float<T>(0.0f);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    T* xr = x + r * c;
    const rows::RowSplit sp = rows::split_row<VEC>(xr, classes);
    float m, s;
    row_online<T, VEC>(xr, sp, classes, m, s);
    __syncthreads();  // the scratch (and z_row, xt_row) may still be read for the previous row
    block_merge(m, s, sm, ss);
    const int64_t t = static_cast<int64_t>(targets[r]);
    const bool skip = t == ignore, has_target = !skip && t >= 0 && t < classes;
    if (threadIdx.x == 0) {
      z_row = m + __logf(s);
      if (has_target) xt_row = kern::to_float(xr[t]);
      finish_row(xr, targets[r], ignore, r, classes, z_row, loss, static_cast<float*>(nullptr), valid, sink);
    }
    __syncthreads();  // the target's logit is read before the row is overwritten
    if (skip) {
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) xr[j] = zero;
      continue;
    }
    for (int64_t j = classes + threadIdx.x; j < c; j += blockDim.x) xr[j] = zero;
    const float zl = z_row * kLog2e;
    for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x) xr[j] = kern::from_float<T>(exp_shifted(kern::to_float(xr[j]), zl));
    for (int64_t j0 = sp.head + int64_t(threadIdx.x) * VEC; j0 < sp.body_end; j0 += int64_t(blockDim.x) * VEC) {
      float v[VEC];
      rows::load_floats<VEC>(xr + j0, v);
#pragma unroll
      for (int u = 0; u < VEC; ++u) v[u] = exp_shifted(v[u], zl);
      rows::store_floats<VEC>(xr + j0, v);
    }
    for (int64_t j = sp.body_end + threadIdx.x; j < classes; j += blockDim.x)
      xr[j] = kern::from_float<T>(exp_shifted(kern::to_float(xr[j]), zl));
    if (has_target) {
      __syncthreads();  // every thread's writes of the row are done
      if (threadIdx.x == 0) xr[t] = kern::from_float<T>(exp_shifted(xt_row, zl) - 1.0f);
    }
  }
}

// dlogits[i, j] = (exp(x - lse_i) - [j == t_i]) * g_i, 0 in ignored rows; one block per row, the middle of
// each row read and written 16 bytes at a time (x and dx split alike: same_misalignment).
template <typename T, typename L, int VEC>
__global__ void xent_backward_kernel(const T* __restrict__ x, const L* __restrict__ targets,
                                     const float* __restrict__ lse, const float* __restrict__ g, int64_t gn,
                                     int64_t n, int64_t c, int64_t ignore, T* __restrict__ dx) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    const bool skip = t == ignore;
    const float w = skip ? 0.0f : g[gn == 1 ? 0 : r], z = lse[r];
    const T* xr = x + r * c;
    T* dr = dx + r * c;
    auto grad = [&](float v, int64_t j) { return skip ? 0.0f : (__expf(v - z) - (j == t ? 1.0f : 0.0f)) * w; };
    const rows::RowSplit sp = rows::split_row<VEC>(xr, c);
    for (int64_t j = threadIdx.x; j < sp.head; j += blockDim.x) dr[j] = kern::from_float<T>(grad(kern::to_float(xr[j]), j));
    for (int64_t j0 = sp.head + int64_t(threadIdx.x) * VEC; j0 < sp.body_end; j0 += int64_t(blockDim.x) * VEC) {
      float v[VEC];
      rows::load_floats<VEC>(xr + j0, v);
#pragma unroll
      for (int u = 0; u < VEC; ++u) v[u] = grad(v[u], j0 + u);
      rows::store_floats<VEC>(dr + j0, v);
    }
    for (int64_t j = sp.body_end + threadIdx.x; j < c; j += blockDim.x)
      dr[j] = kern::from_float<T>(grad(kern::to_float(xr[j]), j));
  }
}

// The same for rows of few classes: one thread per element.
template <typename T, typename L>
__global__ void xent_backward_flat_kernel(const T* __restrict__ x, const L* __restrict__ targets,
                                          const float* __restrict__ lse, const float* __restrict__ g, int64_t gn,
                                          int64_t n, int64_t c, int64_t ignore, T* __restrict__ dx) {
  for (int64_t i = kern::thread_index(); i < n * c; i += kern::thread_count()) {
    const int64_t r = i / c, j = i - r * c, t = static_cast<int64_t>(targets[r]);
    float d = 0.0f;
    if (t != ignore) d = (__expf(kern::to_float(x[i]) - lse[r]) - (j == t ? 1.0f : 0.0f)) * g[gn == 1 ? 0 : r];
    dx[i] = kern::from_float<T>(d);
  }
}

template <typename T, typename L>
__global__ void nll_forward_kernel(const T* __restrict__ x, const L* __restrict__ targets, int64_t n, int64_t c,
                                   int64_t ignore, float* __restrict__ loss, float* __restrict__ valid, ErrorSink sink) {
  for (int64_t r = kern::thread_index(); r < n; r += kern::thread_count()) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == ignore) {
      loss[r] = 0.0f;
      valid[r] = 0.0f;
    } else if (t < 0 || t >= c) {
      report_target(sink, r, t, c);
      loss[r] = NAN;
      valid[r] = 1.0f;
    } else {
      loss[r] = -kern::to_float(x[r * c + t]);
      valid[r] = 1.0f;
    }
  }
}

template <typename T, typename L>
__global__ void nll_backward_kernel(const L* __restrict__ targets, const float* __restrict__ g, int64_t gn, int64_t n,
                                    int64_t c, int64_t ignore, T* __restrict__ dx) {
  for (int64_t r = kern::thread_index(); r < n; r += kern::thread_count()) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t != ignore && t >= 0 && t < c) dx[r * c + t] = kern::from_float<T>(-g[gn == 1 ? 0 : r]);
  }
}

__device__ __forceinline__ float clamped_log(float v) { return fmaxf(logf(v), -100.0f); }

template <typename T>
__global__ void point_loss_kernel(PointLoss op, const T* __restrict__ x, const T* __restrict__ t, int64_t n,
                                  float* __restrict__ loss) {
  for (int64_t i = kern::thread_index(); i < n; i += kern::thread_count()) {
    const float v = kern::to_float(x[i]), y = kern::to_float(t[i]);
    float l;
    switch (op) {
      case PointLoss::SquaredError: l = (v - y) * (v - y); break;
      case PointLoss::BinaryCrossEntropy: l = -(y * clamped_log(v) + (1.0f - y) * clamped_log(1.0f - v)); break;
      default: l = fmaxf(v, 0.0f) - v * y + log1pf(expf(-fabsf(v))); break;
    }
    loss[i] = l;
  }
}

template <typename T>
__global__ void point_loss_backward_kernel(PointLoss op, const T* __restrict__ x, const T* __restrict__ t,
                                           const float* __restrict__ g, int64_t gn, int64_t n, T* __restrict__ dx) {
  for (int64_t i = kern::thread_index(); i < n; i += kern::thread_count()) {
    const float v = kern::to_float(x[i]), y = kern::to_float(t[i]), w = g[gn == 1 ? 0 : i];
    float d;
    switch (op) {
      case PointLoss::SquaredError: d = 2.0f * (v - y); break;
      case PointLoss::BinaryCrossEntropy: d = (v - y) / fmaxf((1.0f - v) * v, 1e-12f); break;
      default: d = 1.0f / (1.0f + expf(-v)) - y; break;
    }
    dx[i] = kern::from_float<T>(d * w);
  }
}

template <typename F>
void dispatch_targets(const Tensor& targets, const char* op, F&& f) {
  if (targets.dtype() == DType::i32) return f(targets.data<int32_t>());
  TANDEM_CHECK(targets.dtype() == DType::i64, op, ": targets must be i32 or i64, got ", targets.str());
  f(targets.data<int64_t>());
}

void require_stats(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) TANDEM_CHECK(t->dtype() == DType::f32, op, ": ", t->str(), " must be f32 on CUDA");
}

unsigned grid_for_rows(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>(n, 1, kern::kMaxBlocks)); }

}  // namespace

void CudaBackend::xent_rows_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                    Tensor& lse, Tensor& valid) {
  const char* op = "softmax_cross_entropy";
  require_stats(op, {&loss, &lse, &valid});
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(targets.numel() == n && loss.numel() == n && lse.numel() == n && valid.numel() == n, op, " shapes");
  if (n == 0) return;
  DeviceState& st = state_for(loss);
  kern::dispatch_float(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data_ptr());
    dispatch_targets(targets, op, [&](auto* tg) {
      using L = std::remove_const_t<std::remove_pointer_t<decltype(tg)>>;
      if (c <= kWarpClasses)
        xent_warp_kernel<T, L><<<rows::warp_row_blocks(n, kWarps), kWarps * 32, 0, st.stream>>>(
            x, tg, n, c, ignore_index, loss.data<float>(), lse.data<float>(), valid.data<float>(), st.errors);
      else
        xent_block_kernel<T, L, rows::kVec<T>><<<grid_for_rows(n), kRowThreads, 0, st.stream>>>(
            x, tg, n, c, ignore_index, loss.data<float>(), lse.data<float>(), valid.data<float>(), st.errors);
      TANDEM_CUDA_LAUNCH_CHECK("cross-entropy kernel");
    });
  });
}

void CudaBackend::xent_rows_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g,
                                     int64_t ignore_index, Tensor& dlogits) {
  const char* op = "softmax_cross_entropy backward";
  require_stats(op, {&lse, &g});
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(dlogits.numel() == n * c && dlogits.dtype() == logits.dtype() && (g.numel() == 1 || g.numel() == n),
                op, " shapes");
  if (n * c == 0) return;
  DeviceState& st = state_for(dlogits);
  kern::dispatch_float(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data_ptr());
    T* d = static_cast<T*>(dlogits.data_ptr());
    dispatch_targets(targets, op, [&](auto* tg) {
      using L = std::remove_const_t<std::remove_pointer_t<decltype(tg)>>;
      const float *pz = lse.data<float>(), *pg = g.data<float>();
      if (c < 256) {
        xent_backward_flat_kernel<T, L><<<kern::blocks_for(n * c), kern::kBlock, 0, st.stream>>>(
            x, tg, pz, pg, g.numel(), n, c, ignore_index, d);
      } else if (rows::same_misalignment({x, d})) {
        xent_backward_kernel<T, L, rows::kVec<T>><<<grid_for_rows(n), kRowThreads, 0, st.stream>>>(
            x, tg, pz, pg, g.numel(), n, c, ignore_index, d);
      } else {
        xent_backward_kernel<T, L, 1><<<grid_for_rows(n), kRowThreads, 0, st.stream>>>(x, tg, pz, pg, g.numel(), n, c,
                                                                                      ignore_index, d);
      }
      TANDEM_CUDA_LAUNCH_CHECK("cross-entropy backward kernel");
    });
  });
}

void CudaBackend::xent_rows_forward_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                         Tensor& valid, int64_t classes) {
  const char* op = "softmax_cross_entropy";
  require_stats(op, {&loss, &valid});
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(targets.numel() == n && loss.numel() == n && valid.numel() == n && logits.is_contiguous() &&
                    classes >= 0 && classes <= c,
                op, " shapes");
  if (n == 0) return;
  DeviceState& st = state_for(loss);
  // Rows of a vocabulary's length in 1024-thread blocks (see the kernel): the second read stays in L2.
  const int threads = c <= kWarpClasses ? 32 : c >= kLongRow ? 1024 : kRowThreads;
  kern::dispatch_float(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    T* x = static_cast<T*>(logits.data_ptr());
    dispatch_targets(targets, op, [&](auto* tg) {
      using L = std::remove_const_t<std::remove_pointer_t<decltype(tg)>>;
      xent_forward_grad_kernel<T, L, rows::kVec<T>><<<grid_for_rows(n), threads, 0, st.stream>>>(
          x, tg, n, c, classes, ignore_index, loss.data<float>(), valid.data<float>(), st.errors);
      TANDEM_CUDA_LAUNCH_CHECK("fused cross-entropy kernel");
    });
  });
}

void CudaBackend::nll_rows_forward(const Tensor& logp, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                   Tensor& valid) {
  const char* op = "nll_loss";
  require_stats(op, {&loss, &valid});
  const int64_t n = logp.size(0), c = logp.size(1);
  TANDEM_ASSERT(targets.numel() == n && loss.numel() == n && valid.numel() == n, op, " shapes");
  if (n == 0) return;
  DeviceState& st = state_for(loss);
  kern::dispatch_float(logp.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_targets(targets, op, [&](auto* tg) {
      using L = std::remove_const_t<std::remove_pointer_t<decltype(tg)>>;
      nll_forward_kernel<T, L><<<kern::blocks_for(n), kern::kBlock, 0, st.stream>>>(
          static_cast<const T*>(logp.data_ptr()), tg, n, c, ignore_index, loss.data<float>(), valid.data<float>(),
          st.errors);
      TANDEM_CUDA_LAUNCH_CHECK("nll_forward_kernel");
    });
  });
}

void CudaBackend::nll_rows_backward(const Tensor& targets, const Tensor& g, int64_t ignore_index, Tensor& dlogp) {
  const char* op = "nll_loss backward";
  require_stats(op, {&g});
  const int64_t n = dlogp.size(0), c = dlogp.size(1);
  if (n * c == 0) return;
  DeviceState& st = state_for(dlogp);
  TANDEM_CUDA_CHECK(cudaMemsetAsync(dlogp.data_ptr(), 0, dlogp.nbytes(), st.stream));
  kern::dispatch_float(dlogp.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_targets(targets, op, [&](auto* tg) {
      using L = std::remove_const_t<std::remove_pointer_t<decltype(tg)>>;
      nll_backward_kernel<T, L><<<kern::blocks_for(n), kern::kBlock, 0, st.stream>>>(
          tg, g.data<float>(), g.numel(), n, c, ignore_index, static_cast<T*>(dlogp.data_ptr()));
      TANDEM_CUDA_LAUNCH_CHECK("nll_backward_kernel");
    });
  });
}

void CudaBackend::pointwise_loss_forward(PointLoss op, const Tensor& x, const Tensor& t, Tensor& loss) {
  require_stats("loss", {&loss});
  TANDEM_ASSERT(x.numel() == t.numel() && loss.numel() == x.numel() && x.dtype() == t.dtype(), "pointwise loss shapes");
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceState& st = state_for(loss);
  kern::dispatch_float(x.dtype(), "loss", [&](auto tag) {
    using T = decltype(tag);
    point_loss_kernel<T><<<kern::blocks_for(n), kern::kBlock, 0, st.stream>>>(
        op, static_cast<const T*>(x.data_ptr()), static_cast<const T*>(t.data_ptr()), n, loss.data<float>());
  });
  TANDEM_CUDA_LAUNCH_CHECK("point_loss_kernel");
}

void CudaBackend::pointwise_loss_backward(PointLoss op, const Tensor& x, const Tensor& t, const Tensor& g, Tensor& dx) {
  require_stats("loss backward", {&g});
  TANDEM_ASSERT(x.numel() == t.numel() && dx.numel() == x.numel() && (g.numel() == 1 || g.numel() == x.numel()),
                "pointwise loss backward shapes");
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceState& st = state_for(dx);
  kern::dispatch_float(x.dtype(), "loss", [&](auto tag) {
    using T = decltype(tag);
    point_loss_backward_kernel<T><<<kern::blocks_for(n), kern::kBlock, 0, st.stream>>>(
        op, static_cast<const T*>(x.data_ptr()), static_cast<const T*>(t.data_ptr()), g.data<float>(), g.numel(), n,
        static_cast<T*>(dx.data_ptr()));
  });
  TANDEM_CUDA_LAUNCH_CHECK("point_loss_backward_kernel");
}

}  // namespace tandem::backend
