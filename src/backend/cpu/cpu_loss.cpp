// CPU backend: softmax, softmax cross-entropy and classification metrics, one row per task.
#include <atomic>
#include <cmath>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

using cpu::kParallelElems;

namespace {

// Labels as i64, checked against the class count before any parallel work starts.
template <typename F>
void with_labels(const Tensor& labels, int64_t n, int64_t c, const char* op, F f) {
  TANDEM_ASSERT(labels.numel() == n, op, ": ", labels.str(), " for ", n, " rows");
  auto check = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i)
      TANDEM_CHECK(p[i] >= 0 && p[i] < c, op, ": label ", static_cast<int64_t>(p[i]), " of row ", i,
                   " is outside [0, ", c, ") for logits with ", c, " classes");
    f(p);
  };
  if (labels.dtype() == DType::i32)
    check(labels.data<int32_t>());
  else if (labels.dtype() == DType::i64)
    check(labels.data<int64_t>());
  else
    TANDEM_CHECK(false, op, ": labels must be i32 or i64, got ", labels.str());
}

// Index of the first maximum of row[0, c); a NaN counts as the maximum (the first NaN wins).
template <typename T>
int64_t row_argmax(const T* row, int64_t c) {
  int64_t best = 0;
  T bv = row[0];
  for (int64_t j = 1; j < c; ++j) {
    const T v = row[j];
    if (v > bv || (v != v && bv == bv)) bv = v, best = j;
  }
  return best;
}

// pw = softmax of the row xr[0, c); returns the row's maximum and log(sum exp(x - max)), so that
// -log softmax[j] = lse - (x[j] - max).
template <typename T>
std::pair<T, double> softmax_row(const T* xr, T* pw, int64_t c) {
  T mx = xr[0];
  for (int64_t j = 1; j < c; ++j) mx = xr[j] > mx ? xr[j] : mx;
  double sum = 0.0;
  for (int64_t j = 0; j < c; ++j) {
    const T e = std::exp(xr[j] - mx);  // <= 1: no overflow
    pw[j] = e;
    sum += static_cast<double>(e);
  }
  const T inv = static_cast<T>(1.0 / sum);
  for (int64_t j = 0; j < c; ++j) pw[j] *= inv;
  return {mx, std::log(sum)};
}

}  // namespace

void CpuBackend::softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) {
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(probs.numel() == n * c && loss.numel() == 1 && n > 0, "softmax_xent_forward on ", logits.str());
  TANDEM_CHECK(c > 0, "softmax_cross_entropy: logits ", logits.str(), " have no classes");
  with_labels(labels, n, c, "softmax_cross_entropy", [&](const auto* lab) {
    dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(logits.data_ptr());
      T* pr = static_cast<T*>(probs.data_ptr());
      Tensor row_loss_t = cpu::scratch<double>(n);
      double* row_loss = row_loss_t.data<double>();
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const T* xr = x + i * c;
          const auto [mx, lse] = softmax_row(xr, pr + i * c, c);
          row_loss[i] = lse - (static_cast<double>(xr[lab[i]]) - static_cast<double>(mx));
        }
      });
      double total = 0.0;
      for (int64_t i = 0; i < n; ++i) total += row_loss[i];
      *static_cast<T*>(loss.data_ptr()) = static_cast<T>(total / static_cast<double>(n));
    });
  });
}

void CpuBackend::softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                       Tensor& dlogits) {
  const int64_t n = probs.size(0), c = probs.size(1);
  TANDEM_ASSERT(dlogits.numel() == n * c && dloss.numel() == 1 && n > 0, "softmax_xent_backward on ", probs.str());
  with_labels(labels, n, c, "softmax_cross_entropy", [&](const auto* lab) {
    dispatch_float(probs.dtype(), "softmax_cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      const T* p = static_cast<const T*>(probs.data_ptr());
      T* d = static_cast<T*>(dlogits.data_ptr());
      const T scale = static_cast<T>(static_cast<double>(*static_cast<const T*>(dloss.data_ptr())) / n);
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          for (int64_t j = 0; j < c; ++j) d[i * c + j] = p[i * c + j] * scale;
          d[i * c + lab[i]] -= scale;
        }
      });
    });
  });
}

void CpuBackend::softmax_xent_targets_forward(const Tensor& logits, const Tensor& targets, Tensor& loss,
                                              Tensor& probs) {
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(probs.numel() == n * c && targets.numel() == n * c && targets.dtype() == logits.dtype() &&
                    loss.numel() == 1 && n > 0,
                "softmax_xent_targets_forward on ", logits.str(), " and ", targets.str());
  TANDEM_CHECK(c > 0, "softmax_cross_entropy: logits ", logits.str(), " have no classes");
  dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data_ptr());
    const T* t = static_cast<const T*>(targets.data_ptr());
    T* pr = static_cast<T*>(probs.data_ptr());
    Tensor row_loss_t = cpu::scratch<double>(n);
    double* row_loss = row_loss_t.data<double>();
    cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T* xr = x + i * c;
        const T* tr = t + i * c;
        const auto [mx, lse] = softmax_row(xr, pr + i * c, c);
        // A class of target 0 adds nothing, even at -inf logits.
        double l = 0.0;
        for (int64_t j = 0; j < c; ++j)
          if (tr[j] != T(0))
            l += static_cast<double>(tr[j]) * (lse - (static_cast<double>(xr[j]) - static_cast<double>(mx)));
        row_loss[i] = l;
      }
    });
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += row_loss[i];
    *static_cast<T*>(loss.data_ptr()) = static_cast<T>(total / static_cast<double>(n));
  });
}

void CpuBackend::softmax_xent_targets_backward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                                               Tensor& dlogits) {
  const int64_t n = probs.size(0), c = probs.size(1);
  TANDEM_ASSERT(dlogits.numel() == n * c && targets.numel() == n * c && targets.dtype() == probs.dtype() &&
                    dloss.numel() == 1 && n > 0,
                "softmax_xent_targets_backward on ", probs.str(), " and ", targets.str());
  dispatch_float(probs.dtype(), "softmax_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(probs.data_ptr());
    const T* t = static_cast<const T*>(targets.data_ptr());
    T* d = static_cast<T*>(dlogits.data_ptr());
    const T scale = static_cast<T>(static_cast<double>(*static_cast<const T*>(dloss.data_ptr())) / n);
    cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        // The targets' row sum weighs the softmax: d/dx_j of sum_k -t_k log softmax_k is p_j sum_k t_k - t_j.
        double s = 0.0;
        for (int64_t j = 0; j < c; ++j) s += static_cast<double>(t[i * c + j]);
        const T rs = static_cast<T>(s);
        for (int64_t j = 0; j < c; ++j) d[i * c + j] = (p[i * c + j] * rs - t[i * c + j]) * scale;
      }
    });
  });
}

void CpuBackend::argmax_rows(const Tensor& x, Tensor& out) {
  const int64_t n = x.size(0), c = x.size(1);
  TANDEM_ASSERT(out.dtype() == DType::i64 && out.numel() == n, "argmax into ", out.str());
  TANDEM_CHECK(c > 0 || n == 0, "argmax of ", x.str(), ": rows are empty");
  dispatch_arith(x.dtype(), "argmax", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    int64_t* po = out.data<int64_t>();
    cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = row_argmax(px + i * c, c);
    });
  });
}

void CpuBackend::count_correct(const Tensor& logits, const Tensor& labels, Tensor& out, bool accumulate) {
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_ASSERT(out.dtype() == DType::i64 && out.numel() == 1, "count_correct into ", out.str());
  const int64_t base = accumulate ? *out.data<int64_t>() : 0;
  if (n == 0) {
    *out.data<int64_t>() = base;
    return;
  }
  TANDEM_CHECK(c > 0, "count_correct: logits ", logits.str(), " have no classes");
  with_labels(labels, n, c, "count_correct", [&](const auto* lab) {
    dispatch_arith(logits.dtype(), "count_correct", [&](auto tag) {
      using T = decltype(tag);
      const T* px = static_cast<const T*>(logits.data_ptr());
      std::atomic<int64_t> hits{0};
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
        int64_t local = 0;
        for (int64_t i = begin; i < end; ++i) local += row_argmax(px + i * c, c) == static_cast<int64_t>(lab[i]);
        hits.fetch_add(local, std::memory_order_relaxed);
      });
      *out.data<int64_t>() = base + hits.load();
    });
  });
}

void CpuBackend::softmax_rows(const Tensor& x, int64_t n, int64_t c, Tensor& y) {
  TANDEM_ASSERT(x.numel() == n * c && y.numel() == n * c && x.dtype() == y.dtype(), "softmax_rows of ", x.str(),
                " as [", n, ", ", c, "] into ", y.str());
  if (n == 0 || c == 0) return;
  dispatch_float(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T* xr = px + i * c;
        T* yr = py + i * c;
        T mx = xr[0];
        for (int64_t j = 1; j < c; ++j) mx = xr[j] > mx ? xr[j] : mx;
        double sum = 0.0;  // as the loss sums its exponentials, so that both give the same probabilities
        for (int64_t j = 0; j < c; ++j) {
          yr[j] = std::exp(xr[j] - mx);
          sum += static_cast<double>(yr[j]);
        }
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t j = 0; j < c; ++j) yr[j] *= inv;
      }
    });
  });
}

void CpuBackend::softmax_rows_backward(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, Tensor& dx) {
  TANDEM_ASSERT(dy.numel() == n * c && y.numel() == n * c && dx.numel() == n * c && dy.dtype() == y.dtype() &&
                    dx.dtype() == y.dtype(),
                "softmax_rows_backward of ", dy.str(), " and ", y.str(), " into ", dx.str());
  if (n == 0 || c == 0) return;
  dispatch_float(y.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(dy.data_ptr());
    const T* py = static_cast<const T*>(y.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T* gr = pg + i * c;
        const T* yr = py + i * c;
        T* dr = pd + i * c;
        double dot = 0.0;
        for (int64_t j = 0; j < c; ++j) dot += static_cast<double>(gr[j]) * static_cast<double>(yr[j]);
        const T d = static_cast<T>(dot);
        for (int64_t j = 0; j < c; ++j) dr[j] = yr[j] * (gr[j] - d);
      }
    });
  });
}

}  // namespace tandem::backend
