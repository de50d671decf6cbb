#pragma once
// Internal: row kernels' float math written so that the compiler vectorises it (AVX2 + FMA with the
// library's -march=x86-64-v3; files that include it are compiled with -fno-trapping-math, without which
// GCC keeps the comparisons as branches): an exp without calls or branches, and sums over rows of floats
// kept in eight lanes (a fixed order, so results repeat bit for bit).
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

/// Sum of x[0..n) in eight float lanes, added in a fixed order at the end in double.
inline double sum_f32(const float* x, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += x[j + l];
  double s = 0.0;
  for (int l = 0; l < 8; ++l) s += lane[l];
  for (; j < n; ++j) s += x[j];
  return s;
}

/// Largest of x[0..n) (n >= 1); NaN is not propagated (callers keep finite data). GCC leaves a float
/// maximum as a branch whatever its form, so AVX's is used where the target has it.
inline float max_f32(const float* x, int64_t n) {
  int64_t j = 0;
  float m = x[0];
#if defined(__AVX__)
  if (n >= 8) {
    __m256 v = _mm256_loadu_ps(x);
    for (j = 8; j + 8 <= n; j += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + j));
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

/// Sum of x[j] * y[j] in eight float lanes.
inline double dot_f32(const float* x, const float* y, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += x[j + l] * y[j + l];
  double s = 0.0;
  for (int l = 0; l < 8; ++l) s += lane[l];
  for (; j < n; ++j) s += static_cast<double>(x[j]) * y[j];
  return s;
}

}  // namespace tandem::backend::cpu
