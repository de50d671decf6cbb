// CPU backend: batch normalisation over N, H, W per channel, one channel per task.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

using cpu::kParallelElems;

namespace {

struct BnShape {
  int64_t n, c, s;  // x viewed as [n, c, s]
};

BnShape bn_shape(const Tensor& x) {
  TANDEM_ASSERT(x.dim() == 4, "batch norm input ", x.str());
  return {x.size(0), x.size(1), x.size(2) * x.size(3)};
}

// Sum over the n planes of channel ch of f(plane, j) for j in [0, s), in double.
template <typename T, typename F>
double channel_sum(const T* base, const BnShape& b, int64_t ch, F f) {
  double acc = 0.0;
  for (int64_t i = 0; i < b.n; ++i) {
    const T* p = base + (i * b.c + ch) * b.s;
    double part = 0.0;
#pragma omp simd reduction(+ : part)
    for (int64_t j = 0; j < b.s; ++j) part += f(p, j);
    acc += part;
  }
  return acc;
}

// y = x * scale + shift over channel ch.
template <typename T>
void channel_affine(const T* x, const BnShape& b, int64_t ch, T scale, T shift, T* y) {
  for (int64_t i = 0; i < b.n; ++i) {
    const int64_t off = (i * b.c + ch) * b.s;
    const T* xp = x + off;
    T* yp = y + off;
    for (int64_t j = 0; j < b.s; ++j) yp[j] = xp[j] * scale + shift;
  }
}

template <typename T>
void bn_train(const T* x, const T* gamma, const T* beta, T* rmean, T* rvar, double momentum, double eps, T* y,
              T* smean, T* sinvstd, const BnShape& b) {
  const double m = static_cast<double>(b.n * b.s);
  cpu::parallel_for(b.c, cpu::grain_for(b.n * b.s), [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      // Two passes (mean, then centred squares) keep the variance accurate when |mean| >> std.
      const double mean = channel_sum(x, b, ch, [](const T* p, int64_t j) { return static_cast<double>(p[j]); }) / m;
      const double var = channel_sum(x, b, ch, [mean](const T* p, int64_t j) {
                           const double d = static_cast<double>(p[j]) - mean;
                           return d * d;
                         }) / m;
      const double invstd = 1.0 / std::sqrt(var + eps);
      smean[ch] = static_cast<T>(mean);
      sinvstd[ch] = static_cast<T>(invstd);
      rmean[ch] = static_cast<T>((1.0 - momentum) * rmean[ch] + momentum * mean);
      rvar[ch] = static_cast<T>((1.0 - momentum) * rvar[ch] + momentum * var * m / (m - 1.0));
      const double scale = invstd * gamma[ch];
      channel_affine(x, b, ch, static_cast<T>(scale), static_cast<T>(beta[ch] - mean * scale), y);
    }
  });
}

template <typename T>
void bn_eval(const T* x, const T* gamma, const T* beta, const T* rmean, const T* rvar, double eps, T* y,
             const BnShape& b) {
  cpu::parallel_for(b.c, cpu::grain_for(b.n * b.s), [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double scale = gamma[ch] / std::sqrt(static_cast<double>(rvar[ch]) + eps);
      channel_affine(x, b, ch, static_cast<T>(scale), static_cast<T>(beta[ch] - rmean[ch] * scale), y);
    }
  });
}

// With xhat = (x - mean) * invstd: dbeta = sum dy, dgamma = sum dy * xhat,
// dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma).
template <typename T>
void bn_backward(const T* dy, const T* x, const T* gamma, const T* smean, const T* sinvstd, T* dx, T* dgamma,
                 T* dbeta, const BnShape& b) {
  const double m = static_cast<double>(b.n * b.s);
  cpu::parallel_for(b.c, cpu::grain_for(b.n * b.s), [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double mean = smean[ch], invstd = sinvstd[ch];
      const double sdy = channel_sum(dy, b, ch, [](const T* p, int64_t j) { return static_cast<double>(p[j]); });
      double sdyx = 0.0;  // sum dy * (x - mean)
      for (int64_t i = 0; i < b.n; ++i) {
        const int64_t off = (i * b.c + ch) * b.s;
        const T* dyp = dy + off;
        const T* xp = x + off;
        double part = 0.0;
#pragma omp simd reduction(+ : part)
        for (int64_t j = 0; j < b.s; ++j) part += static_cast<double>(dyp[j]) * (static_cast<double>(xp[j]) - mean);
        sdyx += part;
      }
      const double dg = sdyx * invstd;
      dbeta[ch] = static_cast<T>(sdy);
      dgamma[ch] = static_cast<T>(dg);
      // dx = k * (dy - sdy/m - (x - mean) * invstd^2 * dg / m), folded into dx = dy*k + x*u + v.
      const double k = gamma[ch] * invstd;
      const double u = -k * invstd * dg / m;
      const double v = -k * sdy / m - u * mean;
      const T tk = static_cast<T>(k), tu = static_cast<T>(u), tv = static_cast<T>(v);
      for (int64_t i = 0; i < b.n; ++i) {
        const int64_t off = (i * b.c + ch) * b.s;
        const T* dyp = dy + off;
        const T* xp = x + off;
        T* dxp = dx + off;
        for (int64_t j = 0; j < b.s; ++j) dxp[j] = dyp[j] * tk + xp[j] * tu + tv;
      }
    }
  });
}

template <typename T>
const T* cp(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <typename T>
T* mp(Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

namespace {
// The fused tail of a forward pass: y += z, then max(y, 0).
void add_and_relu(CpuBackend& be, const Tensor& z, bool relu, Tensor& y) {
  if (z.defined()) be.binary(Binary::Add, y, z, y);
  if (relu) be.unary(Unary::Relu, y, y);
}

void check_layout(const BnArgs& a) {
  TANDEM_ASSERT(!a.nhwc, "the CPU backend takes NCHW batch-norm inputs only");
}
}  // namespace

void CpuBackend::batch_norm_forward_train(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                          Tensor& running_mean, Tensor& running_var, const BnArgs& a, Tensor& y,
                                          Tensor& save_mean, Tensor& save_invstd) {
  check_layout(a);
  const BnShape b = bn_shape(x);
  TANDEM_ASSERT(b.n * b.s > 1, "batch norm training needs more than one value per channel, got ", x.str());
  dispatch_float(x.dtype(), "batch_norm2d", [&](auto tag) {
    using T = decltype(tag);
    bn_train<T>(cp<T>(x), cp<T>(gamma), cp<T>(beta), mp<T>(running_mean), mp<T>(running_var), a.momentum, a.eps,
                mp<T>(y), mp<T>(save_mean), mp<T>(save_invstd), b);
  });
  add_and_relu(*this, z, a.relu, y);
}

void CpuBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& running_mean, const Tensor& running_var, const BnArgs& a,
                                         Tensor& y) {
  check_layout(a);
  const BnShape b = bn_shape(x);
  dispatch_float(x.dtype(), "batch_norm2d", [&](auto tag) {
    using T = decltype(tag);
    bn_eval<T>(cp<T>(x), cp<T>(gamma), cp<T>(beta), cp<T>(running_mean), cp<T>(running_var), a.eps, mp<T>(y), b);
  });
  add_and_relu(*this, z, a.relu, y);
}

void CpuBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                                     const Tensor& save_mean, const Tensor& save_invstd, const BnArgs& a, Tensor& dx,
                                     Tensor& dz, Tensor& dgamma, Tensor& dbeta) {
  check_layout(a);
  const BnShape b = bn_shape(x);
  Tensor g = dy;
  if (a.relu) {  // the gradient below the ReLU: dy where the output was positive
    g = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    unary_backward(Unary::Relu, dy, y, g);
  }
  if (dz.defined()) copy_bytes(g.data_ptr(), dz.data_ptr(), g.nbytes(), 0);
  dispatch_float(x.dtype(), "batch_norm2d backward", [&](auto tag) {
    using T = decltype(tag);
    bn_backward<T>(cp<T>(g), cp<T>(x), cp<T>(gamma), cp<T>(save_mean), cp<T>(save_invstd), mp<T>(dx), mp<T>(dgamma),
                   mp<T>(dbeta), b);
  });
}

}  // namespace tandem::backend
