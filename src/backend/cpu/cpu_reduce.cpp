// CPU backend: reductions over the middle extent of [outer, n, inner] views, accumulated in double, and
// the exact gradient of the product.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

namespace {

using ReduceOp = Backend::ReduceOp;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Each accumulator takes values in the order of their positions k (add) and joins the accumulator of a
// later range of positions (merge), so that a split of n across threads gives the first extreme.
struct SumAcc {
  double s = 0;
  void add(double v, int64_t) { s += v; }
  void merge(const SumAcc& o) { s += o.s; }
  double result(int64_t, double arg) const { return s * arg; }
};

struct ProdAcc {
  double s = 1;
  void add(double v, int64_t) { s *= v; }
  void merge(const ProdAcc& o) { s *= o.s; }
  double result(int64_t, double) const { return s; }
};

template <bool kMax>
struct ExtremeAcc {
  double m = kMax ? -kInf : kInf;
  // NaN wins and stays.
  void add(double v, int64_t) {
    if ((kMax ? v > m : v < m) || std::isnan(v)) m = std::isnan(m) ? m : v;
  }
  void merge(const ExtremeAcc& o) { add(o.m, 0); }
  double result(int64_t, double) const { return m; }
};

template <bool kMax>
struct ArgAcc {
  double v = 0;
  int64_t k = -1;
  static bool better(double a, double b) { return (std::isnan(a) && !std::isnan(b)) || (kMax ? a > b : a < b); }
  void add(double x, int64_t pos) {
    if (k < 0 || better(x, v)) {
      v = x;
      k = pos;
    }
  }
  void merge(const ArgAcc& o) {
    if (o.k >= 0 && (k < 0 || better(o.v, v))) *this = o;
  }
  int64_t index() const { return k; }
};

// Welford's running mean and sum of squared deviations; Chan's rule joins two ranges.
struct VarAcc {
  double n = 0, mean = 0, m2 = 0;
  void add(double v, int64_t) {
    n += 1;
    const double d = v - mean;
    mean += d / n;
    m2 += d * (v - mean);
  }
  void merge(const VarAcc& o) {
    if (o.n == 0) return;
    if (n == 0) {
      *this = o;
      return;
    }
    const double total = n + o.n, d = o.mean - mean;
    mean += d * o.n / total;
    m2 += o.m2 + d * d * n * o.n / total;
    n = total;
  }
  double result(int64_t count, double correction) const {
    const double dof = std::max(static_cast<double>(count) - correction, 0.0);
    return count == 0 ? kNaN : m2 / dof;
  }
};

// The running maximum and the sum of exp(v - maximum).
struct LseAcc {
  double m = -kInf, s = 0;
  void add(double v, int64_t) {
    if (v == -kInf) return;
    if (v > m) {
      s = s * std::exp(m - v) + 1;
      m = v;
    } else if (v == m) {
      s += 1;
    } else {
      s += std::exp(v - m);
    }
  }
  void merge(const LseAcc& o) {
    if (o.s == 0) return;
    if (s == 0) {
      *this = o;
      return;
    }
    if (o.m > m) {
      s = s * std::exp(m - o.m) + o.s;
      m = o.m;
    } else if (o.m == m) {
      s += o.s;
    } else {
      s += o.s * std::exp(o.m - m);
    }
  }
  double result(int64_t, double) const { return s == 0 ? -kInf : m + std::log(s); }
};

template <typename Acc, typename T, typename Write>
void reduce_with(const T* x, int64_t outer, int64_t n, int64_t inner, Write write) {
  const int64_t cols = outer * inner;
  const int threads = cpu::max_threads();
  const bool split_n = cols < 2 * threads && n >= 8192 && threads > 1;
  if (!split_n) {
    if (inner == 1) {
      cpu::parallel_for(outer, cpu::grain_for(n), [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          Acc a;
          const T* row = x + o * n;
          for (int64_t k = 0; k < n; ++k) a.add(static_cast<double>(row[k]), k);
          write(o, a);
        }
      });
      return;
    }
    // Blocks of up to 256 columns of one outer index: the innermost loop runs along contiguous memory.
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (inner + kBlock - 1) / kBlock;
    cpu::parallel_for(outer * blocks, cpu::grain_for(n * std::min(inner, kBlock)), [&](int64_t lo, int64_t hi) {
      std::vector<Acc> acc(static_cast<size_t>(std::min(inner, kBlock)));
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t o = t / blocks, i0 = (t % blocks) * kBlock, w = std::min(kBlock, inner - i0);
        for (int64_t i = 0; i < w; ++i) acc[i] = Acc();
        const T* base = x + o * n * inner + i0;
        for (int64_t k = 0; k < n; ++k) {
          const T* p = base + k * inner;
          for (int64_t i = 0; i < w; ++i) acc[i].add(static_cast<double>(p[i]), k);
        }
        for (int64_t i = 0; i < w; ++i) write(o * inner + i0 + i, acc[i]);
      }
    });
    return;
  }
  // Few and long reductions: n split into ranges reduced in parallel, then joined in order.
  const int64_t parts = std::min<int64_t>(4 * threads, n / 2048);
  std::vector<Acc> partial(static_cast<size_t>(parts * cols));
  cpu::parallel_tasks(parts, threads, [&](int64_t p, int) {
    int64_t k0, k1;
    cpu::part_range(n, p, parts, k0, k1);
    Acc* acc = partial.data() + p * cols;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = k0; k < k1; ++k) {
        const T* row = x + (o * n + k) * inner;
        for (int64_t i = 0; i < inner; ++i) acc[o * inner + i].add(static_cast<double>(row[i]), k);
      }
  });
  for (int64_t c = 0; c < cols; ++c) {
    Acc a = partial[c];
    for (int64_t p = 1; p < parts; ++p) a.merge(partial[p * cols + c]);
    write(c, a);
  }
}

template <typename Acc, typename T>
void reduce_values(const T* x, int64_t outer, int64_t n, int64_t inner, double arg, T* out) {
  reduce_with<Acc>(x, outer, n, inner, [&](int64_t c, const Acc& a) { out[c] = static_cast<T>(a.result(n, arg)); });
}

template <typename Acc, typename T>
void reduce_index(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t* out) {
  reduce_with<Acc>(x, outer, n, inner, [&](int64_t c, const Acc& a) { out[c] = a.index(); });
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double arg,
                        Tensor& out) {
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == outer * inner, "reduce extents ", outer, "x", n, "x",
                inner, " for ", x.str(), " into ", out.str());
  const bool arg_op = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  TANDEM_ASSERT(arg_op ? out.dtype() == DType::i64 : out.dtype() == x.dtype(), "reduce into ", out.str());
  if (outer * inner == 0) return;
  TANDEM_ASSERT(n > 0 || op == ReduceOp::Sum || op == ReduceOp::Prod || op == ReduceOp::Var ||
                    op == ReduceOp::LogSumExp,
                "reduce over an empty extent");
  dispatch_float(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    if (arg_op) {
      int64_t* po = out.data<int64_t>();
      if (op == ReduceOp::ArgMax)
        reduce_index<ArgAcc<true>>(px, outer, n, inner, po);
      else
        reduce_index<ArgAcc<false>>(px, outer, n, inner, po);
      return;
    }
    T* po = static_cast<T*>(out.data_ptr());
    switch (op) {
      case ReduceOp::Sum: return reduce_values<SumAcc>(px, outer, n, inner, arg, po);
      case ReduceOp::Prod: return reduce_values<ProdAcc>(px, outer, n, inner, arg, po);
      case ReduceOp::Max: return reduce_values<ExtremeAcc<true>>(px, outer, n, inner, arg, po);
      case ReduceOp::Min: return reduce_values<ExtremeAcc<false>>(px, outer, n, inner, arg, po);
      case ReduceOp::Var: return reduce_values<VarAcc>(px, outer, n, inner, arg, po);
      case ReduceOp::LogSumExp: return reduce_values<LseAcc>(px, outer, n, inner, arg, po);
      default: break;
    }
  });
}

void CpuBackend::prod_backward(const Tensor& x, const Tensor& g, int64_t outer, int64_t n, int64_t inner,
                               Tensor& dx) {
  TANDEM_ASSERT(x.numel() == outer * n * inner && g.numel() == outer * inner && dx.numel() == x.numel(),
                "prod_backward extents");
  if (dx.numel() == 0) return;
  dispatch_float(x.dtype(), "prod_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    // dx = (product before k) * (product after k) * g, the two products running forwards, then backwards.
    cpu::parallel_for(outer, cpu::grain_for(n * inner), [&](int64_t lo, int64_t hi) {
      std::vector<double> run(static_cast<size_t>(inner));
      for (int64_t o = lo; o < hi; ++o) {
        const T* xo = px + o * n * inner;
        T* d = pd + o * n * inner;
        std::fill(run.begin(), run.end(), 1.0);
        for (int64_t k = 0; k < n; ++k)
          for (int64_t i = 0; i < inner; ++i) {
            d[k * inner + i] = static_cast<T>(run[i]);
            run[i] *= static_cast<double>(xo[k * inner + i]);
          }
        for (int64_t i = 0; i < inner; ++i) run[i] = static_cast<double>(pg[o * inner + i]);
        for (int64_t k = n - 1; k >= 0; --k)
          for (int64_t i = 0; i < inner; ++i) {
            d[k * inner + i] = static_cast<T>(static_cast<double>(d[k * inner + i]) * run[i]);
            run[i] *= static_cast<double>(xo[k * inner + i]);
          }
      }
    });
  });
}

}  // namespace tandem::backend
