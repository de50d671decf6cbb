// CUDA kernels: layer and RMS normalisation over the rows of [n, c]; x, y, dy, dx f32, f16 or bf16, the
// weight and bias f32 or x's type, statistics (mean, rstd) f32.
//
// Rows that fit in a warp's registers go one warp per row: the row is read once with 16-byte loads, its
// mean and variance are taken from the registers (two passes over registers, not memory) and the output
// is written once. The backward does the same for dx, and each warp keeps the weight and bias gradients
// of the columns its lanes own over all the rows it handles; a block adds its warps' sums in shared
// memory in a fixed order and writes one row of partial sums, which a second launch adds per column in
// block order (deterministic, no atomics). Longer rows take one block per row, with the same partials.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>

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
using rows::warp_sum;

constexpr int kWarps = 4;         // warps per block of the warp-per-row forward
constexpr int kBackwardWarps = 4;  // warps per block of the warp-per-row backward
constexpr int kRowThreads = 256;  // threads of the block-per-row kernels

// Loads VEC values of type W at column col of p as floats (a parameter, or a row of the gradient added to), or
// fallback where p is null.
template <int VEC, typename W>
__device__ __forceinline__ void load_param(const W* __restrict__ p, int64_t col, float fallback, float (&out)[VEC]) {
  if (p) {
    load_floats<VEC>(p + col, out);
  } else {
#pragma unroll
    for (int u = 0; u < VEC; ++u) out[u] = fallback;
  }
}

template <typename T, typename W, int VEC, int NV>
__global__ void ln_forward_warp_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                                       T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t n,
                                       int64_t c, int64_t ldy, float eps, bool rms) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t r = kern::thread_index() >> 5; r < n; r += warps) {
    const T* xr = x + r * c;
    float v[NV][VEC];
    float s = 0.0f;
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
      for (int u = 0; u < VEC; ++u) s += v[k][u];
    }
    const float mu = rms ? 0.0f : warp_sum(s) * inv_c;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t col = (int64_t(k) * 32 + lane) * VEC;
#pragma unroll
      for (int u = 0; u < VEC; ++u) {
        const float d = col < c ? v[k][u] - mu : 0.0f;
        ss += d * d;
      }
    }
    const float rs = rsqrtf(warp_sum(ss) * inv_c + eps);
    if (lane == 0) {
      if (mean) mean[r] = mu;
      rstd[r] = rs;
    }
    T* yr = y + r * ldy;
    if (lane < ldy - c) yr[c + lane] = from_float<T>(lane == 0 ? 1.0f : 0.0f);  // padded rows: a one, then zeros
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t col = (int64_t(k) * 32 + lane) * VEC;
      if (col < c) {
        float wv[VEC], bv[VEC], o[VEC];
        load_param<VEC>(w, col, 1.0f, wv);
        load_param<VEC>(b, col, 0.0f, bv);
#pragma unroll
        for (int u = 0; u < VEC; ++u) o[u] = fmaf((v[k][u] - mu) * rs, wv[u], bv[u]);
        store_floats<VEC>(yr + col, o);
      }
    }
  }
}

// One block per row: the mean, the variance about it, then the output (three reads of the row).
template <typename T, typename W>
__global__ void ln_forward_block_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                                        T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t n,
                                        int64_t c, int64_t ldy, float eps, bool rms) {
  __shared__ float scratch[32];
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = x + r * c;
    float mu = 0.0f;
    if (!rms) {
      float s = 0.0f;
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += to_float(xr[j]);
      mu = rows::block_sum(s, scratch) * inv_c;
    }
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float d = to_float(xr[j]) - mu;
      ss += d * d;
    }
    const float rs = rsqrtf(rows::block_sum(ss, scratch) * inv_c + eps);
    if (threadIdx.x == 0) {
      if (mean) mean[r] = mu;
      rstd[r] = rs;
    }
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float wv = w ? to_float(w[j]) : 1.0f, bv = b ? to_float(b[j]) : 0.0f;
      y[r * ldy + j] = from_float<T>(fmaf((to_float(xr[j]) - mu) * rs, wv, bv));
    }
    for (int64_t j = c + threadIdx.x; j < ldy; j += blockDim.x) y[r * ldy + j] = from_float<T>(j == c ? 1.0f : 0.0f);
  }
}

// Backward, one warp per row: dx = rstd (gw - mean(gw) - xhat mean(gw xhat)) with gw = dy w (the mean(gw)
// term absent for RMS). With partial_w / partial_b, each block writes the sums over its rows of dy xhat and
// dy for every column to its row of the partials [gridDim.x, c]; with partial_d, those of dx as stored (after
// the addition, with accumulate). Each warp accumulates those sums for the columns its lanes own in shared
// memory (registers would cost the kernel its occupancy), laid out so that the lanes of a warp touch
// consecutive banks; the block then adds its warps' sums in warp order.
// Dynamic shared memory: warps * (2, or 3 with partial_d) * NV * VEC * 32 floats.
template <typename T, typename W, int VEC, int NV, bool RELOAD>
__global__ void ln_backward_warp_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                                        const float* __restrict__ mean, const float* __restrict__ rstd,
                                        T* __restrict__ dx, float* __restrict__ partial_w,
                                        float* __restrict__ partial_b, float* __restrict__ partial_d, int64_t n,
                                        int64_t c, bool rms, bool accumulate) {
  extern __shared__ float sums[];  // [warp][weight, bias(, dx)][(k * VEC + u) * 32 + lane]
  constexpr int kPad = NV * 32 * VEC;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const bool partial = partial_w || partial_b;
  const bool sum_dx = partial_d && dx;
  const int per_warp = sum_dx ? 3 : 2;
  float* aw = sums + warp * per_warp * kPad;
  float* ab = aw + kPad;
  float* ad = ab + kPad;
  if (partial || sum_dx) {
#pragma unroll
    for (int i = 0; i < NV * VEC; ++i) aw[i * 32 + lane] = ab[i * 32 + lane] = 0.0f;
  }
  if (sum_dx) {
#pragma unroll
    for (int i = 0; i < NV * VEC; ++i) ad[i * 32 + lane] = 0.0f;
  }
  const int64_t warps = int64_t(gridDim.x) * nwarps;
  const float inv_c = 1.0f / static_cast<float>(c);
  const bool add_to = dx && accumulate;
  for (int64_t r = kern::thread_index() >> 5; r < n; r += warps) {
    // Held in registers between the two passes (RELOAD: read again in the second, from L1, which leaves the
    // kernel fewer registers and more warps in flight). prev: the gradient dx already holds (accumulate), read
    // with x and dy rather than after the row's sums, so that its latency overlaps theirs.
    float xh[NV][VEC], g[NV][VEC], prev[NV][VEC];
    const float mu = rms ? 0.0f : mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t col = (int64_t(k) * 32 + lane) * VEC;
      if (col < c) {
        float wv[VEC], xv[VEC], gv[VEC];
        load_floats<VEC>(x + r * c + col, xv);
        load_floats<VEC>(dy + r * c + col, gv);
        if (!RELOAD) load_param<VEC>(add_to ? dx + r * c : nullptr, col, 0.0f, prev[k]);
        load_param<VEC>(w, col, 1.0f, wv);
#pragma unroll
        for (int u = 0; u < VEC; ++u) {
          const float xu = (xv[u] - mu) * rs;
          if (partial) {
            const int i = (k * VEC + u) * 32 + lane;
            aw[i] = fmaf(gv[u], xu, aw[i]);
            ab[i] += gv[u];
          }
          const float gw = gv[u] * wv[u];
          if (!RELOAD) {
            xh[k][u] = xu;
            g[k][u] = gw;
          }
          s1 += gw;
          s2 = fmaf(gw, xu, s2);
        }
      } else if (!RELOAD) {
#pragma unroll
        for (int u = 0; u < VEC; ++u) xh[k][u] = g[k][u] = 0.0f;
      }
    }
    const float m1 = rms ? 0.0f : warp_sum(s1) * inv_c, m2 = warp_sum(s2) * inv_c;
    if (dx) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int64_t col = (int64_t(k) * 32 + lane) * VEC;
        if (col < c) {
          if (RELOAD) {
            float wv[VEC];
            load_floats<VEC>(x + r * c + col, xh[k]);
            load_floats<VEC>(dy + r * c + col, g[k]);
            load_param<VEC>(add_to ? dx + r * c : nullptr, col, 0.0f, prev[k]);
            load_param<VEC>(w, col, 1.0f, wv);
#pragma unroll
            for (int u = 0; u < VEC; ++u) {
              xh[k][u] = (xh[k][u] - mu) * rs;
              g[k][u] *= wv[u];
            }
          }
          float o[VEC];
#pragma unroll
          for (int u = 0; u < VEC; ++u) o[u] = prev[k][u] + rs * (g[k][u] - m1 - xh[k][u] * m2);
          store_floats<VEC>(dx + r * c + col, o);
          if (sum_dx) {
#pragma unroll
            for (int u = 0; u < VEC; ++u) ad[(k * VEC + u) * 32 + lane] += to_float(from_float<T>(o[u]));
          }
        }
      }
    }
  }
  if (!partial && !sum_dx) return;
  __syncthreads();
  // Column j = (k * 32 + lane) * VEC + u sits at (k * VEC + u) * 32 + lane of every warp's sums.
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const int k = static_cast<int>(j / (32 * VEC)), ln = static_cast<int>((j / VEC) % 32), u = static_cast<int>(j % VEC);
    const int i = (k * VEC + u) * 32 + ln;
    float tw = 0.0f, tb = 0.0f, td = 0.0f;
    for (int wi = 0; wi < nwarps; ++wi) {
      tw += sums[wi * per_warp * kPad + i];
      tb += sums[wi * per_warp * kPad + kPad + i];
      if (sum_dx) td += sums[wi * per_warp * kPad + 2 * kPad + i];
    }
    if (partial_w) partial_w[blockIdx.x * c + j] = tw;
    if (partial_b) partial_b[blockIdx.x * c + j] = tb;
    if (sum_dx) partial_d[blockIdx.x * c + j] = td;
  }
}

// One block per row: the row sums, then dx; the block's parameter sums accumulate in its row of the
// partials (zeroed before the launch; each column owned by one thread).
template <typename T, typename W>
__global__ void ln_backward_block_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                                         const float* __restrict__ mean, const float* __restrict__ rstd,
                                         T* __restrict__ dx, float* __restrict__ partial_w,
                                         float* __restrict__ partial_b, int64_t n, int64_t c, bool rms,
                                         bool accumulate) {
  __shared__ float scratch[32];
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float mu = rms ? 0.0f : mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xh = (to_float(x[r * c + j]) - mu) * rs;
      const float gw = to_float(dy[r * c + j]) * (w ? to_float(w[j]) : 1.0f);
      s1 += gw;
      s2 = fmaf(gw, xh, s2);
    }
    const float m1 = rms ? 0.0f : rows::block_sum(s1, scratch) * inv_c;
    const float m2 = rows::block_sum(s2, scratch) * inv_c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xh = (to_float(x[r * c + j]) - mu) * rs, g = to_float(dy[r * c + j]);
      const float gw = g * (w ? to_float(w[j]) : 1.0f);
      if (dx) dx[r * c + j] = from_float<T>((accumulate ? to_float(dx[r * c + j]) : 0.0f) + rs * (gw - m1 - xh * m2));
      if (partial_w) partial_w[blockIdx.x * c + j] += g * xh;
      if (partial_b) partial_b[blockIdx.x * c + j] += g;
    }
  }
}

// dw[j] (blockIdx.y 0), db[j] (1) or dsum[j] (2, f32) = the sum over the `parts` rows of its partials
// [parts, c], in a fixed order: 32 columns per block (threadIdx.x, coalesced), the rows split over threadIdx.y
// and the 32 partial sums added in shared memory. Many loads are in flight at once, which a thread per column
// would not have.
template <typename W>
__global__ void column_sum_kernel(const float* __restrict__ partial_w, const float* __restrict__ partial_b,
                                  const float* __restrict__ partial_d, int64_t parts, int64_t c, W* __restrict__ dw,
                                  W* __restrict__ db, float* __restrict__ dsum) {
  __shared__ float tile[32][33];
  const float* part = blockIdx.y == 0 ? partial_w : blockIdx.y == 1 ? partial_b : partial_d;
  if (!part) return;  // the same for the whole block
  const int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (j < c)
    for (int64_t p = threadIdx.y; p < parts; p += 32) s += part[p * c + j];
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; ++k) t += tile[k][threadIdx.x];
    if (blockIdx.y == 0)
      dw[j] = from_float<W>(t);
    else if (blockIdx.y == 1)
      db[j] = from_float<W>(t);
    else
      dsum[j] = t;
  }
}

template <typename T, typename F>
void with_param_type(DType xt, const Tensor& w, const Tensor& b, const char* op, F&& f) {
  DType pt = xt;
  if (w.defined()) pt = w.dtype();
  if (b.defined()) {
    TANDEM_CHECK(!w.defined() || b.dtype() == w.dtype(), op, ": weight ", w.str(), " and bias ", b.str(),
                 " differ in dtype");
    pt = b.dtype();
  }
  TANDEM_CHECK(pt == xt || pt == DType::f32, op, ": parameters of dtype ", dtype_name(pt), " for ", dtype_name(xt),
               " input (use f32 or the input's type)");
  if (pt == DType::f32)
    f(float{});
  else
    f(T{});
}

// Calls f(NV) for the warp-per-row kernels holding rows of c in NV vectors per lane (1, 2, 3, 4, 6 or 8: the
// odd counts keep rows such as GPT-2's 768 without a wasted vector's registers), or returns false.
template <typename T, typename F>
bool with_ln_shape(int64_t c, std::initializer_list<const void*> ptrs, F&& f) {
  constexpr int V = rows::kVec<T>;
  if (!rows::vector_ok<T>(c, ptrs)) return false;
  const int64_t per_lane = (c + 32 * V - 1) / (32 * V);
  if (per_lane <= 1) f(std::integral_constant<int, 1>{});
  else if (per_lane <= 2) f(std::integral_constant<int, 2>{});
  else if (per_lane <= 3) f(std::integral_constant<int, 3>{});
  else if (per_lane <= 4) f(std::integral_constant<int, 4>{});
  else if (per_lane <= 6) f(std::integral_constant<int, 6>{});
  else if (per_lane <= 8) f(std::integral_constant<int, 8>{});
  else return false;
  return true;
}

// Whether the warp-per-row backward reads its rows twice (TANDEM_LN_BACKWARD=reload) or holds them in registers
// between its passes (registers, the default).
bool ln_backward_reload() {
  static const bool reload = [] {
    const char* e = std::getenv("TANDEM_LN_BACKWARD");
    const std::string v = e ? e : "";
    TANDEM_CHECK(v.empty() || v == "reload" || v == "registers", "TANDEM_LN_BACKWARD=", v,
                 ": expected registers (the default) or reload");
    return v == "reload";
  }();
  return reload;
}

template <typename P>
const P* param_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const P*>(t.data_ptr()) : nullptr;
}

}  // namespace

void CudaBackend::layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t n, int64_t c, double eps,
                                     bool rms, Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  TANDEM_ASSERT(x.numel() == n * c && y.numel() == x.numel() && y.dtype() == x.dtype() && rstd.numel() == n &&
                    rstd.dtype() == DType::f32 && (rms || (mean.numel() == n && mean.dtype() == DType::f32)),
                op, " of ", x.str(), " as [", n, ", ", c, "]");
  if (n == 0 || c == 0) return;
  // y contiguous, or [n, c] rows ldy apart padded after c with a one and zeros (at most 32: padded rows).
  const bool padded = !y.is_contiguous();
  TANDEM_ASSERT(!padded || (y.dim() == 2 && y.strides()[1] == 1 && y.strides()[0] > c && y.strides()[0] - c <= 32), op,
                " into ", y.str());
  const int64_t ldy = padded ? y.strides()[0] : c;
  DeviceState& st = state_for(y);
  kern::dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    with_param_type<T>(x.dtype(), w, b, op, [&](auto ptag) {
      using W = decltype(ptag);
      const T* px = static_cast<const T*>(x.data_ptr());
      const W *pw = param_ptr<W>(w), *pb = param_ptr<W>(b);
      T* py = static_cast<T*>(y.data_ptr());
      float* pm = rms ? nullptr : mean.data<float>();
      float* pr = rstd.data<float>();
      const float e = static_cast<float>(eps);
      // Parameters are read VEC at a time like the data, 16 bytes per access (two for f32 parameters of
      // 16-bit data), so their addresses must be 16-byte aligned too.
      const bool warp = ldy % rows::kVec<T> == 0 && with_ln_shape<T>(c, {px, py, pw, pb}, [&](auto ntag) {
        constexpr int NV = decltype(ntag)::value;
        ln_forward_warp_kernel<T, W, rows::kVec<T>, NV><<<rows::warp_row_blocks(n, kWarps), kWarps * 32, 0,
                                                          st.stream>>>(px, pw, pb, py, pm, pr, n, c, ldy, e, rms);
      });
      if (!warp)
        ln_forward_block_kernel<T, W><<<static_cast<unsigned>(std::clamp<int64_t>(n, 1, kern::kMaxBlocks)), kRowThreads,
                                        0, st.stream>>>(px, pw, pb, py, pm, pr, n, c, ldy, e, rms);
      TANDEM_CUDA_LAUNCH_CHECK("layer norm kernel");
    });
  });
}

bool CudaBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                      const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw,
                                      Tensor& db, Tensor& dx_sums) {
  return ln_backward(dy, x, w, mean, rstd, n, c, rms, dx, dw, db, dx_sums, false);
}

bool CudaBackend::layer_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                          const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& acc, Tensor& dw,
                                          Tensor& db, Tensor& acc_sums) {
  TANDEM_ASSERT(acc.numel() == x.numel() && acc.dtype() == x.dtype() && acc.is_contiguous(),
                "layer_norm_backward_add into ", acc.str(), " for ", x.str());
  return ln_backward(dy, x, w, mean, rstd, n, c, rms, acc, dw, db, acc_sums, true);
}

bool CudaBackend::ln_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                              const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw, Tensor& db,
                              Tensor& dx_sums, bool accumulate) {
  const char* op = rms ? "rms_norm backward" : "layer_norm backward";
  TANDEM_ASSERT(x.numel() == n * c && dy.numel() == x.numel() && dy.dtype() == x.dtype() && rstd.numel() == n &&
                    (!dx.defined() || (dx.numel() == x.numel() && dx.dtype() == x.dtype())),
                op, " of ", x.str());
  DeviceState& st = state_for(x);
  if (n == 0 || c == 0) {
    if (dw.defined()) fill(dw, 0.0);
    if (db.defined()) fill(db, 0.0);
    if (dx_sums.defined() && dx.defined()) fill(dx_sums, 0.0);
    return dx_sums.defined() && dx.defined();
  }
  TANDEM_ASSERT(!dx_sums.defined() || (dx_sums.dtype() == DType::f32 && dx_sums.numel() == c), op, ": column sums ",
                dx_sums.str(), " for ", c, " columns");
  const bool want_w = dw.defined(), want_b = db.defined();
  bool summed = false;
  kern::dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    // The parameter gradients take the parameters' type; the weight (if any) decides it.
    with_param_type<T>(x.dtype(), w, want_b ? db : Tensor(), op, [&](auto ptag) {
      using W = decltype(ptag);
      const T* pg = static_cast<const T*>(dy.data_ptr());
      const T* px = static_cast<const T*>(x.data_ptr());
      const W* pw = param_ptr<W>(w);
      const float* pm = rms ? nullptr : mean.data<float>();
      const float* pr = rstd.data<float>();
      T* pd = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
      if (want_w)
        TANDEM_CHECK(dw.dtype() == rows::device_dtype<W>(), op, ": weight gradient ", dw.str(), " must match the weight");
      // Blocks of the block-per-row kernel: enough to fill the GPU a few times over, no more than rows need.
      const int64_t max_blocks = static_cast<int64_t>(st.sm_count) * 4;
      // want_d: the column sums of dx too (the warp kernel only).
      auto launch = [&](unsigned grid, bool zero_partials, bool want_d, auto&& kernel_launch) {
        const bool partial = want_w || want_b || want_d;
        const size_t part_bytes = partial ? static_cast<size_t>(grid) * c * (want_d ? 3 : 2) * sizeof(float) : 0;
        Scratch parts(allocator(st.device), part_bytes);
        float* pw_part = want_w ? parts.as<float>() : nullptr;
        float* pb_part = want_b ? parts.as<float>() + static_cast<size_t>(grid) * c : nullptr;
        float* pd_part = want_d ? parts.as<float>() + static_cast<size_t>(grid) * c * 2 : nullptr;
        if (partial && zero_partials) TANDEM_CUDA_CHECK(cudaMemsetAsync(parts.as<float>(), 0, part_bytes, st.stream));
        kernel_launch(pw_part, pb_part, pd_part);
        TANDEM_CUDA_LAUNCH_CHECK("layer norm backward kernel");
        if (partial) {
          const dim3 sum_grid(static_cast<unsigned>((c + 31) / 32), want_d ? 3 : 2), sum_block(32, 32);
          column_sum_kernel<W><<<sum_grid, sum_block, 0, st.stream>>>(
              pw_part, pb_part, pd_part, grid, c, want_w ? static_cast<W*>(dw.data_ptr()) : nullptr,
              want_b ? static_cast<W*>(db.data_ptr()) : nullptr, want_d ? dx_sums.data<float>() : nullptr);
          TANDEM_CUDA_LAUNCH_CHECK("column_sum_kernel");
        }
      };
      const bool warp = with_ln_shape<T>(c, {pg, px, pd, pw}, [&](auto ntag) {
        constexpr int NV = decltype(ntag)::value, VEC = rows::kVec<T>;
        const bool want_d = pd && dx_sums.defined();
        const int per_warp = want_d ? 3 : (want_w || want_b) ? 2 : 0;
        const size_t smem = size_t(kBackwardWarps) * per_warp * sizeof(float) * NV * 32 * VEC;
        const bool reload = ln_backward_reload();
        auto kernel = reload ? ln_backward_warp_kernel<T, W, VEC, NV, true> : ln_backward_warp_kernel<T, W, VEC, NV, false>;
        if (smem > 48 * 1024) {  // long rows: more shared memory than the default (the most it may need)
          static std::once_flag once[2];  // per variant
          std::call_once(once[reload ? 1 : 0], [&] {
            TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(size_t(kBackwardWarps) * 3 * sizeof(float) *
                                                                    NV * 32 * VEC)));
          });
        }
        // One full wave of resident blocks (each block's partial sums cost a row of [grid, c]), no more than
        // the rows need.
        int per_sm = 0;
        TANDEM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBackwardWarps * 32, smem));
        const int64_t wave = static_cast<int64_t>(st.sm_count) * std::max(per_sm, 1);
        const unsigned grid =
            static_cast<unsigned>(std::clamp<int64_t>((n + kBackwardWarps - 1) / kBackwardWarps, 1, wave));
        launch(grid, false, want_d, [&](float* a, float* b2, float* d) {
          kernel<<<grid, kBackwardWarps * 32, smem, st.stream>>>(pg, px, pw, pm, pr, pd, a, b2, d, n, c, rms,
                                                                  accumulate);
        });
        summed = want_d;
      });
      if (!warp) {
        const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(n, 1, max_blocks));
        launch(grid, true, false, [&](float* a, float* b2, float*) {
          ln_backward_block_kernel<T, W><<<grid, kRowThreads, 0, st.stream>>>(pg, px, pw, pm, pr, pd, a, b2, n, c, rms,
                                                                               accumulate);
        });
      }
    });
  });
  return summed;
}

}  // namespace tandem::backend
