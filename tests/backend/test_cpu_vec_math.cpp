// The CPU row kernels' vectorisable float math against the C library's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_vec_math.h"

namespace {

using namespace tandem::backend::cpu;

// Distance in units in the last place between two positive normal floats.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

TEST(CpuVecMath, ExpWithinTwoUlpOverTheNormalRange) {
  int64_t worst = 0;
  float at = 0;
  for (float x = -87.0f; x <= 88.5f; x += 0.00173f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t u = ulps(exp_f32(x), want);
    if (u > worst) worst = u, at = x;
  }
  EXPECT_LE(worst, 2) << "at x = " << at;
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
}

TEST(CpuVecMath, ExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_f32(-inf), 0.0f);
  EXPECT_EQ(exp_f32(-100.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(std::nanf(""))));
  EXPECT_TRUE(std::isfinite(exp_f32(inf)));
  EXPECT_GT(exp_f32(inf), 3e38f);
}

#if defined(__AVX2__) && defined(__FMA__)
// The eight lanes of exp256 at x, x + step, ..., x + 7 step.
std::vector<float> exp256_lanes(float x, float step) {
  alignas(32) float in[8], out[8];
  for (int l = 0; l < 8; ++l) in[l] = x + static_cast<float>(l) * step;
  _mm256_store_ps(out, exp256(_mm256_load_ps(in)));
  return std::vector<float>(out, out + 8);
}

TEST(CpuVecMath, VectorExpWithinTwoUlpOverTheNormalRange) {
  int64_t worst = 0;
  float at = 0;
  for (float x = -87.0f; x <= 88.3f; x += 8 * 0.00173f) {
    const std::vector<float> got = exp256_lanes(x, 0.00173f);
    for (int l = 0; l < 8; ++l) {
      const float xl = x + static_cast<float>(l) * 0.00173f;
      const int64_t u = ulps(got[l], static_cast<float>(std::exp(static_cast<double>(xl))));
      if (u > worst) worst = u, at = xl;
      ASSERT_EQ(got[l], exp_f32(xl)) << "the scalar exp differs at x = " << xl;
    }
  }
  EXPECT_LE(worst, 2) << "at x = " << at;
  EXPECT_EQ(exp256_lanes(0.0f, 0.0f)[0], 1.0f);
}

TEST(CpuVecMath, VectorExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  alignas(32) float in[8] = {-inf, -100.0f, -87.31f, std::nanf(""), inf, 88.37f, 89.0f, -0.0f}, out[8];
  _mm256_store_ps(out, exp256(_mm256_load_ps(in)));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_TRUE(std::isfinite(out[4]));  // above 88.37: e^88.37
  EXPECT_GT(out[4], 2.39e38f);
  EXPECT_EQ(out[4], out[5]);
  EXPECT_EQ(out[6], out[5]);
  EXPECT_EQ(out[7], 1.0f);
}
#endif

TEST(CpuVecMath, SumsMaxAndDotOverRaggedLengths) {
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 24, 33, 64, 1000}) {
    std::vector<float> x(n), y(n);
    double sum = 0, dot = 0;
    float mx = -1e30f, mn = 1e30f;
    for (int64_t j = 0; j < n; ++j) {
      x[j] = std::sin(0.37f * static_cast<float>(j)) * 3.0f;
      y[j] = std::cos(0.11f * static_cast<float>(j));
      sum += x[j], dot += static_cast<double>(x[j]) * y[j], mx = std::max(mx, x[j]), mn = std::min(mn, x[j]);
          }
    EXPECT_NEAR(sum_f32(x.data(), n), sum, 1e-5 * (1 + std::abs(sum))) << n;
    EXPECT_NEAR(dot_f32(x.data(), y.data(), n), dot, 1e-5 * (1 + std::abs(dot))) << n;
    float lo, hi;
    min_max_f32(x.data(), n, lo, hi);
    EXPECT_EQ(hi, mx) << n;
    EXPECT_EQ(lo, mn) << n;
    // exp(x - max): with the row's smallest value (the vector exp's range checks skipped) and without.
    double sum_exp = 0;
    for (int64_t j = 0; j < n; ++j) sum_exp += std::exp(static_cast<double>(x[j]) - hi);
    const double se = exp_sum_f32<false>(x.data(), nullptr, n, 1.0f, hi, lo);
    EXPECT_NEAR(se, sum_exp, 1e-6 * sum_exp) << n;
    EXPECT_EQ(exp_sum_f32<false>(x.data(), nullptr, n, 1.0f, hi, -INFINITY), se) << n;
    // Below -87.3 the exponentials are 0: x - 100 has none above it.
    EXPECT_EQ(exp_sum_f32<false>(x.data(), nullptr, n, 1.0f, hi + 100.0f, lo), 0.0) << n;
    double sq = 0, wsum = 0, wdev = 0;
    for (int64_t j = 0; j < n; ++j) {
      sq += (static_cast<double>(x[j]) - 0.25) * (static_cast<double>(x[j]) - 0.25);
      wsum += y[j];
      wdev += static_cast<double>(y[j]) * (static_cast<double>(x[j]) - 0.25);
    }
    EXPECT_NEAR(sum_sq_dev_f32(x.data(), n, 0.25f), sq, 1e-5 * (1 + sq)) << n;
    // Three rows (y, x and y + x as gradients, weight x, means 0.25, -0.5, 1, rstd 1.5, 0.5, 2): each row's
    // sums, and the rows' parameter gradients added to what aw, ab hold.
    const float mus[3] = {0.25f, -0.5f, 1.0f}, rs[3] = {1.5f, 0.5f, 2.0f};
    std::vector<float> g3(3 * n), x3(3 * n);
    for (int64_t j = 0; j < n; ++j) {
      g3[j] = y[j], g3[n + j] = x[j], g3[2 * n + j] = y[j] + x[j];
      x3[j] = x3[n + j] = x3[2 * n + j] = x[j];
    }
    double a1[3], a2[3];
    std::vector<float> aw(n), ab(n);
    for (int64_t j = 0; j < n; ++j) aw[j] = 0.5f * static_cast<float>(j), ab[j] = -static_cast<float>(j);
    norm_backward_rows_f32<3>(g3.data(), x.data(), x3.data(), n, n, mus, rs, aw.data(), ab.data(), a1, a2);
    for (int i = 0; i < 3; ++i) {
      double w1 = 0, w2 = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double gw = static_cast<double>(g3[i * n + j]) * x[j];
        w1 += gw, w2 += gw * (static_cast<double>(x[j]) - mus[i]);
      }
      EXPECT_NEAR(a1[i], w1, 1e-5 * (1 + std::abs(w1))) << n << " row " << i;
      EXPECT_NEAR(a2[i], w2, 1e-5 * (1 + std::abs(w2))) << n << " row " << i;
    }
    for (int64_t j = 0; j < n; ++j) {
      double want_w = 0.5 * j, want_b = -static_cast<double>(j);
      for (int i = 0; i < 3; ++i) {
        want_w += static_cast<double>(g3[i * n + j]) * (static_cast<double>(x[j]) - mus[i]) * rs[i];
        want_b += g3[i * n + j];
      }
      EXPECT_NEAR(aw[j], want_w, 1e-5 * (1 + std::abs(want_w))) << n << " " << j;
      EXPECT_NEAR(ab[j], want_b, 1e-5 * (1 + std::abs(want_b))) << n << " " << j;
    }
    // One row, no weight, no parameter gradients.
    norm_backward_rows_f32<1>(y.data(), nullptr, x.data(), n, n, mus, rs, nullptr, nullptr, a1, a2);
    EXPECT_NEAR(a1[0], wsum, 1e-5 * (1 + std::abs(wsum))) << n;
    EXPECT_NEAR(a2[0], wdev, 1e-5 * (1 + std::abs(wdev))) << n;
    // Stored: e^(2 (x - max)), with the range checks skipped or not (the same values), and in place.
    std::vector<float> e(n), e2(n), inplace = x;
    const double s = exp_sum_f32<true>(x.data(), e.data(), n, 2.0f, hi, lo);
    double want = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double w = std::exp(static_cast<double>(2.0f * (x[j] - hi)));  // of the argument as rounded in float
      EXPECT_NEAR(e[j], w, 3e-7 * w) << n << " " << j;
      want += e[j];
    }
    EXPECT_NEAR(s, want, 1e-6 * want) << n;
    EXPECT_EQ(exp_sum_f32<true>(x.data(), e2.data(), n, 2.0f, hi, -INFINITY), s) << n;
    EXPECT_EQ(e2, e) << n;
    EXPECT_EQ(exp_sum_f32<true>(inplace.data(), inplace.data(), n, 2.0f, hi, lo), s) << n;
    EXPECT_EQ(inplace, e) << n;
    EXPECT_EQ(exp_sum_f32<false>(x.data(), nullptr, n, 2.0f, hi, lo), s) << n;  // the same, not stored
  }
}

}  // namespace
