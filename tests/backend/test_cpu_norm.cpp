// Batch normalisation kernels against double-precision references.
#include <cmath>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

struct Stats {
  std::vector<double> mean, var_biased;
};

Stats channel_stats(const std::vector<double>& x, int64_t n, int64_t c, int64_t s) {
  Stats st{std::vector<double>(c, 0.0), std::vector<double>(c, 0.0)};
  const double m = static_cast<double>(n * s);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < s; ++j) st.mean[ch] += x[(i * c + ch) * s + j] / m;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < s; ++j) {
        const double d = x[(i * c + ch) * s + j] - st.mean[ch];
        st.var_biased[ch] += d * d / m;
      }
  return st;
}

struct BnCase {
  int64_t n, c, h, w;
};
backend::BnArgs bn_args(double momentum, double eps, bool relu = false) {
  backend::BnArgs a;
  a.momentum = momentum;
  a.eps = eps;
  a.relu = relu;
  return a;
}

const BnCase kCases[] = {{4, 3, 5, 5}, {2, 1, 1, 3}, {8, 17, 3, 2}, {16, 8, 12, 12}};

TEST(CpuBatchNorm, TrainingForward) {
  Generator gen(41);
  const double momentum = 0.1, eps = 1e-5;
  for (DType dt : float_types())
    for (BnCase t : kCases) {
      const int64_t s = t.h * t.w;
      Tensor x = rand_tensor({t.n, t.c, t.h, t.w}, dt, gen, 2.0, 5.0);  // nonzero mean
      Tensor gamma = rand_tensor({t.c}, dt, gen, 0.5, 1.5), beta = rand_tensor({t.c}, dt, gen);
      Tensor rm = rand_tensor({t.c}, dt, gen), rv = rand_tensor({t.c}, dt, gen, 0.5, 1.5);
      auto vx = values(x), vg = values(gamma), vb = values(beta), vrm = values(rm), vrv = values(rv);
      Tensor y = Tensor::empty(x.shape(), dt), sm = Tensor::empty({t.c}, dt), si = Tensor::empty({t.c}, dt);
      cpu().batch_norm_forward_train(x, Tensor(), gamma, beta, rm, rv, bn_args(momentum, eps), y, sm, si);

      Stats st = channel_stats(vx, t.n, t.c, s);
      const double m = static_cast<double>(t.n * s);
      std::vector<double> want_y(vx.size()), want_inv(t.c), want_rm(t.c), want_rv(t.c);
      for (int64_t ch = 0; ch < t.c; ++ch) {
        want_inv[ch] = 1.0 / std::sqrt(st.var_biased[ch] + eps);
        want_rm[ch] = (1 - momentum) * vrm[ch] + momentum * st.mean[ch];
        want_rv[ch] = (1 - momentum) * vrv[ch] + momentum * st.var_biased[ch] * m / (m - 1);
      }
      for (size_t i = 0; i < vx.size(); ++i) {
        const int64_t ch = (i / s) % t.c;
        want_y[i] = (vx[i] - st.mean[ch]) * want_inv[ch] * vg[ch] + vb[ch];
      }
      const Tol tol = tol_for(dt, 10);
      expect_close(y, want_y, tol, "batch norm y");
      expect_close(sm, st.mean, tol, "saved mean");
      expect_close(si, want_inv, Tol{tol.rtol, 0}, "saved invstd");
      expect_close(rm, want_rm, tol, "running mean");
      expect_close(rv, want_rv, tol, "running var (unbiased)");
    }
}

TEST(CpuBatchNorm, EvalUsesRunningStatistics) {
  Generator gen(42);
  const double eps = 1e-3;
  for (DType dt : float_types()) {
    Tensor x = rand_tensor({3, 4, 5, 2}, dt, gen), gamma = rand_tensor({4}, dt, gen), beta = rand_tensor({4}, dt, gen);
    Tensor rm = rand_tensor({4}, dt, gen), rv = rand_tensor({4}, dt, gen, 0.1, 2.0);
    auto vx = values(x), vg = values(gamma), vb = values(beta), vrm = values(rm), vrv = values(rv);
    Tensor y = Tensor::empty(x.shape(), dt);
    cpu().batch_norm_forward_eval(x, Tensor(), gamma, beta, rm, rv, bn_args(0.1, eps), y);
    std::vector<double> want(vx.size());
    for (size_t i = 0; i < vx.size(); ++i) {
      const int64_t ch = (i / 10) % 4;
      want[i] = (vx[i] - vrm[ch]) / std::sqrt(vrv[ch] + eps) * vg[ch] + vb[ch];
    }
    expect_close(y, want, tol_for(dt, 10), "batch norm eval");
    expect_close(rm, vrm, Tol{0, 0}, "running mean untouched");
  }
}

TEST(CpuBatchNorm, Backward) {
  Generator gen(43);
  const double eps = 1e-5;
  for (DType dt : float_types())
    for (BnCase t : kCases) {
      const int64_t s = t.h * t.w;
      Tensor x = rand_tensor({t.n, t.c, t.h, t.w}, dt, gen, -1.0, 3.0), dy = rand_tensor(x.shape(), dt, gen);
      Tensor gamma = rand_tensor({t.c}, dt, gen, 0.5, 1.5), beta = rand_tensor({t.c}, dt, gen);
      Tensor rm = Tensor::zeros({t.c}, dt), rv = Tensor::ones({t.c}, dt);
      Tensor y = Tensor::empty(x.shape(), dt), sm = Tensor::empty({t.c}, dt), si = Tensor::empty({t.c}, dt);
      cpu().batch_norm_forward_train(x, Tensor(), gamma, beta, rm, rv, bn_args(0.1, eps), y, sm, si);
      Tensor dx = Tensor::empty(x.shape(), dt), dg = Tensor::empty({t.c}, dt), db = Tensor::empty({t.c}, dt);
      Tensor no_dz;
      cpu().batch_norm_backward(dy, x, y, gamma, sm, si, bn_args(0.1, eps), dx, no_dz, dg, db);

      auto vx = values(x), vdy = values(dy), vg = values(gamma);
      Stats st = channel_stats(vx, t.n, t.c, s);
      const double m = static_cast<double>(t.n * s);
      std::vector<double> inv(t.c), want_db(t.c, 0.0), want_dg(t.c, 0.0), want_dx(vx.size());
      for (int64_t ch = 0; ch < t.c; ++ch) inv[ch] = 1.0 / std::sqrt(st.var_biased[ch] + eps);
      for (size_t i = 0; i < vx.size(); ++i) {
        const int64_t ch = (i / s) % t.c;
        want_db[ch] += vdy[i];
        want_dg[ch] += vdy[i] * (vx[i] - st.mean[ch]) * inv[ch];
      }
      for (size_t i = 0; i < vx.size(); ++i) {
        const int64_t ch = (i / s) % t.c;
        const double xhat = (vx[i] - st.mean[ch]) * inv[ch];
        want_dx[i] = vg[ch] * inv[ch] / m * (m * vdy[i] - want_db[ch] - xhat * want_dg[ch]);
      }
      const Tol tol = tol_for(dt, 50);
      expect_close(db, want_db, tol, "dbeta");
      expect_close(dg, want_dg, tol, "dgamma");
      expect_close(dx, want_dx, tol, "dx");
    }
}

}  // namespace
}  // namespace tandem::testing
