// CPU backend: elementwise arithmetic, activations, bias broadcast and reductions.
#include <cmath>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

using cpu::kParallelElems;

namespace {

const char* binary_name(Binary op) {
  switch (op) {
    case Binary::Add: return "add";
    case Binary::Sub: return "sub";
    case Binary::Mul: return "mul";
    case Binary::Div: return "div";
    case Binary::Max: return "max";
    case Binary::Min: return "min";
    case Binary::Gt: return "gt";
    case Binary::Ge: return "ge";
    case Binary::Lt: return "lt";
    case Binary::Le: return "le";
    case Binary::Eq: return "eq";
  }
  return "?";
}

const char* unary_name(Unary op) {
  switch (op) {
    case Unary::Neg: return "neg";
    case Unary::Relu: return "relu";
    case Unary::Sigmoid: return "sigmoid";
    case Unary::Tanh: return "tanh";
    case Unary::Exp: return "exp";
    case Unary::Log: return "log";
    case Unary::Abs: return "abs";
    case Unary::Sqrt: return "sqrt";
  }
  return "?";
}

// Applies f elementwise; out may alias a or b (each element is read before it is written).
template <typename T, typename F>
void map2(const T* a, const T* b, T* out, int64_t n, F f) {
  cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = f(a[i], b[i]);
  });
}

template <typename T, typename F>
void map1(const T* a, T* out, int64_t n, F f) {
  cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = f(a[i]);
  });
}

// Comparisons give 1 or 0 in the operands' type (false wherever a NaN takes part).
template <typename T>
bool compare(Binary op, const T* a, const T* b, T* out, int64_t n) {
  switch (op) {
    case Binary::Gt: map2(a, b, out, n, [](T x, T y) { return static_cast<T>(x > y); }); return true;
    case Binary::Ge: map2(a, b, out, n, [](T x, T y) { return static_cast<T>(x >= y); }); return true;
    case Binary::Lt: map2(a, b, out, n, [](T x, T y) { return static_cast<T>(x < y); }); return true;
    case Binary::Le: map2(a, b, out, n, [](T x, T y) { return static_cast<T>(x <= y); }); return true;
    case Binary::Eq: map2(a, b, out, n, [](T x, T y) { return static_cast<T>(x == y); }); return true;
    default: return false;
  }
}

// Integer arithmetic wraps (as unsigned arithmetic does) instead of overflowing into undefined behaviour.
template <typename T>
void binary_int(Binary op, const T* a, const T* b, T* out, int64_t n) {
  if (compare(op, a, b, out, n)) return;
  using U = std::make_unsigned_t<T>;
  auto u = [](T v) { return static_cast<U>(v); };
  switch (op) {
    case Binary::Add: return map2(a, b, out, n, [u](T x, T y) { return static_cast<T>(u(x) + u(y)); });
    case Binary::Sub: return map2(a, b, out, n, [u](T x, T y) { return static_cast<T>(u(x) - u(y)); });
    case Binary::Mul: return map2(a, b, out, n, [u](T x, T y) { return static_cast<T>(u(x) * u(y)); });
    case Binary::Max: return map2(a, b, out, n, [](T x, T y) { return x > y ? x : y; });
    case Binary::Min: return map2(a, b, out, n, [](T x, T y) { return x < y ? x : y; });
    case Binary::Div: {
      for (int64_t i = 0; i < n; ++i)
        TANDEM_CHECK(b[i] != 0, "div: integer division by zero at element ", i, " of the divisor");
      // x / -1 is negation, which overflows for the smallest value: wrap it instead of trapping.
      return map2(a, b, out, n,
                  [u](T x, T y) { return y == T(-1) ? static_cast<T>(U(0) - u(x)) : static_cast<T>(x / y); });
    }
    default: return;
  }
}

// Floating max and min propagate NaN from either operand.
template <typename T>
void binary_float(Binary op, const T* a, const T* b, T* out, int64_t n) {
  if (compare(op, a, b, out, n)) return;
  switch (op) {
    case Binary::Add: return map2(a, b, out, n, [](T x, T y) { return x + y; });
    case Binary::Sub: return map2(a, b, out, n, [](T x, T y) { return x - y; });
    case Binary::Mul: return map2(a, b, out, n, [](T x, T y) { return x * y; });
    case Binary::Div: return map2(a, b, out, n, [](T x, T y) { return x / y; });
    case Binary::Max: return map2(a, b, out, n, [](T x, T y) { return (x > y || x != x) ? x : y; });
    case Binary::Min: return map2(a, b, out, n, [](T x, T y) { return (x < y || x != x) ? x : y; });
    default: return;
  }
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
  TANDEM_ASSERT(a.dtype() == out.dtype() && b.dtype() == out.dtype() && a.numel() == out.numel() &&
                    b.numel() == out.numel(),
                "binary ", binary_name(op), " on ", a.str(), ", ", b.str(), " into ", out.str());
  const int64_t n = out.numel();
  dispatch_arith(out.dtype(), binary_name(op), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if constexpr (std::is_integral_v<T>)
      binary_int(op, pa, pb, po, n);
    else
      binary_float(op, pa, pb, po, n);
  });
}

void CpuBackend::unary(Unary op, const Tensor& a, Tensor& out) {
  TANDEM_ASSERT(a.dtype() == out.dtype() && a.numel() == out.numel(), "unary ", unary_name(op), " on ", a.str(),
                " into ", out.str());
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), unary_name(op), [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    switch (op) {
      case Unary::Neg: return map1(x, y, n, [](T v) { return -v; });
      case Unary::Relu: return map1(x, y, n, [](T v) { return v < T(0) ? T(0) : v; });  // NaN stays NaN
      case Unary::Sigmoid: return map1(x, y, n, [](T v) { return T(1) / (T(1) + std::exp(-v)); });
      case Unary::Tanh: return map1(x, y, n, [](T v) { return std::tanh(v); });
      case Unary::Exp: return map1(x, y, n, [](T v) { return std::exp(v); });
      case Unary::Log: return map1(x, y, n, [](T v) { return std::log(v); });
      case Unary::Abs: return map1(x, y, n, [](T v) { return std::abs(v); });
      case Unary::Sqrt: return map1(x, y, n, [](T v) { return std::sqrt(v); });
    }
  });
}

void CpuBackend::affine(const Tensor& a, double alpha, double beta, Tensor& out) {
  TANDEM_ASSERT(a.dtype() == out.dtype() && a.numel() == out.numel(), "affine on ", a.str(), " into ", out.str());
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), "affine", [&](auto tag) {
    using T = decltype(tag);
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    map1(static_cast<const T*>(a.data_ptr()), static_cast<T*>(out.data_ptr()), n,
         [al, be](T v) { return al * v + be; });
  });
}

void CpuBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  TANDEM_ASSERT(x.dtype() == y.dtype() && x.numel() == y.numel(), "axpy of ", x.str(), " into ", y.str());
  const int64_t n = y.numel();
  dispatch_float(y.dtype(), "axpy", [&](auto tag) {
    using T = decltype(tag);
    const T al = static_cast<T>(alpha);
    T* py = static_cast<T*>(y.data_ptr());
    map2(static_cast<const T*>(x.data_ptr()), py, py, n, [al](T xv, T yv) { return al * xv + yv; });
  });
}

void CpuBackend::unary_backward(Unary op, const Tensor& grad, const Tensor& y, Tensor& out) {
  TANDEM_CHECK(op == Unary::Relu || op == Unary::Sigmoid || op == Unary::Tanh, "unary_backward: ", unary_name(op),
               " is not differentiated from its output (supported: relu, sigmoid, tanh)");
  TANDEM_ASSERT(grad.dtype() == out.dtype() && y.dtype() == out.dtype() && grad.numel() == out.numel() &&
                    y.numel() == out.numel(),
                "unary_backward on ", grad.str(), ", ", y.str(), " into ", out.str());
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), unary_name(op), [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(grad.data_ptr());
    const T* py = static_cast<const T*>(y.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    switch (op) {
      case Unary::Relu: return map2(g, py, o, n, [](T gv, T yv) { return yv > T(0) ? gv : T(0); });
      case Unary::Sigmoid: return map2(g, py, o, n, [](T gv, T yv) { return gv * yv * (T(1) - yv); });
      case Unary::Tanh: return map2(g, py, o, n, [](T gv, T yv) { return gv * (T(1) - yv * yv); });
      default: return;
    }
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
