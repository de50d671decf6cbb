#pragma once
// Internal: row kernels' float math, in AVX2 + FMA (the library's -march=x86-64-v3) where the compiler
// would not find it, and otherwise written so that the compiler vectorises it (files that include it are
// compiled with -fno-trapping-math, without which GCC keeps the comparisons as branches): an exp without
// calls or branches, scalar and in eight lanes, and sums over rows of floats kept in eight lanes (AVX
// registers where the target has them; a fixed order, so results repeat bit for bit).
#include <algorithm>
#include <bit>
#include <cstdint>
#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace tandem::backend::cpu {

/// The polynomial of exp_f32 and exp256 for e^r, |r| <= ln 2 / 2, highest degree first: degree 6, the
/// constant term 1 (so that e^0 is 1), the others fitted to the smallest largest relative error over the
/// interval (2e-9; in float arithmetic within 0.81 ulp).
inline constexpr float kExpPoly[6] = {1.38436537e-3f, 8.37415550e-3f, 4.16680016e-2f,
                                      1.66664317e-1f, 4.99999940e-1f, 1.0f};

/// e^x in float, within 2 ulp of the exact value for normal results: 0 below -87.3 (where e^x would be
/// subnormal; -inf gives 0), x above 88.7 taken as 88.7 (+inf gives a finite 3.3e38), NaN stays NaN. x is
/// split as x = n ln 2 + r with |r| <= ln 2 / 2, e^r taken by kExpPoly and 2^n put into the exponent bits
/// (of two factors).
inline float exp_f32(float xin) {
  const float x = std::min(std::max(xin, -87.3f), 88.7f);  // NaN stays NaN (std::max(NaN, a) is NaN)
  const float shifter = 12582912.0f;                   // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln 2 in two parts
  float p = kExpPoly[0];
  for (int i = 1; i < 6; ++i) p = p * r + kExpPoly[i];
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
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;  // four chains, as sum_f32
  auto sq = [&](int64_t i) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
    return _mm256_mul_ps(d, d);
  };
  for (; j + 32 <= n; j += 32) {
    a0 = _mm256_add_ps(a0, sq(j));
    a1 = _mm256_add_ps(a1, sq(j + 8));
    a2 = _mm256_add_ps(a2, sq(j + 16));
    a3 = _mm256_add_ps(a3, sq(j + 24));
  }
  for (; j + 8 <= n; j += 8) a0 = _mm256_add_ps(a0, sq(j));
  s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#else
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += (x[j + l] - mu) * (x[j + l] - mu);
  for (int l = 0; l < 8; ++l) s += lane[l];
#endif
  for (; j < n; ++j) s += static_cast<double>(x[j] - mu) * (x[j] - mu);
  return s;
}

/// The sums of K layer-norm rows' backward (rows of n, `stride` apart in g and x), in one pass over them:
/// for row i, s1[i] = the sum of g[j] w[j] (w null: of g[j]) and s2[i] = the sum of g[j] w[j] (x[j] - mu[i]),
/// each in eight lanes added in a fixed order at the end; and on the way the rows' shares of the
/// parameters' gradients, aw[j] += g[j] (x[j] - mu[i]) r[i] and ab[j] += g[j] row after row (either null:
/// skipped), aw and ab read and written once for the K rows.
template <int K>
inline void norm_backward_rows_f32(const float* g, const float* w, const float* x, int64_t stride, int64_t n,
                                   const float* mu, const float* r, float* aw, float* ab, double* s1, double* s2) {
  int64_t j = 0;
  for (int i = 0; i < K; ++i) s1[i] = s2[i] = 0.0;
#if defined(__AVX__)
  __m256 p1[K], p2[K];
  for (int i = 0; i < K; ++i) p1[i] = p2[i] = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 wv = w ? _mm256_loadu_ps(w + j) : _mm256_set1_ps(1.0f);
    __m256 awv = aw ? _mm256_loadu_ps(aw + j) : _mm256_setzero_ps(), abv = ab ? _mm256_loadu_ps(ab + j) : awv;
    for (int i = 0; i < K; ++i) {
      const __m256 gv = _mm256_loadu_ps(g + i * stride + j);
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i * stride + j), _mm256_set1_ps(mu[i]));
      const __m256 gw = _mm256_mul_ps(gv, wv);
      p1[i] = _mm256_add_ps(p1[i], gw);
      p2[i] = _mm256_add_ps(p2[i], _mm256_mul_ps(gw, d));
      awv = _mm256_add_ps(awv, _mm256_mul_ps(gv, _mm256_mul_ps(d, _mm256_set1_ps(r[i]))));
      abv = _mm256_add_ps(abv, gv);
    }
    if (aw) _mm256_storeu_ps(aw + j, awv);
    if (ab) _mm256_storeu_ps(ab + j, abv);
  }
  for (int i = 0; i < K; ++i) s1[i] = hsum256(p1[i]), s2[i] = hsum256(p2[i]);
#else
  float l1[K][8] = {}, l2[K][8] = {};
  for (; j + 8 <= n; j += 8)
    for (int i = 0; i < K; ++i)
      for (int l = 0; l < 8; ++l) {
        const float gv = g[i * stride + j + l], d = x[i * stride + j + l] - mu[i], gw = w ? gv * w[j + l] : gv;
        l1[i][l] += gw;
        l2[i][l] += gw * d;
        if (aw) aw[j + l] += gv * (d * r[i]);
        if (ab) ab[j + l] += gv;
      }
  for (int i = 0; i < K; ++i)
    for (int l = 0; l < 8; ++l) s1[i] += l1[i][l], s2[i] += l2[i][l];
#endif
  for (; j < n; ++j)
    for (int i = 0; i < K; ++i) {
      const float gv = g[i * stride + j], d = x[i * stride + j] - mu[i];
      const double gw = static_cast<double>(gv) * (w ? w[j] : 1.0f);
      s1[i] += gw;
      s2[i] += gw * d;
      if (aw) aw[j] += gv * (d * r[i]);
      if (ab) ab[j] += gv;
    }
}

/// The smallest and the largest of x[0..n) (n >= 1), in one pass; NaN is not propagated (callers keep
/// finite data). GCC leaves a float maximum as a branch whatever its form, so AVX's is used where the
/// target has it.
inline void min_max_f32(const float* x, int64_t n, float& mn, float& mx) {
  int64_t j = 0;
  float lo = x[0], hi = x[0];
#if defined(__AVX__)
  if (n >= 8) {
    __m256 l0 = _mm256_loadu_ps(x), l1 = l0, h0 = l0, h1 = l0;  // two chains of each
    for (j = 8; j + 16 <= n; j += 16) {
      const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + 8);
      l0 = _mm256_min_ps(l0, a), h0 = _mm256_max_ps(h0, a);
      l1 = _mm256_min_ps(l1, b), h1 = _mm256_max_ps(h1, b);
    }
    if (j + 8 <= n) {
      const __m256 a = _mm256_loadu_ps(x + j);
      l0 = _mm256_min_ps(l0, a), h0 = _mm256_max_ps(h0, a);
      j += 8;
    }
    alignas(32) float ll[8], hl[8];
    _mm256_store_ps(ll, _mm256_min_ps(l0, l1));
    _mm256_store_ps(hl, _mm256_max_ps(h0, h1));
    for (int l = 0; l < 8; ++l) lo = lo < ll[l] ? lo : ll[l], hi = hi > hl[l] ? hi : hl[l];
  }
#endif
  for (; j < n; ++j) lo = lo < x[j] ? lo : x[j], hi = hi > x[j] ? hi : x[j];
  mn = lo;
  mx = hi;
}

#if defined(__AVX2__) && defined(__FMA__)
/// exp_f32 in eight lanes, the same steps and constants, for x up to 88.37 (above, taken as 88.37: e^88.37
/// is 2.39e38): 2^n then fits the exponent bits of one factor, which saves exp_f32's split of n. Where the
/// compiler fuses exp_f32's products and sums as written here (it does at -O2 and above), a lane equals
/// exp_f32 bit for bit below 88.37. kInRange: every lane is known to lie in [-87.3, 88.37] or be NaN, and
/// the clamps and the zero below -87.3 are skipped (a fifth of the work).
template <bool kInRange = false>
inline __m256 exp256(__m256 xin) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  // With a NaN, AVX's min and max return their second operand: NaN stays NaN, as in exp_f32.
  const __m256 x = kInRange ? xin : _mm256_min_ps(_mm256_set1_ps(88.37f), _mm256_max_ps(lo, xin));
  const __m256 shifter = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const __m256 k = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
  const __m256 n = _mm256_sub_ps(k, shifter);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  // ln 2 in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // k's low mantissa bits hold n (two's complement): shifted into the exponent field, plus the bias, 2^n.
  const __m256i e = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(k), 23), _mm256_set1_epi32(127 << 23));
  const __m256 v = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  if constexpr (kInRange) return v;
  return _mm256_andnot_ps(_mm256_cmp_ps(xin, lo, _CMP_LT_OQ), v);  // 0 below -87.3
}

/// exp_sum_f32's loop over whole vectors from x[0] (kScaled false: scale is 1, no product taken): returns
/// where it stopped (the last multiple of 8).
template <bool kStore, bool kInRange, bool kScaled>
inline int64_t exp_sum_vectors(const float* x, float* y, int64_t n, float scale, float shift, double& sum) {
  const __m256 sc = _mm256_set1_ps(scale), sh = _mm256_set1_ps(shift);
  auto at = [&](int64_t i) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), sh);
    return exp256<kInRange>(kScaled ? _mm256_mul_ps(sc, d) : d);
  };
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;  // two chains of sums
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 e0 = at(j), e1 = at(j + 8);
    if constexpr (kStore) {
      _mm256_storeu_ps(y + j, e0);
      _mm256_storeu_ps(y + j + 8, e1);
    }
    a0 = _mm256_add_ps(a0, e0);
    a1 = _mm256_add_ps(a1, e1);
  }
  if (j + 8 <= n) {
    const __m256 e0 = at(j);
    if constexpr (kStore) _mm256_storeu_ps(y + j, e0);
    a0 = _mm256_add_ps(a0, e0);
    j += 8;
  }
  sum = hsum256(_mm256_add_ps(a0, a1));
  return j;
}
#endif

/// The sum of e^(scale (x[j] - shift)) for j < n, each also stored to y[j] when kStore (y may be x), for
/// scale >= 0 and shift at least the largest x[j]; lowest is the smallest x[j] (or -inf where not known):
/// when no argument is below -87.3 the vector exp's range checks are skipped. One pass, the exponentials
/// summed in eight lanes as they are made (AVX registers where the target has AVX2 and FMA), added in a
/// fixed order at the end; the tail after the last multiple of 8 in double.
template <bool kStore>
inline double exp_sum_f32(const float* x, [[maybe_unused]] float* y, int64_t n, float scale, float shift,
                          float lowest) {
  int64_t j = 0;
  double s = 0.0;
#if defined(__AVX2__) && defined(__FMA__)
  const bool in_range = scale * (lowest - shift) >= -87.3f;  // false for NaN
  if (scale == 1.0f)
    j = in_range ? exp_sum_vectors<kStore, true, false>(x, y, n, scale, shift, s)
                 : exp_sum_vectors<kStore, false, false>(x, y, n, scale, shift, s);
  else
    j = in_range ? exp_sum_vectors<kStore, true, true>(x, y, n, scale, shift, s)
                 : exp_sum_vectors<kStore, false, true>(x, y, n, scale, shift, s);
#else
  (void)lowest;
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) {
      const float e = exp_f32(scale * (x[j + l] - shift));
      if constexpr (kStore) y[j + l] = e;
      lane[l] += e;
    }
  for (int l = 0; l < 8; ++l) s += lane[l];
#endif
  for (; j < n; ++j) {
    const float e = exp_f32(scale * (x[j] - shift));
    if constexpr (kStore) y[j] = e;
    s += e;
  }
  return s;
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
