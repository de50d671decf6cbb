// CPU backend: the losses of tandem's N-D loss ops, per row (softmax cross-entropy and negative
// log-likelihood against class indices, with an ignored index) and per element (squared error, binary
// cross-entropy from probabilities or from logits). The reductions are the op's (src/ops/losses.cpp).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_vec_math.h"

namespace tandem::backend {

namespace {

// Targets as i64, each checked: in [0, c) or the ignored index.
template <typename F>
void with_targets(const Tensor& targets, int64_t n, int64_t c, int64_t ignore, const char* op, F f) {
  TANDEM_ASSERT(targets.numel() == n, op, ": ", targets.str(), " for ", n, " rows");
  auto run = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = static_cast<int64_t>(p[i]);
      TANDEM_CHECK(t == ignore || (t >= 0 && t < c), op, ": target ", t, " at position ", i, " is outside [0, ", c,
                   ") for ", c, " classes (and is not the ignored index ", ignore, ")");
    }
    f(p);
  };
  if (targets.dtype() == DType::i32)
    run(targets.data<int32_t>());
  else if (targets.dtype() == DType::i64)
    run(targets.data<int64_t>());
  else
    TANDEM_CHECK(false, op, ": targets must be i32 or i64, got ", targets.str());
}

template <typename T>
T weight_at(const T* g, int64_t gn, int64_t i) {
  return gn == 1 ? g[0] : g[i];
}

// log(x) clamped at -100, as PyTorch's binary cross-entropy keeps log 0 finite.
inline double clamped_log(double x) { return std::max(std::log(x), -100.0); }

}  // namespace

void CpuBackend::xent_rows_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                   Tensor& lse, Tensor& valid) {
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(loss.numel() == n && lse.numel() == n && valid.numel() == n, "xent_rows_forward on ", logits.str());
  if (n == 0) return;
  with_targets(targets, n, c, ignore_index, "softmax_cross_entropy", [&](const auto* tg) {
    dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(logits.data_ptr());
      T *pl = static_cast<T*>(loss.data_ptr()), *pz = static_cast<T*>(lse.data_ptr()),
        *pv = static_cast<T*>(valid.data_ptr());
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const T* xr = x + i * c;
          double z;
          if constexpr (std::is_same_v<T, float>) {  // vectorised (cpu_vec_math.h)
            float lo = -INFINITY, mx = -INFINITY;
            if (c > 0) cpu::min_max_f32(xr, c, lo, mx);
            if (std::isinf(mx) && mx < 0) mx = 0.0f;
            z = mx + std::log(cpu::exp_sum_f32<false>(xr, nullptr, c, 1.0f, mx, lo));
          } else {
            double mx = -INFINITY;
            for (int64_t j = 0; j < c; ++j) mx = std::max(mx, static_cast<double>(xr[j]));
            double s = 0.0;
            for (int64_t j = 0; j < c; ++j) s += std::exp(static_cast<double>(xr[j]) - mx);
            z = mx + std::log(s);
          }
          pz[i] = static_cast<T>(z);
          const int64_t t = static_cast<int64_t>(tg[i]);
          const bool keep = t != ignore_index;
          pv[i] = keep ? T(1) : T(0);
          pl[i] = keep ? static_cast<T>(z - static_cast<double>(xr[t])) : T(0);
        }
      });
    });
  });
}

void CpuBackend::xent_rows_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g,
                                    int64_t ignore_index, Tensor& dlogits) {
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(lse.numel() == n && (g.numel() == 1 || g.numel() == n) && dlogits.numel() == n * c,
                "xent_rows_backward on ", logits.str());
  if (n == 0) return;
  with_targets(targets, n, c, ignore_index, "softmax_cross_entropy", [&](const auto* tg) {
    dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(logits.data_ptr());
      const T* pz = static_cast<const T*>(lse.data_ptr());
      const T* pg = static_cast<const T*>(g.data_ptr());
      T* d = static_cast<T*>(dlogits.data_ptr());
      const int64_t gn = g.numel();
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t t = static_cast<int64_t>(tg[i]);
          T* dr = d + i * c;
          if (t == ignore_index) {
            std::fill(dr, dr + c, T(0));
            continue;
          }
          const double w = static_cast<double>(weight_at(pg, gn, i)), z = static_cast<double>(pz[i]);
          if constexpr (std::is_same_v<T, float>) {
            const float zf = static_cast<float>(z), wf = static_cast<float>(w);
            const float* xr = x + i * c;
            for (int64_t j = 0; j < c; ++j) dr[j] = cpu::exp_f32(xr[j] - zf) * wf;
          } else {
            for (int64_t j = 0; j < c; ++j) dr[j] = static_cast<T>(std::exp(static_cast<double>(x[i * c + j]) - z) * w);
          }
          dr[t] = static_cast<T>(static_cast<double>(dr[t]) - w);
        }
      });
    });
  });
}

// The fused classifier's forward: each row's loss as xent_rows_forward gives it, then the row overwritten by its
// gradient at unit weight (the values xent_rows_backward gives with a weight of 1), while the row is in cache.
// Columns from `classes` on are padding: left out of the log-sum-exp and given gradient 0.
void CpuBackend::xent_rows_forward_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                        Tensor& valid, int64_t classes) {
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(loss.numel() == n && valid.numel() == n && logits.is_contiguous() && classes >= 0 && classes <= c,
                "xent_rows_forward_grad on ", logits.str(), " with ", classes, " classes");
  if (n == 0) return;
  with_targets(targets, n, classes, ignore_index, "softmax_cross_entropy", [&](const auto* tg) {
    dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      T* x = static_cast<T*>(logits.data_ptr());
      T *pl = static_cast<T*>(loss.data_ptr()), *pv = static_cast<T*>(valid.data_ptr());
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          T* xr = x + i * c;
          std::fill(xr + classes, xr + c, T(0));
          const int64_t t = static_cast<int64_t>(tg[i]);
          if (t == ignore_index) {
            pl[i] = T(0);
            pv[i] = T(0);
            std::fill(xr, xr + classes, T(0));
            continue;
          }
          // The log-sum-exp; the gradient takes it rounded to T, as xent_rows_backward takes the stored one.
          double zd;
          if constexpr (std::is_same_v<T, float>) {
            float mn = -INFINITY, mx = -INFINITY;
            cpu::min_max_f32(xr, classes, mn, mx);
            if (std::isinf(mx) && mx < 0) mx = 0.0f;
            zd = mx + std::log(cpu::exp_sum_f32<false>(xr, nullptr, classes, 1.0f, mx, mn));
          } else {
            double mx = -INFINITY;
            for (int64_t j = 0; j < classes; ++j) mx = std::max(mx, static_cast<double>(xr[j]));
            double s = 0.0;
            for (int64_t j = 0; j < classes; ++j) s += std::exp(static_cast<double>(xr[j]) - mx);
            zd = mx + std::log(s);
          }
          const T z = static_cast<T>(zd);
          pv[i] = T(1);
          pl[i] = static_cast<T>(zd - static_cast<double>(xr[t]));
          if constexpr (std::is_same_v<T, float>) {
            for (int64_t j = 0; j < classes; ++j) xr[j] = cpu::exp_f32(xr[j] - z);
          } else {
            const double zd = static_cast<double>(z);
            for (int64_t j = 0; j < classes; ++j) xr[j] = static_cast<T>(std::exp(static_cast<double>(xr[j]) - zd));
          }
          xr[t] = static_cast<T>(static_cast<double>(xr[t]) - 1.0);
        }
      });
    });
  });
}

void CpuBackend::nll_rows_forward(const Tensor& logp, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                  Tensor& valid) {
  const int64_t n = logp.size(0), c = logp.size(1);
  TANDEM_ASSERT(loss.numel() == n && valid.numel() == n, "nll_rows_forward on ", logp.str());
  if (n == 0) return;
  with_targets(targets, n, c, ignore_index, "nll_loss", [&](const auto* tg) {
    dispatch_float(logp.dtype(), "nll_loss", [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(logp.data_ptr());
      T *pl = static_cast<T*>(loss.data_ptr()), *pv = static_cast<T*>(valid.data_ptr());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = static_cast<int64_t>(tg[i]);
        const bool keep = t != ignore_index;
        pv[i] = keep ? T(1) : T(0);
        pl[i] = keep ? static_cast<T>(-x[i * c + t]) : T(0);
      }
    });
  });
}

void CpuBackend::nll_rows_backward(const Tensor& targets, const Tensor& g, int64_t ignore_index, Tensor& dlogp) {
  const int64_t n = dlogp.size(0), c = dlogp.size(1);
  TANDEM_ASSERT(g.numel() == 1 || g.numel() == n, "nll_rows_backward weights ", g.str());
  if (n == 0) return;
  with_targets(targets, n, c, ignore_index, "nll_loss", [&](const auto* tg) {
    dispatch_float(dlogp.dtype(), "nll_loss", [&](auto tag) {
      using T = decltype(tag);
      const T* pg = static_cast<const T*>(g.data_ptr());
      T* d = static_cast<T*>(dlogp.data_ptr());
      std::fill(d, d + n * c, T(0));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = static_cast<int64_t>(tg[i]);
        if (t != ignore_index) d[i * c + t] = static_cast<T>(-weight_at(pg, g.numel(), i));
      }
    });
  });
}

void CpuBackend::pointwise_loss_forward(PointLoss op, const Tensor& x, const Tensor& t, Tensor& loss) {
  TANDEM_ASSERT(x.numel() == t.numel() && loss.numel() == x.numel() && x.dtype() == t.dtype(),
                "pointwise_loss_forward on ", x.str(), " and ", t.str());
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "loss", [&](auto tag) {
    using T = decltype(tag);
    const T *px = static_cast<const T*>(x.data_ptr()), *pt = static_cast<const T*>(t.data_ptr());
    T* pl = static_cast<T*>(loss.data_ptr());
    cpu::parallel_for(n, cpu::kParallelElems, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const double v = static_cast<double>(px[i]), y = static_cast<double>(pt[i]);
        double l = 0.0;
        switch (op) {
          case PointLoss::SquaredError: l = (v - y) * (v - y); break;
          case PointLoss::BinaryCrossEntropy: l = -(y * clamped_log(v) + (1.0 - y) * clamped_log(1.0 - v)); break;
          case PointLoss::BinaryCrossEntropyWithLogits:
            l = std::max(v, 0.0) - v * y + std::log1p(std::exp(-std::abs(v)));
            break;
        }
        pl[i] = static_cast<T>(l);
      }
    });
  });
}

void CpuBackend::pointwise_loss_backward(PointLoss op, const Tensor& x, const Tensor& t, const Tensor& g, Tensor& dx) {
  TANDEM_ASSERT(x.numel() == t.numel() && dx.numel() == x.numel() && (g.numel() == 1 || g.numel() == x.numel()),
                "pointwise_loss_backward on ", x.str(), " and ", t.str());
  const int64_t n = x.numel(), gn = g.numel();
  dispatch_float(x.dtype(), "loss", [&](auto tag) {
    using T = decltype(tag);
    const T *px = static_cast<const T*>(x.data_ptr()), *pt = static_cast<const T*>(t.data_ptr()),
            *pg = static_cast<const T*>(g.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    cpu::parallel_for(n, cpu::kParallelElems, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const double v = static_cast<double>(px[i]), y = static_cast<double>(pt[i]);
        const double w = static_cast<double>(weight_at(pg, gn, i));
        double d = 0.0;
        switch (op) {
          case PointLoss::SquaredError: d = 2.0 * (v - y); break;
          case PointLoss::BinaryCrossEntropy:
            // (p - t) / (p (1 - p)), the denominator kept from 0 as PyTorch keeps it (at 1e-12).
            d = (v - y) / std::max((1.0 - v) * v, 1e-12);
            break;
          case PointLoss::BinaryCrossEntropyWithLogits: d = 1.0 / (1.0 + std::exp(-v)) - y; break;
        }
        pd[i] = static_cast<T>(d * w);
      }
    });
  });
}

}  // namespace tandem::backend
