// CPU backend: the fused pointwise ops of Llama-family blocks, f32 and f64. Rotary position embeddings on the
// heads of a packed query-key-value projection (the query and key heads rotated, the value heads copied, one
// pass over each row), and SwiGLU, silu(gate) * up, over rows holding the gate then the up projection. Both are
// split by rows across the pool's threads; each element is computed alone, so the thread count changes nothing.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/elementwise_functors.h"

namespace tandem::backend {

namespace {

bool cpu_float(DType t) { return t == DType::f32 || t == DType::f64; }

template <typename T>
void rotary_rows(const T* x, const T* cos, const T* sin, const RotaryGeom& g, T* y) {
  const int64_t d = g.d, h = d / 2, width = g.width(), rot = g.rotated * d;
  const int32_t* positions = g.positions.defined() ? g.positions.data<int32_t>() : nullptr;
  cpu::parallel_for(g.batch * g.t, cpu::grain_for(width), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t p = positions ? positions[r] : g.start + r % g.t;
      const T *c = cos + p * d, *s = sin + p * d, *xr = x + r * width;
      T* yr = y + r * width;
      for (int64_t head = 0; head < g.rotated; ++head) {
        const T* xh = xr + head * d;
        T* yh = yr + head * d;
        if (!g.transpose) {
          for (int64_t i = 0; i < h; ++i) {
            const T x1 = xh[i], x2 = xh[i + h];
            yh[i] = x1 * c[i] - x2 * s[i];
            yh[i + h] = x2 * c[i + h] + x1 * s[i + h];
          }
        } else {
          for (int64_t i = 0; i < h; ++i) {
            const T x1 = xh[i], x2 = xh[i + h];
            yh[i] = x1 * c[i] + x2 * s[i + h];
            yh[i + h] = x2 * c[i + h] - x1 * s[i];
          }
        }
      }
      std::copy(xr + rot, xr + width, yr + rot);
    }
  });
}

template <typename T>
void swiglu_rows(const T* x, int64_t rows, int64_t hidden, T* y) {
  cpu::parallel_for(rows, cpu::grain_for(2 * hidden), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T *gate = x + r * 2 * hidden, *up = gate + hidden;
      T* yr = y + r * hidden;
      for (int64_t j = 0; j < hidden; ++j) yr[j] = gate[j] * ewf::sigmoid_(gate[j]) * up[j];
    }
  });
}

template <typename T>
void swiglu_grad_rows(const T* dy, const T* x, int64_t rows, int64_t hidden, T* dx) {
  cpu::parallel_for(rows, cpu::grain_for(3 * hidden), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T *gate = x + r * 2 * hidden, *up = gate + hidden, *g = dy + r * hidden;
      T *dgate = dx + r * 2 * hidden, *dup = dgate + hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        const T a = gate[j], s = ewf::sigmoid_(a);
        dgate[j] = g[j] * up[j] * s * (T(1) + a * (T(1) - s));
        dup[j] = g[j] * a * s;
      }
    }
  });
}

}  // namespace

bool CpuBackend::rotary_packed(const Tensor& x, const Tensor& cos, const Tensor& sin, const RotaryGeom& g, Tensor& y) {
  if (!cpu_float(x.dtype())) return false;
  TANDEM_ASSERT(g.d > 0 && g.d % 2 == 0 && x.numel() == g.batch * g.t * g.width() && y.numel() == x.numel() &&
                    y.dtype() == x.dtype() && cos.dtype() == x.dtype() && sin.dtype() == x.dtype() &&
                    cos.numel() == sin.numel() && cos.numel() >= (g.start + g.t) * g.d,
                "rotary_packed: ", x.str(), " into ", y.str(), " with tables ", cos.str(), ", ", sin.str());
  TANDEM_ASSERT(!g.positions.defined() || (g.positions.dtype() == DType::i32 && g.positions.is_contiguous() &&
                                            g.positions.numel() == g.batch * g.t),
                "rotary_packed: positions ", g.positions.str());
  if (g.positions.defined()) {  // each a row of the tables
    const int32_t* p = g.positions.data<int32_t>();
    const int64_t rows = cos.numel() / g.d;
    for (int64_t r = 0; r < g.batch * g.t; ++r)
      TANDEM_CHECK(p[r] >= 0 && p[r] < rows, "rotary_packed: position ", p[r], " of row ", r, " is outside the ",
                   rows, " rows of the tables");
  }
  if (x.dtype() == DType::f32)
    rotary_rows(x.data<float>(), cos.data<float>(), sin.data<float>(), g, y.data<float>());
  else
    rotary_rows(x.data<double>(), cos.data<double>(), sin.data<double>(), g, y.data<double>());
  return true;
}

bool CpuBackend::swiglu_forward(const Tensor& x, int64_t rows, int64_t hidden, Tensor& y) {
  if (!cpu_float(x.dtype())) return false;
  TANDEM_ASSERT(x.numel() == rows * 2 * hidden && y.numel() == rows * hidden && y.dtype() == x.dtype(), "swiglu: ",
                x.str(), " into ", y.str());
  if (x.dtype() == DType::f32)
    swiglu_rows(x.data<float>(), rows, hidden, y.data<float>());
  else
    swiglu_rows(x.data<double>(), rows, hidden, y.data<double>());
  return true;
}

bool CpuBackend::swiglu_backward(const Tensor& dy, const Tensor& x, int64_t rows, int64_t hidden, Tensor& dx) {
  if (!cpu_float(x.dtype())) return false;
  TANDEM_ASSERT(x.numel() == rows * 2 * hidden && dy.numel() == rows * hidden && dx.numel() == x.numel() &&
                    dy.dtype() == x.dtype() && dx.dtype() == x.dtype(),
                "swiglu backward: ", dy.str(), " and ", x.str(), " into ", dx.str());
  if (x.dtype() == DType::f32)
    swiglu_grad_rows(dy.data<float>(), x.data<float>(), rows, hidden, dx.data<float>());
  else
    swiglu_grad_rows(dy.data<double>(), x.data<double>(), rows, hidden, dx.data<double>());
  return true;
}

}  // namespace tandem::backend
