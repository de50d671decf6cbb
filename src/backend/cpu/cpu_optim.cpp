// CPU backend: fused optimizer updates over many parameter tensors in one call.
#include <cmath>
#include <type_traits>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

using cpu::kParallelElems;

namespace {

void check_slot(const ParamSlot& s, int64_t i, bool need_buf0, bool need_buf1, const char* op) {
  TANDEM_ASSERT(s.param.defined() && s.grad.defined(), op, ": slot ", i, " lacks a parameter or gradient");
  TANDEM_ASSERT(s.grad.numel() == s.param.numel() && s.grad.dtype() == s.param.dtype(), op, ": slot ", i,
                " gradient ", s.grad.str(), " does not match ", s.param.str());
  if (need_buf0)
    TANDEM_ASSERT(s.buf0.defined() && s.buf0.numel() == s.param.numel() && s.buf0.dtype() == s.param.dtype(), op,
                  ": slot ", i, " first state buffer ", s.buf0.str(), " does not match ", s.param.str());
  if (need_buf1)
    TANDEM_ASSERT(s.buf1.defined() && s.buf1.numel() == s.param.numel() && s.buf1.dtype() == s.param.dtype(), op,
                  ": slot ", i, " second state buffer ", s.buf1.str(), " does not match ", s.param.str());
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

template <typename T>
void sgd_one(const ParamSlot& s, const SgdArgs& a) {
  const int64_t n = s.param.numel();
  T* p = ptr<T>(s.param);
  const T* g = ptr<T>(s.grad);
  const T lr = static_cast<T>(a.lr), wd = static_cast<T>(a.weight_decay), mom = static_cast<T>(a.momentum),
          damp = static_cast<T>(1.0 - a.dampening);
  if (a.momentum == 0.0) {
    cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    });
    return;
  }
  T* buf = ptr<T>(s.buf0);
  const bool first = a.first_step, nesterov = a.nesterov;
  cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T d = g[i] + wd * p[i];
      const T b = first ? d : mom * buf[i] + damp * d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + mom * b : b);
    }
  });
}

// Adam's scalars for one step (AdamArgs in the parameters' type).
template <typename T>
struct AdamScalars {
  T b1, b2, c1, c2, step, inv_sqrt_bc2, eps, l2, shrink;
  explicit AdamScalars(const AdamArgs& a) {
    const double t = static_cast<double>(a.step);
    b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
    c1 = static_cast<T>(1.0 - a.beta1), c2 = static_cast<T>(1.0 - a.beta2);
    // lr * (m / bc1) / (sqrt(v / bc2) + eps) == step * m / (sqrt(v) * inv_sqrt_bc2 + eps)
    step = static_cast<T>(a.lr / (1.0 - std::pow(a.beta1, t)));
    inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(1.0 - std::pow(a.beta2, t)));
    eps = static_cast<T>(a.eps);
    l2 = a.decoupled ? T(0) : static_cast<T>(a.weight_decay);
    shrink = a.decoupled ? static_cast<T>(1.0 - a.lr * a.weight_decay) : T(1);
  }
};

// Elements [lo, hi) of one parameter: g (times factor, when one is given, as if the gradient had been scaled
// first) updates m, v and p. Every product and sum is written as the fused multiply-add or the rounding it
// is, so that the vector lanes and the scalar tail agree bit for bit.
template <typename T>
void adam_range(T* p, const T* g, T* m, T* v, int64_t lo, int64_t hi, const AdamScalars<T>& s, const float* factor) {
  int64_t i = lo;
  if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 f = _mm256_set1_ps(factor ? *factor : 1.0f), b1 = _mm256_set1_ps(s.b1), b2 = _mm256_set1_ps(s.b2),
                 c1 = _mm256_set1_ps(s.c1), c2 = _mm256_set1_ps(s.c2), st = _mm256_set1_ps(s.step),
                 isb = _mm256_set1_ps(s.inv_sqrt_bc2), eps = _mm256_set1_ps(s.eps), l2 = _mm256_set1_ps(s.l2),
                 shrink = _mm256_set1_ps(s.shrink);
    for (; i + 8 <= hi; i += 8) {
      __m256 gi = _mm256_loadu_ps(g + i);
      if (factor) gi = _mm256_mul_ps(gi, f);
      const __m256 pi = _mm256_loadu_ps(p + i);
      gi = _mm256_fmadd_ps(l2, pi, gi);
      const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(c1, gi));
      const __m256 vi = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
      const __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), isb, eps);
      _mm256_storeu_ps(m + i, mi);
      _mm256_storeu_ps(v + i, vi);
      _mm256_storeu_ps(p + i, _mm256_fmsub_ps(pi, shrink, _mm256_div_ps(_mm256_mul_ps(st, mi), den)));
    }
#endif
  }
  for (; i < hi; ++i) {
    T gi = factor ? static_cast<T>(g[i] * static_cast<T>(*factor)) : g[i];
    gi = std::fma(s.l2, p[i], gi);
    const T mi = std::fma(s.b1, m[i], static_cast<T>(s.c1 * gi));
    const T vi = std::fma(s.b2, v[i], static_cast<T>(static_cast<T>(s.c2 * gi) * gi));
    const T den = std::fma(std::sqrt(vi), s.inv_sqrt_bc2, s.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = std::fma(p[i], s.shrink, -static_cast<T>(static_cast<T>(s.step * mi) / den));
  }
}

// The 16-bit copy of an updated parameter (ParamSlot::copy), rounded to nearest as Tensor::to rounds.
template <typename C>
void write_copy(const Tensor& param, const Tensor& copy) {
  const float* p = ptr<float>(param);
  C* c = ptr<C>(copy);
  cpu::parallel_for(param.numel(), cpu::grain_for(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) c[i] = C(p[i]);
  });
}

// The slot's copy, if it has one, from its updated parameter.
void write_copy(const ParamSlot& s) {
  if (!s.copy.defined()) return;
  if (s.copy.dtype() == DType::bf16)
    write_copy<BFloat16>(s.param, s.copy);
  else
    write_copy<Half>(s.param, s.copy);
}

void check_copy(const ParamSlot& s, const char* op) {
  TANDEM_CHECK(!s.copy.defined() || (s.param.dtype() == DType::f32 && s.copy.is_contiguous() &&
                                     s.copy.numel() == s.param.numel() &&
                                     (s.copy.dtype() == DType::bf16 || s.copy.dtype() == DType::f16)),
               op, ": the copy ", s.copy.defined() ? s.copy.str() : std::string(), " of parameter ", s.param.str(),
               " is not a contiguous bf16 or f16 tensor of its size (of an f32 parameter)");
}

template <typename T>
void rmsprop_one(const ParamSlot& s, const RmsPropArgs& a) {
  const int64_t n = s.param.numel();
  T* p = ptr<T>(s.param);
  const T* g = ptr<T>(s.grad);
  T* v = ptr<T>(s.buf0);
  const T lr = static_cast<T>(a.lr), alpha = static_cast<T>(a.alpha), one_minus = static_cast<T>(1.0 - a.alpha),
          eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay);
  const bool inside = a.eps_inside_sqrt;
  cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T gi = g[i] + wd * p[i];
      const T vi = alpha * v[i] + one_minus * gi * gi;
      v[i] = vi;
      p[i] -= lr * gi / (inside ? std::sqrt(vi + eps) : std::sqrt(vi) + eps);
    }
  });
}

template <typename T>
void adagrad_one(const ParamSlot& s, const AdagradArgs& a) {
  const int64_t n = s.param.numel();
  T* p = ptr<T>(s.param);
  const T* g = ptr<T>(s.grad);
  T* sum = ptr<T>(s.buf0);
  const T lr = static_cast<T>(a.lr), eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay);
  const bool inside = a.eps_inside_sqrt;
  cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T gi = g[i] + wd * p[i];
      const T si = sum[i] + gi * gi;
      sum[i] = si;
      p[i] -= lr * gi / (inside ? std::sqrt(si + eps) : std::sqrt(si) + eps);
    }
  });
}

}  // namespace

void CpuBackend::sgd_step(ParamSlot* slots, int64_t count, const SgdArgs& a) {
  for (int64_t i = 0; i < count; ++i) {
    check_slot(slots[i], i, a.momentum != 0.0, false, "sgd_step");
    check_copy(slots[i], "sgd_step");
  }
  if (a.guard && !std::isfinite(*a.guard)) return;
  for (int64_t i = 0; i < count; ++i) {
    dispatch_float(slots[i].param.dtype(), "sgd_step", [&](auto tag) { sgd_one<decltype(tag)>(slots[i], a); });
    write_copy(slots[i]);
  }
}

// All the slots' elements in one parallel loop over chunks (small parameters share a thread's chunk list
// instead of each paying for a loop of its own); the gradient factor is applied as the step reads the
// gradients, which are left as they are (as the CUDA kernel leaves them).
void CpuBackend::adam_step(ParamSlot* slots, int64_t count, const AdamArgs& a) {
  TANDEM_ASSERT(a.step >= 1, "adam_step: step ", a.step, " (steps count from 1)");
  for (int64_t i = 0; i < count; ++i) {
    const ParamSlot& s = slots[i];
    check_slot(s, i, true, true, "adam_step");
    TANDEM_CHECK(!a.grad_factor || s.param.dtype() == DType::f32, "adam_step: a gradient factor needs f32 parameters, got ",
                 s.param.str());
    check_copy(s, "adam_step");
  }
  // Chunks of whole cache lines: (slot, first element, end).
  constexpr int64_t kChunk = 16384;
  struct Chunk {
    int64_t slot, lo, hi;
  };
  std::vector<Chunk> chunks;
  for (int64_t i = 0; i < count; ++i)
    for (int64_t lo = 0, n = slots[i].param.numel(); lo < n; lo += kChunk) chunks.push_back({i, lo, std::min(n, lo + kChunk)});
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += slots[i].param.numel();
  const int threads = total >= 2 * kParallelElems ? cpu::max_threads() : 1;
  cpu::parallel_tasks(static_cast<int64_t>(chunks.size()), threads, [&](int64_t c, int) {
    const Chunk& ch = chunks[static_cast<size_t>(c)];
    const ParamSlot& s = slots[ch.slot];
    dispatch_float(s.param.dtype(), "adam_step", [&](auto tag) {
      using T = decltype(tag);
      adam_range<T>(ptr<T>(s.param), ptr<T>(s.grad), ptr<T>(s.buf0), ptr<T>(s.buf1), ch.lo, ch.hi, AdamScalars<T>(a),
                    a.grad_factor);
    });
  });
  for (int64_t i = 0; i < count; ++i) write_copy(slots[i]);
}

void CpuBackend::rmsprop_step(ParamSlot* slots, int64_t count, const RmsPropArgs& a) {
  for (int64_t i = 0; i < count; ++i) check_slot(slots[i], i, true, false, "rmsprop_step");
  if (a.guard && !std::isfinite(*a.guard)) return;
  for (int64_t i = 0; i < count; ++i) {
    dispatch_float(slots[i].param.dtype(), "rmsprop_step", [&](auto tag) { rmsprop_one<decltype(tag)>(slots[i], a); });
  }
}

void CpuBackend::adagrad_step(ParamSlot* slots, int64_t count, const AdagradArgs& a) {
  for (int64_t i = 0; i < count; ++i) check_slot(slots[i], i, true, false, "adagrad_step");
  if (a.guard && !std::isfinite(*a.guard)) return;
  for (int64_t i = 0; i < count; ++i) {
    dispatch_float(slots[i].param.dtype(), "adagrad_step", [&](auto tag) { adagrad_one<decltype(tag)>(slots[i], a); });
  }
}

}  // namespace tandem::backend
