// CPU backend: softmax and log-softmax along any axis, the masked and scaled softmax of attention scores,
// and batched matrix products. Sums are in double; one row (or one column of an inner axis) per step.
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_vec_math.h"

namespace tandem::backend {

namespace {

// Softmax of the `len` values x[0], x[st], x[2 st], ... into y (same strides); entries from `valid` on are
// masked out (probability 0, log-probability -inf). Values are scaled by `scale` first.
template <typename T>
void softmax_line(const T* x, T* y, int64_t len, int64_t st, int64_t valid, double scale, bool log) {
  if (valid <= 0) {  // nothing left to normalise over: every entry masked
    for (int64_t j = 0; j < len; ++j) y[j * st] = log ? -std::numeric_limits<T>::infinity() : T(0);
    return;
  }
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, scale * static_cast<double>(x[j * st]));
  double sum = 0.0;
  if (std::isinf(mx) && mx < 0) mx = 0.0;  // a row of -inf: exp(-inf - 0) = 0 everywhere, NaN after the divide
  for (int64_t j = 0; j < valid; ++j) sum += std::exp(scale * static_cast<double>(x[j * st]) - mx);
  if (log) {
    const double lse = mx + std::log(sum);
    for (int64_t j = 0; j < valid; ++j) y[j * st] = static_cast<T>(scale * static_cast<double>(x[j * st]) - lse);
    for (int64_t j = valid; j < len; ++j) y[j * st] = -std::numeric_limits<T>::infinity();
  } else {
    const double inv = 1.0 / sum;
    for (int64_t j = 0; j < valid; ++j)
      y[j * st] = static_cast<T>(std::exp(scale * static_cast<double>(x[j * st]) - mx) * inv);
    for (int64_t j = valid; j < len; ++j) y[j * st] = T(0);
  }
}

// softmax_line for a contiguous float row and scale >= 0, in float arithmetic (cpu_vec_math.h): one pass
// for the row's extremes (it brings the row into L1), one for the exponentials and their sum (the vector
// exp without its range checks when the extremes are less than 87.3 / scale apart), one to scale them;
// sums end in double. The arguments are scale (x - max), never above 0.
void softmax_row_f32(const float* x, float* y, int64_t len, int64_t valid, float scale, bool log) {
  if (valid <= 0) {
    for (int64_t j = 0; j < len; ++j) y[j] = log ? -std::numeric_limits<float>::infinity() : 0.0f;
    return;
  }
  float lo, mx;
  cpu::min_max_f32(x, valid, lo, mx);
  if (std::isinf(mx) && mx < 0) mx = 0.0f;  // as softmax_line
  if (log) {  // the exponentials only summed
    const float lse = static_cast<float>(std::log(cpu::exp_sum_f32<false>(x, nullptr, valid, scale, mx, lo)));
    for (int64_t j = 0; j < valid; ++j) y[j] = scale * (x[j] - mx) - lse;
    for (int64_t j = valid; j < len; ++j) y[j] = -std::numeric_limits<float>::infinity();
  } else {  // the exponentials stored and summed in one pass, then scaled in place (the row is in L1)
    const float inv = static_cast<float>(1.0 / cpu::exp_sum_f32<true>(x, y, valid, scale, mx, lo));
    for (int64_t j = 0; j < valid; ++j) y[j] *= inv;
    for (int64_t j = valid; j < len; ++j) y[j] = 0.0f;
  }
}

// softmax_line for any row: float rows with non-negative scales take softmax_row_f32.
template <typename T>
void softmax_any(const T* x, T* y, int64_t len, int64_t st, int64_t valid, double scale, bool log) {
  if constexpr (std::is_same_v<T, float>) {
    if (st == 1 && scale >= 0.0) return softmax_row_f32(x, y, len, valid, static_cast<float>(scale), log);
  }
  softmax_line(x, y, len, st, valid, scale, log);
}

template <typename T>
void softmax_line_backward(const T* dy, const T* y, T* dx, int64_t len, int64_t st, bool log) {
  if constexpr (std::is_same_v<T, float>) {
    if (st == 1) {  // a contiguous float row: vectorised (cpu_vec_math.h)
      if (log) {
        const float acc = static_cast<float>(cpu::sum_f32(dy, len));
        for (int64_t j = 0; j < len; ++j) dx[j] = dy[j] - cpu::exp_f32(y[j]) * acc;
      } else {
        const float acc = static_cast<float>(cpu::dot_f32(dy, y, len));
        for (int64_t j = 0; j < len; ++j) dx[j] = y[j] * (dy[j] - acc);
      }
      return;
    }
  }
  double acc = 0.0;
  if (log) {
    for (int64_t j = 0; j < len; ++j) acc += static_cast<double>(dy[j * st]);
    for (int64_t j = 0; j < len; ++j)
      dx[j * st] = static_cast<T>(static_cast<double>(dy[j * st]) - std::exp(static_cast<double>(y[j * st])) * acc);
  } else {
    for (int64_t j = 0; j < len; ++j) acc += static_cast<double>(dy[j * st]) * static_cast<double>(y[j * st]);
    for (int64_t j = 0; j < len; ++j)
      dx[j * st] = static_cast<T>(static_cast<double>(y[j * st]) * (static_cast<double>(dy[j * st]) - acc));
  }
}

}  // namespace

void CpuBackend::softmax_forward(const Tensor& x, int64_t outer, int64_t c, int64_t inner, bool log, Tensor& y) {
  TANDEM_ASSERT(x.numel() == outer * c * inner && y.numel() == x.numel() && x.dtype() == y.dtype(), "softmax of ",
                x.str(), " as [", outer, ", ", c, ", ", inner, "] into ", y.str());
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    // One line per (outer, inner) position, c apart by inner.
    cpu::parallel_for(outer * inner, cpu::grain_for(c), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t o = r / inner, i = r % inner, base = o * c * inner + i;
        softmax_any(px + base, py + base, c, inner, c, 1.0, log);
      }
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& dy, const Tensor& y, int64_t outer, int64_t c, int64_t inner, bool log,
                                  Tensor& dx) {
  TANDEM_ASSERT(dy.numel() == outer * c * inner && y.numel() == dy.numel() && dx.numel() == dy.numel() &&
                    dy.dtype() == y.dtype() && dx.dtype() == y.dtype(),
                "softmax backward of ", dy.str(), " and ", y.str(), " into ", dx.str());
  if (y.numel() == 0) return;
  dispatch_float(y.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(dy.data_ptr());
    const T* py = static_cast<const T*>(y.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    cpu::parallel_for(outer * inner, cpu::grain_for(c), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t o = r / inner, i = r % inner, base = o * c * inner + i;
        softmax_line_backward(pg + base, py + base, pd + base, c, inner, log);
      }
    });
  });
}

void CpuBackend::attention_softmax(const Tensor& s, int64_t batch, int64_t tq, int64_t tk, double scale, bool causal,
                                   Tensor& y) {
  TANDEM_ASSERT(s.numel() == batch * tq * tk && y.numel() == s.numel() && s.dtype() == y.dtype(),
                "attention_softmax of ", s.str(), " into ", y.str());
  if (s.numel() == 0) return;
  dispatch_float(s.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    const T* ps = static_cast<const T*>(s.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    cpu::parallel_for(batch * tq, cpu::grain_for(tk), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t valid = causal ? std::min<int64_t>(tk, r % tq + 1) : tk;
        softmax_any(ps + r * tk, py + r * tk, tk, 1, valid, scale, false);
      }
    });
  });
}

void CpuBackend::attention_mask_documents(Tensor& s, int64_t heads, const Tensor& doc_pos) {
  TANDEM_ASSERT(s.dim() == 3 && s.is_contiguous() && doc_pos.dtype() == DType::i32 && doc_pos.dim() == 2 &&
                    doc_pos.is_contiguous() && heads > 0 && s.size(0) == doc_pos.size(0) * heads &&
                    s.size(1) == doc_pos.size(1),
                "attention_mask_documents: scores ", s.str(), ", positions ", doc_pos.str(), ", ", heads, " heads");
  const int64_t bh = s.size(0), tq = s.size(1), tk = s.size(2);
  const int32_t* pos = doc_pos.data<int32_t>();
  dispatch_float(s.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    T* ps = static_cast<T*>(s.data_ptr());
    cpu::parallel_for(bh * tq, cpu::grain_for(tk), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t i = r % tq, b = r / tq / heads;
        const int64_t first = std::min<int64_t>(tk, std::max<int64_t>(0, i - pos[b * tq + i]));
        for (int64_t j = 0; j < first; ++j) ps[r * tk + j] = static_cast<T>(-1e30);
      }
    });
  });
}

}  // namespace tandem::backend
