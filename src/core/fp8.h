#pragma once
// Internal: the FP8 codes of tandem/fp8.h's formats, encoded from and decoded to f32 on the host and in
// CUDA kernels alike (the same bytes on every device). Encoding rounds to nearest, ties to the even code.
//  e4m3 (fn): S.EEEE.MMM, bias 7; S.1111.111 is NaN (the only one); no infinities; max 448 (S.1111.110)
//  e5m2:      S.EEEEE.MM, bias 15; S.11111.00 is infinity, S.11111.{01,10,11} NaN; max 57344 (S.11110.11)
// A NaN input encodes as 0x7f in both formats. Beyond the largest finite value (after rounding), a
// saturating encode gives that value with the input's sign (infinities too); a non-saturating one gives
// e5m2's infinity of that sign, or e4m3's NaN 0x7f (e4m3 has no infinity).
#include <cstdint>
#include <cstring>

#include "tandem/fp8.h"

#ifndef TANDEM_HD
#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif
#endif

namespace tandem::fp8 {

TANDEM_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

TANDEM_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// The code every NaN encodes to.
constexpr uint8_t kNan = 0x7f;

/// The code of x in format f (e4m3 when e4m3, else e5m2), round to nearest even; saturating as above.
TANDEM_HD uint8_t encode(float x, bool e4m3, bool saturate) {
  const int mant = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const uint32_t max_code = e4m3 ? 0x7eu : 0x7bu;  // the largest finite magnitude
  const uint32_t u = float_to_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kNan;
  const uint32_t overflow = saturate ? sign | max_code : e4m3 ? kNan : sign | 0x7cu;
  if (a == 0x7f800000u) return static_cast<uint8_t>(overflow);
  uint32_t exp = a >> 23;
  uint32_t frac = a & 0x7fffffu;
  uint32_t q, shift;
  if (exp >= static_cast<uint32_t>(128 - bias)) {
    // At least the format's smallest normal 2^(1 - bias): rebias the exponent, keep the top mantissa bits.
    shift = 23 - mant;
    q = ((exp - 127 + bias) << mant) | (frac >> shift);
  } else {
    // Below it: q counts the smallest subnormal 2^(1 - bias - mant). With the implicit bit, |x| = m 2^(e - 150)
    // (f32 subnormals: e = 1, no implicit bit), so q = m >> (151 - bias - mant - e).
    if (exp == 0) {
      exp = 1;
    } else {
      frac |= 0x800000u;
    }
    shift = 151 - bias - mant - exp;
    if (shift >= 25) return static_cast<uint8_t>(sign);  // below half the smallest subnormal (frac < 2^24)
    q = frac >> shift;
  }
  const uint32_t rem = frac & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // a carry into the exponent is the right code
  if (q > max_code) return static_cast<uint8_t>(overflow);
  return static_cast<uint8_t>(sign | q);
}

/// The value of code c in format f; NaN codes give a quiet NaN of the code's sign.
TANDEM_HD float decode(uint8_t c, bool e4m3) {
  const int mant = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7fu;
  const uint32_t exp = mag >> mant, frac = mag & ((1u << mant) - 1u);
  if (e4m3 ? mag == 0x7fu : exp == 0x1fu) return bits_to_float(sign | (frac == 0 && !e4m3 ? 0x7f800000u : 0x7fc00000u));
  if (exp == 0) {  // subnormal or zero: frac units of 2^(1 - bias - mant), exact in f32
    const float v = static_cast<float>(frac) * (e4m3 ? 0.001953125f /* 2^-9 */ : 1.52587890625e-05f /* 2^-16 */);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp - bias + 127) << 23) | (frac << (23 - mant)));
}

TANDEM_HD uint8_t encode(float x, Fp8Format f, bool saturate) { return encode(x, f == Fp8Format::e4m3, saturate); }
TANDEM_HD float decode(uint8_t c, Fp8Format f) { return decode(c, f == Fp8Format::e4m3); }

/// The largest finite value of each format (also fp8_max()).
constexpr float kMaxE4m3 = 448.0f;
constexpr float kMaxE5m2 = 57344.0f;

/// The bits of |x| as an unsigned number: larger for every larger magnitude, infinity above every finite
/// value and NaN above infinity, so that a maximum over them is the maximum |x| with NaN propagating. Every
/// NaN gives the same bits (0x7fc00000), so that maxima agree bit for bit on every device (a GPU's conversions
/// and arithmetic may change a NaN's payload).
TANDEM_HD uint32_t abs_bits(float x) {
  const uint32_t a = float_to_bits(x) & 0x7fffffffu;
  return a > 0x7f800000u ? 0x7fc00000u : a;
}

/// The largest finite f32, the scale an overflowing update gives.
constexpr float kMaxF32 = 3.40282346638528859812e+38f;

/// Fp8ScaleState::update for slot i of history [rows, count] (row-major) and scale, scale_inv [count];
/// returns whether row 0's entry was finite. Shared by the CPU and CUDA backends.
TANDEM_HD bool update_scale(float* history, int64_t rows, int64_t count, int64_t i, float* scale, float* scale_inv,
                            float fp8_max, float margin_factor, bool use_history_max) {
  const float recent = history[i];
  if (abs_bits(recent) >= 0x7f800000u) {  // inf or NaN: dropped, nothing else changes
    history[i] = 0.0f;
    return false;
  }
  float amax = recent;
  if (use_history_max) {
    for (int64_t r = 1; r < rows; ++r) {
      const float v = history[r * count + i];
      if (v > amax) amax = v;
    }
  }
  if (amax > 0.0f) {
    float s = fp8_max / amax;
    s = s / margin_factor;
    if (!(s <= kMaxF32)) s = kMaxF32;
    scale[i] = s;
    scale_inv[i] = 1.0f / s;
  }
  for (int64_t r = rows - 1; r > 0; --r) history[r * count + i] = history[(r - 1) * count + i];
  history[i] = 0.0f;
  return true;
}

}  // namespace tandem::fp8
