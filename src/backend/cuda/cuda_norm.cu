// CUDA kernels: batch normalisation over N, H, W per channel, for NCHW and NHWC storage and f32 / f16 /
// bf16 activations (statistics in double, parameters f32), fused with an optional residual add and
// ReLU. Training forward is one reduction launch (sums of x and x^2; the last block of each channel
// turns them into the statistics, updates the running averages and forms the per-channel affine map)
// and one elementwise launch; backward likewise (sums of g and g * x, then dx). See cuda_channel.cuh.
#include <initializer_list>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_channel.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::from_float;
using kern::to_float;

using chan::Coef;
using chan::load_coef;
using chan::load_pack;
using chan::Pack;
using chan::store_pack;

template <typename T>
struct StatsElem {
  const T* x;
  template <int V, typename I>
  __device__ __forceinline__ Pack<T, V> load(I off) const {
    return load_pack<V>(x, off);
  }
  template <int V, typename I>
  __device__ __forceinline__ void add(I, const Pack<T, V>& xv, double (&s)[2][V]) const {
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const double v = to_float(xv.v[u]);
      s[0][u] += v;
      s[1][u] += v * v;
    }
  }
};

struct StatsFinish {
  const float *gamma, *beta;
  float *running_mean, *running_var, *save_mean, *save_invstd, *scale, *shift;
  double m, momentum, eps;
  __device__ __forceinline__ void operator()(int64_t ch, const double (&t)[2]) const {
    const double mean = t[0] / m;
    double var = t[1] / m - mean * mean;
    if (var < 0.0) var = 0.0;  // rounding when the spread is tiny against the mean
    const double invstd = 1.0 / sqrt(var + eps);
    save_mean[ch] = static_cast<float>(mean);
    save_invstd[ch] = static_cast<float>(invstd);
    running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mean);
    running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * var * m / (m - 1.0));
    const double sc = invstd * gamma[ch];
    scale[ch] = static_cast<float>(sc);
    shift[ch] = static_cast<float>(beta[ch] - mean * sc);
  }
};

// y = x * scale[c] + shift[c] (+ z), then max(., 0) with relu.
template <typename T, bool RELU>
struct ApplyOp {
  const T *x, *z;
  T* y;
  const float *scale, *shift;
  template <int V, int STEP, typename I>
  __device__ __forceinline__ Coef<V, 2> coef(I ch0) const {
    return load_coef<V, STEP>(ch0, {scale, shift});
  }
  template <int V, typename I>
  __device__ __forceinline__ void apply(I i0, const Coef<V, 2>& k) const {
    const Pack<T, V> xv = load_pack<V>(x, i0);
    Pack<T, V> zv{}, yv;
    if (z) zv = load_pack<V>(z, i0);
#pragma unroll
    for (int u = 0; u < V; ++u) {
      float v = fmaf(to_float(xv.v[u]), k.v[0][u], k.v[1][u]);
      if (z) v += to_float(zv.v[u]);
      if (RELU) v = v > 0.0f ? v : 0.0f;
      yv.v[u] = from_float<T>(v);
    }
    store_pack<V>(y, i0, yv);
  }
};

// Evaluation: the affine map from the running statistics, formed in double as on the CPU.
template <typename T, bool RELU>
struct EvalOp {
  const T *x, *z;
  T* y;
  const float *gamma, *beta, *mean, *var;
  double eps;
  template <int V, int STEP, typename I>
  __device__ __forceinline__ Coef<V, 2> coef(I ch0) const {
    Coef<V, 2> k;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      if (STEP == 0 && u > 0) {
        k.v[0][u] = k.v[0][0];
        k.v[1][u] = k.v[1][0];
        continue;
      }
      const I ch = ch0 + u * STEP;
      const double sc = gamma[ch] / sqrt(static_cast<double>(var[ch]) + eps);
      k.v[0][u] = static_cast<float>(sc);
      k.v[1][u] = static_cast<float>(beta[ch] - mean[ch] * sc);
    }
    return k;
  }
  template <int V, typename I>
  __device__ __forceinline__ void apply(I i0, const Coef<V, 2>& k) const {
    const Pack<T, V> xv = load_pack<V>(x, i0);
    Pack<T, V> zv{}, yv;
    if (z) zv = load_pack<V>(z, i0);
#pragma unroll
    for (int u = 0; u < V; ++u) {
      float v = to_float(xv.v[u]) * k.v[0][u] + k.v[1][u];
      if (z) v += to_float(zv.v[u]);
      if (RELU) v = v > 0.0f ? v : 0.0f;
      yv.v[u] = from_float<T>(v);
    }
    store_pack<V>(y, i0, yv);
  }
};

// The gradient below the fused ReLU: dy where the output was positive.
template <typename T, int V, bool RELU, typename I>
__device__ __forceinline__ void masked(const T* dy, const T* y, I i0, float (&g)[V]) {
  const Pack<T, V> dv = load_pack<V>(dy, i0);
  Pack<T, V> yv{};
  if (RELU) yv = load_pack<V>(y, i0);
#pragma unroll
  for (int u = 0; u < V; ++u) g[u] = !RELU || to_float(yv.v[u]) > 0.0f ? to_float(dv.v[u]) : 0.0f;
}

template <typename T, bool RELU>
struct GradElem {
  const T *dy, *y, *x;
  template <int V>
  struct L {
    float g[V];
    Pack<T, V> x;
  };
  template <int V, typename I>
  __device__ __forceinline__ L<V> load(I off) const {
    L<V> l;
    masked<T, V, RELU>(dy, y, off, l.g);
    l.x = load_pack<V>(x, off);
    return l;
  }
  template <int V, typename I>
  __device__ __forceinline__ void add(I, const L<V>& l, double (&s)[2][V]) const {
#pragma unroll
    for (int u = 0; u < V; ++u) {
      s[0][u] += l.g[u];
      s[1][u] += static_cast<double>(l.g[u]) * static_cast<double>(to_float(l.x.v[u]));
    }
  }
};

// With xhat = (x - mean) * invstd: dbeta = sum g, dgamma = sum g * xhat, and
// dx = gamma * invstd / m * (m * g - dbeta - xhat * dgamma), folded into dx = g * k + x * u + w.
struct GradFinish {
  const float *gamma, *save_mean, *save_invstd;
  float *dgamma, *dbeta, *k, *u, *w;
  double m;
  __device__ __forceinline__ void operator()(int64_t ch, const double (&t)[2]) const {
    const double mean = save_mean[ch], invstd = save_invstd[ch];
    const double sdy = t[0], dg = (t[1] - mean * t[0]) * invstd;
    dbeta[ch] = static_cast<float>(sdy);
    dgamma[ch] = static_cast<float>(dg);
    const double kk = gamma[ch] * invstd;
    const double uu = -kk * invstd * dg / m;
    k[ch] = static_cast<float>(kk);
    u[ch] = static_cast<float>(uu);
    w[ch] = static_cast<float>(-kk * sdy / m - uu * mean);
  }
};

template <typename T, bool RELU>
struct GradApply {
  const T *dy, *y, *x;
  T *dx, *dz;
  const float *k, *u, *w;
  template <int V, int STEP, typename I>
  __device__ __forceinline__ Coef<V, 3> coef(I ch0) const {
    return load_coef<V, STEP>(ch0, {k, u, w});
  }
  template <int V, typename I>
  __device__ __forceinline__ void apply(I i0, const Coef<V, 3>& c) const {
    float g[V];
    masked<T, V, RELU>(dy, y, i0, g);
    const Pack<T, V> xv = load_pack<V>(x, i0);
    Pack<T, V> dxv, dzv;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      dxv.v[e] = from_float<T>(g[e] * c.v[0][e] + to_float(xv.v[e]) * c.v[1][e] + c.v[2][e]);
      dzv.v[e] = from_float<T>(g[e]);
    }
    store_pack<V>(dx, i0, dxv);
    if (dz) store_pack<V>(dz, i0, dzv);
  }
};

chan::Layout layout(const Tensor& x, bool nhwc) {
  TANDEM_ASSERT(x.dim() >= 2, "batch norm of ", x.str());
  const int64_t n = x.size(0), c = x.size(1);
  return chan::layout_of(n, c, n * c ? x.numel() / (n * c) : 0, nhwc);
}

void check_params(std::initializer_list<const Tensor*> params, int64_t c, const char* op) {
  for (const Tensor* t : params)
    TANDEM_CHECK(t->dtype() == DType::f32 && t->numel() == c, op, ": parameter ", t->str(),
                 " must be f32 with one value per channel (", c, ") on CUDA");
}

void check_like(std::initializer_list<const Tensor*> ts, const Tensor& x, const char* op) {
  for (const Tensor* t : ts)
    TANDEM_CHECK(!t->defined() || (t->dtype() == x.dtype() && t->numel() == x.numel()), op, ": ", t->str(),
                 " does not match the input ", x.str());
}

template <typename T>
const T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}
template <typename T>
T* mptr(Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}
}  // namespace

void CudaBackend::batch_norm_forward_train(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                           Tensor& running_mean, Tensor& running_var, const BnArgs& a, Tensor& y,
                                           Tensor& save_mean, Tensor& save_invstd) {
  const chan::Layout l = layout(x, a.nhwc);
  check_params({&gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd}, l.c, "batch_norm2d");
  check_like({&z, &y}, x, "batch_norm2d");
  const int64_t m = l.n * l.s;
  TANDEM_CHECK(m > 1, "batch_norm2d: training needs more than one value per channel, got ", x.str());
  if (l.c == 0) return;
  DeviceState& st = state_for(y);
  Scratch affine(allocator(st.device), static_cast<size_t>(2 * l.c) * sizeof(float));
  float* scale = affine.as<float>();
  float* shift = scale + l.c;
  kern::dispatch_float(x.dtype(), "batch_norm2d", [&](auto tag) {
    using T = decltype(tag);
    chan::reduce<2, T>(*this, st.device, l, StatsElem<T>{ptr<T>(x)},
                       StatsFinish{gamma.data<float>(), beta.data<float>(), running_mean.data<float>(),
                                   running_var.data<float>(), save_mean.data<float>(), save_invstd.data<float>(),
                                   scale, shift, static_cast<double>(m), a.momentum, a.eps},
                       {x.data_ptr()});
    const std::initializer_list<const void*> io{x.data_ptr(), z.defined() ? z.data_ptr() : nullptr, y.data_ptr()};
    if (a.relu)
      chan::map<T>(l, st.stream, ApplyOp<T, true>{ptr<T>(x), ptr<T>(z), mptr<T>(y), scale, shift}, io);
    else
      chan::map<T>(l, st.stream, ApplyOp<T, false>{ptr<T>(x), ptr<T>(z), mptr<T>(y), scale, shift}, io);
  });
}

void CudaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                          const Tensor& running_mean, const Tensor& running_var, const BnArgs& a,
                                          Tensor& y) {
  const chan::Layout l = layout(x, a.nhwc);
  check_params({&gamma, &beta, &running_mean, &running_var}, l.c, "batch_norm2d");
  check_like({&z, &y}, x, "batch_norm2d");
  if (l.total() == 0) return;
  DeviceState& st = state_for(y);
  kern::dispatch_float(x.dtype(), "batch_norm2d", [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto op) {
      chan::map<T>(l, st.stream, op, {x.data_ptr(), z.defined() ? z.data_ptr() : nullptr, y.data_ptr()});
    };
    if (a.relu)
      run(EvalOp<T, true>{ptr<T>(x), ptr<T>(z), mptr<T>(y), gamma.data<float>(), beta.data<float>(),
                          running_mean.data<float>(), running_var.data<float>(), a.eps});
    else
      run(EvalOp<T, false>{ptr<T>(x), ptr<T>(z), mptr<T>(y), gamma.data<float>(), beta.data<float>(),
                           running_mean.data<float>(), running_var.data<float>(), a.eps});
  });
}

void CudaBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                                      const Tensor& save_mean, const Tensor& save_invstd, const BnArgs& a, Tensor& dx,
                                      Tensor& dz, Tensor& dgamma, Tensor& dbeta) {
  const chan::Layout l = layout(x, a.nhwc);
  check_params({&gamma, &save_mean, &save_invstd, &dgamma, &dbeta}, l.c, "batch_norm2d backward");
  check_like({&dy, &dx, &dz}, x, "batch_norm2d backward");
  TANDEM_ASSERT(!a.relu || (y.defined() && y.numel() == x.numel() && y.dtype() == x.dtype()),
                "batch_norm2d backward: a fused ReLU needs the forward output");
  if (l.c == 0) return;
  DeviceState& st = state_for(dx);
  Scratch coef(allocator(st.device), static_cast<size_t>(3 * l.c) * sizeof(float));
  float* k = coef.as<float>();
  float *u = k + l.c, *w = u + l.c;
  const GradFinish finish{gamma.data<float>(), save_mean.data<float>(), save_invstd.data<float>(), dgamma.data<float>(),
                          dbeta.data<float>(), k, u, w, static_cast<double>(l.n * l.s)};
  kern::dispatch_float(x.dtype(), "batch_norm2d backward", [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto relu) {
      constexpr bool R = decltype(relu)::value;
      const std::initializer_list<const void*> io{dy.data_ptr(), R ? y.data_ptr() : nullptr, x.data_ptr(),
                                                  dx.data_ptr(), dz.defined() ? dz.data_ptr() : nullptr};
      chan::reduce<2, T>(*this, st.device, l, GradElem<T, R>{ptr<T>(dy), ptr<T>(y), ptr<T>(x)}, finish, io);
      chan::map<T>(l, st.stream, GradApply<T, R>{ptr<T>(dy), ptr<T>(y), ptr<T>(x), mptr<T>(dx), mptr<T>(dz), k, u, w},
                   io);
    };
    if (a.relu)
      run(std::true_type{});
    else
      run(std::false_type{});
  });
}

}  // namespace tandem::backend
