// CPU backend: layer and RMS normalisation over the rows of [n, c], forward and backward. Statistics take
// two passes over the row (the mean, then the squared deviations): in double for f64, for f32 in float
// lanes the compiler vectorises, ended in double (cpu_vec_math.h); the parameters' gradients are summed
// per block of rows and the blocks added in order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_vec_math.h"

namespace tandem::backend {

namespace {

constexpr int64_t kRowsPerBlock = 64;  // rows whose parameter gradients one task sums
// f32 rows taken together: each row's statistics are a chain of dependent steps (the sums, the mean, the
// square root), and a group's chains overlap where one row's would leave the core waiting.
constexpr int64_t kRowGroup = 4;

// Up to kRowGroup f32 rows of the forward, from x (c apart) into y (ldy apart): y = (x - mean) rstd [* w] [+ b],
// and each row's mean (mean null: not stored) and rstd; every row's statistics first, then the rows written.
// inv_c is 1 / c (0 for c = 0).
void norm_rows_f32(const float* x, const float* w, const float* b, float* y, int64_t ldy, int64_t rows, int64_t c,
                   double inv_c, double eps, bool rms, float* mean, float* rstd) {
  float mus[kRowGroup], rs[kRowGroup];
  for (int64_t i = 0; i < rows; ++i) mus[i] = rms ? 0.0f : static_cast<float>(cpu::sum_f32(x + i * c, c) * inv_c);
  for (int64_t i = 0; i < rows; ++i)
    rs[i] = static_cast<float>(1.0 / std::sqrt(cpu::sum_sq_dev_f32(x + i * c, c, mus[i]) * inv_c + eps));
  for (int64_t i = 0; i < rows; ++i) {
    const float *xr = x + i * c, mu = mus[i], r = rs[i];
    float* yr = y + i * ldy;
    if (w && b)
      for (int64_t k = 0; k < c; ++k) yr[k] = (xr[k] - mu) * r * w[k] + b[k];
    else if (w)
      for (int64_t k = 0; k < c; ++k) yr[k] = (xr[k] - mu) * r * w[k];
    else if (b)
      for (int64_t k = 0; k < c; ++k) yr[k] = (xr[k] - mu) * r + b[k];
    else
      for (int64_t k = 0; k < c; ++k) yr[k] = (xr[k] - mu) * r;
    if (mean) mean[i] = mu;
    rstd[i] = r;
  }
}

// Up to kRowGroup f32 rows of the backward, from x and g (c apart), with their mean (null: 0) and rstd: dx =
// rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = g w (w null: g), xhat = (x - mean) rstd (dx null: not
// written), the rows' parameter gradients added into aw and ab (where not null) on the one pass that takes
// every row's sums (aw and ab read and written once for the group), then the rows' dx (added to what dx holds
// with add), their column sums added into ad where not null.
void norm_rows_backward_f32(const float* x, const float* g, const float* w, const float* mean, const float* rstd,
                            float* dx, float* aw, float* ab, int64_t rows, int64_t c, bool rms, bool add, float* ad) {
  float mus[kRowGroup] = {}, m1[kRowGroup], m2[kRowGroup];
  double s1[kRowGroup], s2[kRowGroup];
  if (mean) std::copy(mean, mean + rows, mus);
  static_assert(kRowGroup == 4, "the switch takes groups of one to four rows");
  switch (rows) {
    case 4: cpu::norm_backward_rows_f32<4>(g, w, x, c, c, mus, rstd, aw, ab, s1, s2); break;
    case 3: cpu::norm_backward_rows_f32<3>(g, w, x, c, c, mus, rstd, aw, ab, s1, s2); break;
    case 2: cpu::norm_backward_rows_f32<2>(g, w, x, c, c, mus, rstd, aw, ab, s1, s2); break;
    default: cpu::norm_backward_rows_f32<1>(g, w, x, c, c, mus, rstd, aw, ab, s1, s2); break;
  }
  const double inv_c = 1.0 / static_cast<double>(c);
  for (int64_t i = 0; i < rows; ++i) {
    m1[i] = rms ? 0.0f : static_cast<float>(s1[i] * inv_c);
    m2[i] = static_cast<float>(s2[i] * rstd[i] * inv_c);
  }
  if (!dx) return;
  for (int64_t i = 0; i < rows; ++i) {
    const float *xr = x + i * c, *gr = g + i * c, mu = mus[i], r = rstd[i], a = m1[i], bm = m2[i];
    float* dr = dx + i * c;
    if (add && w)
      for (int64_t k = 0; k < c; ++k) dr[k] += r * (gr[k] * w[k] - a - (xr[k] - mu) * r * bm);
    else if (add)
      for (int64_t k = 0; k < c; ++k) dr[k] += r * (gr[k] - a - (xr[k] - mu) * r * bm);
    else if (w)
      for (int64_t k = 0; k < c; ++k) dr[k] = r * (gr[k] * w[k] - a - (xr[k] - mu) * r * bm);
    else
      for (int64_t k = 0; k < c; ++k) dr[k] = r * (gr[k] - a - (xr[k] - mu) * r * bm);
    if (ad)
      for (int64_t k = 0; k < c; ++k) ad[k] += dr[k];
  }
}

// Rows [lo, hi) of y (ldy apart): 1 at column c, 0 after it.
template <typename T>
void pad_rows(T* y, int64_t lo, int64_t hi, int64_t c, int64_t ldy) {
  for (int64_t i = lo; i < hi; ++i) {
    T* r = y + i * ldy;
    r[c] = T(1);
    for (int64_t j = c + 1; j < ldy; ++j) r[j] = T(0);
  }
}

template <typename T>
const T* opt_data(const Tensor& t, const char* op) {
  if (!t.defined()) return nullptr;
  TANDEM_CHECK(t.dtype() == dtype_of<T>(), op, ": parameter ", t.str(), " must have the input's dtype on the CPU");
  return static_cast<const T*>(t.data_ptr());
}

}  // namespace

void CpuBackend::layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t n, int64_t c, double eps,
                                    bool rms, Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  TANDEM_ASSERT(x.numel() == n * c && y.numel() == x.numel() && rstd.numel() == n && (rms || mean.numel() == n), op,
                " of ", x.str(), " as [", n, ", ", c, "]");
  if (n == 0) return;
  // y contiguous, or [n, c] rows ldy apart padded after c with a one and zeros (padded rows, see the op).
  const bool padded = !y.is_contiguous();
  TANDEM_ASSERT(!padded || (y.dim() == 2 && y.strides()[1] == 1 && y.strides()[0] > c), op, " into ", y.str());
  const int64_t ldy = padded ? y.strides()[0] : c;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T *pw = opt_data<T>(w, op), *pb = opt_data<T>(b, op);
    T* py = static_cast<T*>(y.data_ptr());
    T* pm = rms ? nullptr : static_cast<T*>(mean.data_ptr());
    T* pr = static_cast<T*>(rstd.data_ptr());
    const double inv_c = c ? 1.0 / static_cast<double>(c) : 0.0;
    cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t lo, int64_t hi) {
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t i = lo; i < hi; i += kRowGroup)
          norm_rows_f32(px + i * c, pw, pb, py + i * ldy, ldy, std::min(kRowGroup, hi - i), c, inv_c, eps, rms,
                        pm ? pm + i : nullptr, pr + i);
        if (padded) pad_rows(py, lo, hi, c, ldy);
        return;
      }
      for (int64_t i = lo; i < hi; ++i) {
        const T* xr = px + i * c;
        T* yr = py + i * ldy;
        double mu = 0.0;
        if (!rms) {
          for (int64_t j = 0; j < c; ++j) mu += static_cast<double>(xr[j]);
          mu = c ? mu / static_cast<double>(c) : 0.0;
        }
        double ss = 0.0;
        for (int64_t j = 0; j < c; ++j) {
          const double d = static_cast<double>(xr[j]) - mu;
          ss += d * d;
        }
        const double r = 1.0 / std::sqrt((c ? ss / static_cast<double>(c) : 0.0) + eps);
        if (pm) pm[i] = static_cast<T>(mu);
        pr[i] = static_cast<T>(r);
        for (int64_t j = 0; j < c; ++j) {
          double v = (static_cast<double>(xr[j]) - mu) * r;
          if (pw) v *= static_cast<double>(pw[j]);
          if (pb) v += static_cast<double>(pb[j]);
          yr[j] = static_cast<T>(v);
        }
      }
      if (padded) pad_rows(py, lo, hi, c, ldy);
    });
  });
}

bool CpuBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw,
                                     Tensor& db, Tensor& dx_sums) {
  return norm_backward(dy, x, w, mean, rstd, n, c, rms, dx, dw, db, dx_sums, false);
}

bool CpuBackend::layer_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                         const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& acc, Tensor& dw,
                                         Tensor& db, Tensor& acc_sums) {
  if (x.dtype() != DType::f32)
    return Backend::layer_norm_backward_add(dy, x, w, mean, rstd, n, c, rms, acc, dw, db, acc_sums);
  TANDEM_ASSERT(acc.numel() == x.numel() && acc.dtype() == x.dtype() && acc.is_contiguous(),
                "layer_norm_backward_add into ", acc.str(), " for ", x.str());
  return norm_backward(dy, x, w, mean, rstd, n, c, rms, acc, dw, db, acc_sums, true);
}

// f32: dx added into (add) or written, with its column sums where dx_sums is defined; f64: dx written.
bool CpuBackend::norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                               const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw, Tensor& db,
                               Tensor& dx_sums, bool add) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  TANDEM_ASSERT(x.numel() == n * c && dy.numel() == x.numel() && rstd.numel() == n, op, " backward of ", x.str());
  bool summed = false;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pg = static_cast<const T*>(dy.data_ptr());
    const T* pw = opt_data<T>(w, op);
    const T* pm = rms ? nullptr : static_cast<const T*>(mean.data_ptr());
    const T* pr = static_cast<const T*>(rstd.data_ptr());
    T* pdx = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
    const bool want_w = dw.defined(), want_b = db.defined();
    if constexpr (std::is_same_v<T, float>) {
      // One pass over x and dy: each block of rows writes its dx and sums its rows' parameter gradients in
      // float (a block is 64 rows), the blocks' sums then added per column in double, in block order.
      const bool want_d = pdx && dx_sums.defined();
      if (n == 0) {
        if (want_w) fill(dw, 0.0);
        if (want_b) fill(db, 0.0);
        if (want_d) fill(dx_sums, 0.0);
        summed = want_d;
        return;
      }
      const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
      std::vector<float> part_w(want_w ? blocks * c : 0), part_b(want_b ? blocks * c : 0),
          part_d(want_d ? blocks * c : 0);
      cpu::parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {  // a block is work enough for a task
        for (int64_t blk = lo; blk < hi; ++blk) {
          float* aw = want_w ? part_w.data() + blk * c : nullptr;
          float* ab = want_b ? part_b.data() + blk * c : nullptr;
          float* ad = want_d ? part_d.data() + blk * c : nullptr;
          const int64_t r0 = blk * kRowsPerBlock, r1 = std::min(n, r0 + kRowsPerBlock);
          for (int64_t i = r0; i < r1; i += kRowGroup)
            norm_rows_backward_f32(px + i * c, pg + i * c, pw, pm ? pm + i : nullptr, pr + i,
                                   pdx ? pdx + i * c : nullptr, aw, ab, std::min(kRowGroup, r1 - i), c, rms, add, ad);
        }
      });
      auto finish = [&](const std::vector<float>& part, Tensor& out) {
        TANDEM_CHECK(out.dtype() == DType::f32, op, ": parameter gradient ", out.str(), " must have the input's dtype");
        float* po = static_cast<float*>(out.data_ptr());
        std::vector<double> acc(c, 0.0);
        for (int64_t blk = 0; blk < blocks; ++blk)
          for (int64_t j = 0; j < c; ++j) acc[j] += part[blk * c + j];
        for (int64_t j = 0; j < c; ++j) po[j] = static_cast<float>(acc[j]);
      };
      if (want_w) finish(part_w, dw);
      if (want_b) finish(part_b, db);
      if (want_d) finish(part_d, dx_sums);
      summed = want_d;
      return;
    }
    TANDEM_ASSERT(!add, op, " backward added into ", dx.str(), " on the CPU is f32 only");
    // f64: statistics and sums in double, dx first, then the parameter gradients per block of rows.
    if (pdx && n > 0) {
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const T* xr = px + i * c;
          const T* gr = pg + i * c;
          T* dr = pdx + i * c;
          const double mu = pm ? static_cast<double>(pm[i]) : 0.0, r = static_cast<double>(pr[i]);
          // With gw = dy * w and xhat = (x - mean) * rstd: dx = rstd (gw - mean(gw) - xhat mean(gw xhat)), the
          // mean(gw) term absent for RMS normalisation.
          double s1 = 0.0, s2 = 0.0;
          for (int64_t j = 0; j < c; ++j) {
            const double gw = static_cast<double>(gr[j]) * (pw ? static_cast<double>(pw[j]) : 1.0);
            s1 += gw;
            s2 += gw * (static_cast<double>(xr[j]) - mu) * r;
          }
          const double inv_c = 1.0 / static_cast<double>(c);
          const double m1 = rms ? 0.0 : s1 * inv_c, m2 = s2 * inv_c;
          for (int64_t j = 0; j < c; ++j) {
            const double gw = static_cast<double>(gr[j]) * (pw ? static_cast<double>(pw[j]) : 1.0);
            const double xhat = (static_cast<double>(xr[j]) - mu) * r;
            dr[j] = static_cast<T>(r * (gw - m1 - xhat * m2));
          }
        }
      });
    }
    if (!want_w && !want_b) return;
    const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
    std::vector<double> part_w(want_w ? blocks * c : 0), part_b(want_b ? blocks * c : 0);
    cpu::parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t blk = lo; blk < hi; ++blk) {
        double* aw = want_w ? part_w.data() + blk * c : nullptr;
        double* ab = want_b ? part_b.data() + blk * c : nullptr;
        const int64_t r0 = blk * kRowsPerBlock, r1 = std::min(n, r0 + kRowsPerBlock);
        for (int64_t i = r0; i < r1; ++i) {
          const double mu = pm ? static_cast<double>(pm[i]) : 0.0, r = static_cast<double>(pr[i]);
          for (int64_t j = 0; j < c; ++j) {
            const double g = static_cast<double>(pg[i * c + j]);
            if (aw) aw[j] += g * (static_cast<double>(px[i * c + j]) - mu) * r;
            if (ab) ab[j] += g;
          }
        }
      }
    });
    auto finish = [&](const std::vector<double>& part, Tensor& out) {
      T* po = static_cast<T*>(out.data_ptr());
      TANDEM_CHECK(out.dtype() == dtype_of<T>(), op, ": parameter gradient ", out.str(), " must have the input's dtype");
      for (int64_t j = 0; j < c; ++j) {
        double s = 0.0;
        for (int64_t blk = 0; blk < blocks; ++blk) s += part[blk * c + j];
        po[j] = static_cast<T>(s);
      }
    };
    if (want_w) finish(part_w, dw);
    if (want_b) finish(part_b, db);
  });
  return summed;
}

}  // namespace tandem::backend
