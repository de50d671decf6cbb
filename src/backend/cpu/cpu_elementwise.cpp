// CPU backend: the generic elementwise kernel (every elementwise op, broadcasting through strides),
// bias broadcast and reductions.
#include <cmath>
#include <initializer_list>
#include <span>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_sgemm.h"
#include "backend/elementwise_functors.h"

namespace tandem::backend {

using cpu::kParallelElems;

namespace {

using ew::Geometry;

// Calls f(v_0, ..., v_{N-1}) with the operands' elements at offsets i * s_k.
template <int N, typename T, typename F>
inline T apply(const F& f, const T* const* p, int64_t i) {
  if constexpr (N == 1)
    return f(p[0][i]);
  else if constexpr (N == 2)
    return f(p[0][i], p[1][i]);
  else
    return f(p[0][i], p[1][i], p[2][i]);
}

// One run of n output elements: operands advance by their strides s (the contiguous and the
// one-element-broadcast cases get loops the compiler vectorises).
template <int N, typename T, typename F>
inline void run_span(const F& f, T* __restrict o, const T* const* p, const int64_t* s, int64_t n) {
  bool contiguous = true;
  for (int k = 0; k < N; ++k) contiguous = contiguous && s[k] == 1;
  if (contiguous) {
    if constexpr (N == 1) {
      const T* __restrict a = p[0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
    } else if constexpr (N == 2) {
      const T* __restrict a = p[0];
      const T* __restrict b = p[1];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
    } else {
      const T *__restrict a = p[0], *__restrict b = p[1], *__restrict c = p[2];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i], c[i]);
    }
    return;
  }
  if constexpr (N == 2) {
    if (s[0] == 1 && s[1] == 0) {
      const T* __restrict a = p[0];
      const T bv = p[1][0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
      return;
    }
    if (s[0] == 0 && s[1] == 1) {
      const T av = p[0][0];
      const T* __restrict b = p[1];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (N == 1)
      o[i] = f(p[0][i * s[0]]);
    else if constexpr (N == 2)
      o[i] = f(p[0][i * s[0]], p[1][i * s[1]]);
    else
      o[i] = f(p[0][i * s[0]], p[1][i * s[1]], p[2][i * s[2]]);
  }
}

// The generic kernel: out (dense, in its storage order) = f(operands) over the geometry, the innermost
// dimension as runs of run_span, split over the threads by rows (or within the one row).
template <int N, typename T, typename F>
void run(const Geometry& g, T* out, const T* const* in, const F& f) {
  const int nd = g.ndim;
  const int64_t inner = g.sizes[nd - 1];
  const int64_t rows = g.numel / inner;
  int64_t is[N];
  for (int k = 0; k < N; ++k) is[k] = g.strides[k][nd - 1];
  if (rows == 1) {
    cpu::parallel_for(inner, cpu::grain_for(1), [&](int64_t lo, int64_t hi) {
      const T* p[N];
      for (int k = 0; k < N; ++k) p[k] = in[k] + lo * is[k];
      run_span<N>(f, out + lo, p, is, hi - lo);
    });
    return;
  }
  cpu::parallel_for(rows, cpu::grain_for(inner), [&](int64_t lo, int64_t hi) {
    // The outer index of row lo, then an odometer over the outer dimensions.
    int64_t idx[ew::kMaxDims];
    int64_t off[N] = {};
    int64_t r = lo;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = r % g.sizes[d];
      r /= g.sizes[d];
      for (int k = 0; k < N; ++k) off[k] += idx[d] * g.strides[k][d];
    }
    for (int64_t row = lo; row < hi; ++row) {
      const T* p[N];
      for (int k = 0; k < N; ++k) p[k] = in[k] + off[k];
      run_span<N>(f, out + row * inner, p, is, inner);
      for (int d = nd - 2; d >= 0; --d) {
        for (int k = 0; k < N; ++k) off[k] += g.strides[k][d];
        if (++idx[d] < g.sizes[d]) break;
        for (int k = 0; k < N; ++k) off[k] -= idx[d] * g.strides[k][d];
        idx[d] = 0;
      }
    }
  });
}

// Builds the walk of out and its operands (broadcast copies of them past kMaxDims merged dimensions)
// and runs f over it.
template <typename T, int N, typename F>
void elementwise(Tensor& out, const Tensor* const (&operands)[N], const F& f) {
  if (out.numel() == 0) return;
  Geometry g;
  Tensor copies[N];
  const Tensor* use[N];
  for (int k = 0; k < N; ++k) use[k] = operands[k];
  if (!ew::make_geometry(out, std::span<const Tensor* const>(use, N), g)) {
    for (int k = 0; k < N; ++k) {
      copies[k] = ew::broadcast_copy(*operands[k], out);
      use[k] = &copies[k];
    }
    const bool ok = ew::make_geometry(out, std::span<const Tensor* const>(use, N), g);
    TANDEM_ASSERT(ok, "elementwise over ", out.str());
  }
  const T* in[N];
  for (int k = 0; k < N; ++k) in[k] = static_cast<const T*>(use[k]->data_ptr());
  run<N>(g, static_cast<T*>(out.data_ptr()), in, f);
}

void check_types(const char* op, const Tensor& out, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    TANDEM_ASSERT(t->dtype() == out.dtype() && t->device() == out.device(), op, " on ", t->str(), " into ",
                  out.str());
}

// Sums in fixed blocks, then the block sums in order: the result does not depend on the thread count.
constexpr int64_t kSumBlock = 8192;

template <typename T, typename Acc>
Acc blocked_sum(const T* x, int64_t n) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  if (blocks <= 1) {
    Acc acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += static_cast<Acc>(x[i]);
    return acc;
  }
  Tensor part_t = Tensor::empty({blocks * static_cast<int64_t>(sizeof(Acc))}, DType::u8);  // any Acc, 64-byte aligned
  Acc* part = static_cast<Acc*>(part_t.data_ptr());
  cpu::parallel_for(blocks, cpu::grain_for(kSumBlock), [&](int64_t begin, int64_t end) {
    for (int64_t bl = begin; bl < end; ++bl) {
      const int64_t lo = bl * kSumBlock, hi = std::min(n, lo + kSumBlock);
      Acc acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = lo; i < hi; ++i) acc += static_cast<Acc>(x[i]);
      part[bl] = acc;
    }
  });
  Acc total = 0;
  for (int64_t bl = 0; bl < blocks; ++bl) total += part[bl];
  return total;
}

}  // namespace

void CpuBackend::binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) {
  check_types(op_name(op), out, {&a, &b});
  dispatch_arith(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      if (op == Binary::Div && b.numel()) {
        const Tensor bc = b.contiguous();
        const T* pb = static_cast<const T*>(bc.data_ptr());
        for (int64_t i = 0; i < bc.numel(); ++i)
          TANDEM_CHECK(pb[i] != 0, "div: integer division by zero at element ", i, " of the divisor");
      }
    }
    ewf::with_binary<T>(op, [&](auto f) { elementwise<T>(out, {&a, &b}, f); });
  });
}

namespace {
// Whether t is dense f32 of out's numel: the vectorised row kernels' operands.
bool dense_f32(const Tensor& t, const Tensor& out) {
  return t.dtype() == DType::f32 && t.is_contiguous() && t.numel() == out.numel();
}
}  // namespace

void CpuBackend::unary(Unary op, const Tensor& a, Tensor& out, const EwArgs& args) {
  check_types(op_name(op), out, {&a});
  if (op == Unary::GeluTanh && dense_f32(a, out) && dense_f32(out, out)) {  // the transformers' MLP activation
    const float* x = a.data<float>();
    float* y = out.data<float>();
    cpu::parallel_for(out.numel(), cpu::grain_for(8), [&](int64_t lo, int64_t hi) { cpu::gelu_tanh_f32(x + lo, y + lo, hi - lo); });
    return;
  }
  dispatch_float(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_unary<T>(op, args, [&](auto f) { elementwise<T>(out, {&a}, f); });
  });
}

void CpuBackend::ternary(Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) {
  check_types(op_name(op), out, {&a, &b, &c});
  dispatch_arith(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_ternary<T>(op, [&](auto f) { elementwise<T>(out, {&a, &b, &c}, f); });
  });
}

void CpuBackend::affine(const Tensor& a, double alpha, double beta, Tensor& out) {
  unary(Unary::Affine, a, out, EwArgs{alpha, beta});
}

void CpuBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  check_types("axpy", y, {&x});
  dispatch_float(y.dtype(), "axpy", [&](auto tag) {
    using T = decltype(tag);
    elementwise<T>(y, {&x, &y}, ewf::AxpyF<T>{static_cast<T>(alpha)});
  });
}

void CpuBackend::unary_backward(Unary op, const Tensor& grad, const Tensor& saved, Tensor& out, const EwArgs& args) {
  check_types(backward_name(op), out, {&grad, &saved});
  if (op == Unary::GeluTanh && dense_f32(grad, out) && dense_f32(saved, out) && dense_f32(out, out)) {
    const float* g = grad.data<float>();
    const float* x = saved.data<float>();
    float* dx = out.data<float>();
    cpu::parallel_for(out.numel(), cpu::grain_for(8), [&](int64_t lo, int64_t hi) {
      cpu::gelu_tanh_backward_f32(g + lo, x + lo, dx + lo, hi - lo);
    });
    return;
  }
  dispatch_float(out.dtype(), backward_name(op), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_unary_grad<T>(op, args, [&](auto f) { elementwise<T>(out, {&grad, &saved}, f); });
  });
}

void CpuBackend::bias_add(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) {
  TANDEM_ASSERT(x.numel() == n * c * s && out.numel() == n * c * s && b.numel() == c && x.dtype() == out.dtype() &&
                    b.dtype() == out.dtype(),
                "bias_add of ", b.str(), " to ", x.str(), " as [", n, ", ", c, ", ", s, "]");
  dispatch_float(out.dtype(), "bias_add", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (s == 1) {  // [n, c] rows: add the bias vector to each row
      cpu::parallel_for(n, cpu::grain_for(c), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const T* xr = px + i * c;
          T* orow = po + i * c;
          for (int64_t j = 0; j < c; ++j) orow[j] = xr[j] + pb[j];
        }
      });
      return;
    }
    cpu::parallel_for(n * c, cpu::grain_for(s), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T bv = pb[r % c];
        const T* xr = px + r * s;
        T* orow = po + r * s;
        for (int64_t j = 0; j < s; ++j) orow[j] = xr[j] + bv;
      }
    });
  });
}

void CpuBackend::bias_grad(const Tensor& g, int64_t n, int64_t c, int64_t s, Tensor& out) {
  TANDEM_ASSERT(g.numel() == n * c * s && out.numel() == c && g.dtype() == out.dtype(), "bias_grad of ", g.str(),
                " as [", n, ", ", c, ", ", s, "] into ", out.str());
  dispatch_float(out.dtype(), "bias_grad", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (s == 1) {  // column sums of [n, c], accumulated in double row by row
      Tensor acc_t = cpu::scratch<double>(c);
      double* acc = acc_t.data<double>();
      for (int64_t j = 0; j < c; ++j) acc[j] = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const T* row = pg + i * c;
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) acc[j] += static_cast<double>(row[j]);
      }
      for (int64_t j = 0; j < c; ++j) po[j] = static_cast<T>(acc[j]);
      return;
    }
    cpu::parallel_for(c, cpu::grain_for(n * s), [&](int64_t begin, int64_t end) {
      for (int64_t ch = begin; ch < end; ++ch) {
        double acc = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const T* row = pg + (i * c + ch) * s;
#pragma omp simd reduction(+ : acc)
          for (int64_t j = 0; j < s; ++j) acc += static_cast<double>(row[j]);
        }
        po[ch] = static_cast<T>(acc);
      }
    });
  });
}

void CpuBackend::bias_relu(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) {
  if (b.defined())
    bias_add(x, b, n, c, s, out);
  else if (!out.is_same(x))
    copy_bytes(x.data_ptr(), out.data_ptr(), x.nbytes(), 0);
  unary(Unary::Relu, out, out);
}

void CpuBackend::relu_bias_grad(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, int64_t s, Tensor& dx,
                                Tensor& db) {
  unary_backward(Unary::Relu, dy, y, dx);
  if (db.defined()) bias_grad(dx, n, c, s, db);
}

void CpuBackend::sum(const Tensor& x, Tensor& out) {
  TANDEM_ASSERT(out.numel() == 1, "sum into ", out.str());
  const int64_t n = x.numel();
  dispatch_arith(x.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    if constexpr (std::is_integral_v<T>) {
      // Wrapping 64-bit accumulation; the result goes into i64 or the input's own integer type.
      const uint64_t total = blocked_sum<T, uint64_t>(px, n);
      TANDEM_ASSERT(out.dtype() == DType::i64 || out.dtype() == x.dtype(), "integer sum of ", x.str(), " into ",
                    out.str());
      if (out.dtype() == DType::i64)
        *out.data<int64_t>() = static_cast<int64_t>(total);
      else
        *static_cast<T*>(out.data_ptr()) = static_cast<T>(total);
    } else {
      TANDEM_ASSERT(out.dtype() == x.dtype(), "sum of ", x.str(), " into ", out.str());
      *static_cast<T*>(out.data_ptr()) = static_cast<T>(blocked_sum<T, double>(px, n));
    }
  });
}

}  // namespace tandem::backend
