#pragma once
// Internal: row kernels' float math written so that the compiler vectorises it (AVX2 + FMA with the
// library's -march=x86-64-v3; files that include it are compiled with -fno-trapping-math, without which
// GCC keeps the comparisons as branches): an exp without calls or branches, and sums over rows of floats
// kept in eight lanes (AVX registers where the target has them; a fixed order, so results repeat bit for
// bit).
#include <algorithm>
#include <bit>
#include <cstdint>
#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace tandem::backend::cpu {

/// e^x in float, within 2 ulp of the exact value for normal results: 0 below -87.3 (where e^x would be
/// subnormal; -inf gives 0), x above 88.7 taken as 88.7 (+inf gives a finite 3.3e38), NaN stays NaN. x is
/// split as x = n ln 2 + r with |r| <= ln 2 / 2, e^r taken by its Taylor polynomial of degree 7 (error
/// below 2^-27) and 2^n put into the exponent bits (of two factors).
inline float exp_f32(float xin) {
  const float x = std::min(std::max(xin, -87.3f), 88.7f);  // NaN stays NaN (std::max(NaN, a) is NaN)
  const float shifter = 12582912.0f;                   // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln 2 in two parts
  float p = 1.98412698e-4f;
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as 2^h 2^(n - h): n reaches 128 near the top of the range, one past the largest exponent.
  const int32_t ni = static_cast<int32_t>(n), h = ni / 2;
  const float v = p * std::bit_cast<float>(static_cast<uint32_t>(h + 127) << 23) *
                  std::bit_cast<float>(static_cast<uint32_t>(ni - h + 127) << 23);
  return xin < -87.3f ? 0.0f : v;
}

#if defined(__AVX__)
/// The eight lanes of v added pairwise in a fixed order.
inline float hsum256(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif

/// Sum of x[0..n) in eight float lanes (kept in a register where the target has AVX), added in a fixed
/// order at the end; the tail after the last multiple of 8 in double.
inline double sum_f32(const float* x, int64_t n) {
  int64_t j = 0;
  double s = 0.0;
#if defined(__AVX__)
  // Four accumulators: one add's latency no longer paces the loop.
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (; j + 32 <= n; j += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + j));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + j + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + j + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + j + 24));
  }
  for (; j + 8 <= n; j += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + j));
  s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#else
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += x[j + l];
  for (int l = 0; l < 8; ++l) s += lane[l];
#endif
  for (; j < n; ++j) s += x[j];
  return s;
}

/// Sum of (x[j] - mu)^2 over x[0..n), as sum_f32 adds.
inline double sum_sq_dev_f32(const float* x, int64_t n, float mu) {
  int64_t j = 0;
  double s = 0.0;
#if defined(__AVX__)
  const __m256 m = _mm256_set1_ps(mu);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + j), m);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
  }
  s = hsum256(acc);
#else
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += (x[j + l] - mu) * (x[j + l] - mu);
  for (int l = 0; l < 8; ++l) s += lane[l];
#endif
  for (; j < n; ++j) s += static_cast<double>(x[j] - mu) * (x[j] - mu);
  return s;
}

/// The sums of a[j] b[j] (b null: of a[j]) and of a[j] b[j] (x[j] - mu) over j < n, as sum_f32 adds: the
/// two sums of a layer-norm row's backward (a the output gradient, b the weight).
inline void norm_backward_sums_f32(const float* a, const float* b, const float* x, int64_t n, float mu, double& s1,
                                   double& s2) {
  int64_t j = 0;
  s1 = s2 = 0.0;
#if defined(__AVX__)
  const __m256 m = _mm256_set1_ps(mu);
  __m256 acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    __m256 g = _mm256_loadu_ps(a + j);
    if (b) g = _mm256_mul_ps(g, _mm256_loadu_ps(b + j));
    acc1 = _mm256_add_ps(acc1, g);
    acc2 = _mm256_add_ps(acc2, _mm256_mul_ps(g, _mm256_sub_ps(_mm256_loadu_ps(x + j), m)));
  }
  s1 = hsum256(acc1);
  s2 = hsum256(acc2);
#else
  float l1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, l2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) {
      const float g = b ? a[j + l] * b[j + l] : a[j + l];
      l1[l] += g;
      l2[l] += g * (x[j + l] - mu);
    }
  for (int l = 0; l < 8; ++l) s1 += l1[l], s2 += l2[l];
#endif
  for (; j < n; ++j) {
    const double g = static_cast<double>(a[j]) * (b ? b[j] : 1.0f);
    s1 += g;
    s2 += g * (x[j] - mu);
  }
}

/// Largest of x[0..n) (n >= 1); NaN is not propagated (callers keep finite data). GCC leaves a float
/// maximum as a branch whatever its form, so AVX's is used where the target has it.
inline float max_f32(const float* x, int64_t n) {
  int64_t j = 0;
  float m = x[0];
#if defined(__AVX__)
  if (n >= 8) {
    __m256 v = _mm256_loadu_ps(x), v1 = v, v2 = v, v3 = v;  // four chains of maxima
    for (j = 8; j + 32 <= n; j += 32) {
      v = _mm256_max_ps(v, _mm256_loadu_ps(x + j));
      v1 = _mm256_max_ps(v1, _mm256_loadu_ps(x + j + 8));
      v2 = _mm256_max_ps(v2, _mm256_loadu_ps(x + j + 16));
      v3 = _mm256_max_ps(v3, _mm256_loadu_ps(x + j + 24));
    }
    for (; j + 8 <= n; j += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + j));
    v = _mm256_max_ps(_mm256_max_ps(v, v1), _mm256_max_ps(v2, v3));
    alignas(32) float lane[8];
    _mm256_store_ps(lane, v);
    for (int l = 0; l < 8; ++l) m = m > lane[l] ? m : lane[l];
  }
#endif
  for (; j < n; ++j) m = m > x[j] ? m : x[j];
  return m;
}

/// Sum of exp(x[j] - shift) for j < n: the exponentials of 256 values at a time into a buffer (a loop
/// the compiler vectorises), each buffer summed as sum_f32 does.
inline double sum_exp_f32(const float* x, int64_t n, float shift) {
  constexpr int64_t kChunk = 256;
  float buf[kChunk];
  double s = 0.0;
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t m = n - j0 < kChunk ? n - j0 : kChunk;
    for (int64_t k = 0; k < m; ++k) buf[k] = exp_f32(x[j0 + k] - shift);
    s += sum_f32(buf, m);
  }
  return s;
}

/// y[j] = exp(scale * x[j] - shift) for j < n; returns their sum (as sum_f32 adds).
inline double exp_shifted_f32(const float* x, float* y, int64_t n, float scale, float shift) {
  for (int64_t j = 0; j < n; ++j) y[j] = exp_f32(scale * x[j] - shift);
  return sum_f32(y, n);
}

/// Sum of x[j] * y[j], as sum_f32 adds.
inline double dot_f32(const float* x, const float* y, int64_t n) {
  int64_t j = 0;
  double s = 0.0;
#if defined(__AVX__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (; j + 16 <= n; j += 16) {
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(x + j + 8), _mm256_loadu_ps(y + j + 8)));
  }
  for (; j + 8 <= n; j += 8) a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
  s = hsum256(_mm256_add_ps(a0, a1));
#else
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += x[j + l] * y[j + l];
  for (int l = 0; l < 8; ++l) s += lane[l];
#endif
  for (; j < n; ++j) s += static_cast<double>(x[j]) * y[j];
  return s;
}

}  // namespace tandem::backend::cpu
