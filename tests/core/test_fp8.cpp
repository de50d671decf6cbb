// The FP8 formats (core/fp8.h) against their definition: every code's value, every code's round trip, every
// halfway case, saturation, subnormals, signed zeros and NaN, and the encoder against a nearest-value search.
// Also the recipe's checks and the scale update (Fp8ScaleState on the CPU) against values worked out by hand.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "tandem/error.h"
#include "tandem/fp8.h"

namespace tandem {
namespace {

constexpr bool kE4 = true, kE5 = false;
const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// The value code c stands for, from the format's definition alone (in double).
double defined_value(uint8_t c, bool e4) {
  const int mant = e4 ? 3 : 2, bias = e4 ? 7 : 15, ebits = e4 ? 4 : 5;
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  const int exp = (c >> mant) & ((1 << ebits) - 1), frac = c & ((1 << mant) - 1);
  if (e4 && exp == 15 && frac == 7) return std::numeric_limits<double>::quiet_NaN();
  if (!e4 && exp == 31) return frac == 0 ? sign * HUGE_VAL : std::numeric_limits<double>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(frac, 1 - bias - mant);
  return sign * std::ldexp(1.0 + frac / double(1 << mant), exp - bias);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint8_t enc(float x, bool e4, bool sat = true) { return fp8::encode(x, e4, sat); }

TEST(Fp8Codes, EveryCodeDecodesToItsDefinedValue) {
  for (bool e4 : {kE4, kE5}) {
    int nans = 0, infs = 0;
    for (int c = 0; c < 256; ++c) {
      const double want = defined_value(static_cast<uint8_t>(c), e4);
      const float got = fp8::decode(static_cast<uint8_t>(c), e4);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "code " << c;
        ++nans;
        continue;
      }
      infs += std::isinf(want);
      EXPECT_EQ(static_cast<double>(got), want) << (e4 ? "e4m3" : "e5m2") << " code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    }
    EXPECT_EQ(nans, e4 ? 2 : 6);
    EXPECT_EQ(infs, e4 ? 0 : 2);
  }
}

TEST(Fp8Codes, KnownCodes) {
  EXPECT_EQ(fp8::decode(0x7e, kE4), 448.0f);
  EXPECT_EQ(fp8::decode(0xfe, kE4), -448.0f);
  EXPECT_EQ(fp8::decode(0x38, kE4), 1.0f);
  EXPECT_EQ(fp8::decode(0x08, kE4), 0.015625f);       // 2^-6, the smallest normal
  EXPECT_EQ(fp8::decode(0x07, kE4), 0.013671875f);    // 7 * 2^-9, the largest subnormal
  EXPECT_EQ(fp8::decode(0x01, kE4), 0.001953125f);    // 2^-9
  EXPECT_TRUE(std::isnan(fp8::decode(0x7f, kE4)));
  EXPECT_TRUE(std::isnan(fp8::decode(0xff, kE4)));
  EXPECT_EQ(fp8::decode(0x7b, kE5), 57344.0f);
  EXPECT_EQ(fp8::decode(0x3c, kE5), 1.0f);
  EXPECT_EQ(fp8::decode(0x04, kE5), 6.103515625e-05f);  // 2^-14
  EXPECT_EQ(fp8::decode(0x01, kE5), 1.52587890625e-05f);  // 2^-16
  EXPECT_EQ(fp8::decode(0x7c, kE5), kInf);
  EXPECT_EQ(fp8::decode(0xfc, kE5), -kInf);
  for (int c : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) EXPECT_TRUE(std::isnan(fp8::decode(c, kE5))) << c;
  EXPECT_EQ(fp8_max(Fp8Format::e4m3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.0f);
}

TEST(Fp8Codes, EveryCodeReencodesToItself) {
  for (bool e4 : {kE4, kE5}) {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8::decode(static_cast<uint8_t>(c), e4);
      if (std::isnan(v)) {
        EXPECT_EQ(enc(v, e4, true), 0x7f) << "NaN code " << c;
        EXPECT_EQ(enc(v, e4, false), 0x7f) << "NaN code " << c;
        continue;
      }
      EXPECT_EQ(enc(v, e4, false), c) << (e4 ? "e4m3" : "e5m2") << " code " << c << " value " << v;
      // Saturating: everything stays but e5m2's infinities, which become the largest finite value.
      const int sat = std::isinf(v) ? (c & 0x80) | 0x7b : c;
      EXPECT_EQ(enc(v, e4, true), sat) << "code " << c;
    }
  }
}

TEST(Fp8Codes, HalfwayCasesRoundToEven) {
  for (bool e4 : {kE4, kE5}) {
    const int max_code = e4 ? 0x7e : 0x7b;
    int ties = 0;
    for (int c = 0; c < max_code; ++c) {
      const double lo = defined_value(static_cast<uint8_t>(c), e4), hi = defined_value(static_cast<uint8_t>(c + 1), e4);
      const double mid = (lo + hi) / 2;
      const float m = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(m), mid) << "the midpoint is exact in f32";
      const int even = (c % 2 == 0) ? c : c + 1;
      for (int sign : {0, 0x80}) {
        const float s = sign ? -1.0f : 1.0f;
        EXPECT_EQ(enc(s * m, e4), sign | even) << (e4 ? "e4m3" : "e5m2") << " between codes " << c << " and " << c + 1;
        EXPECT_EQ(enc(s * std::nextafter(m, 0.0f), e4), sign | c) << "just below the midpoint of " << c;
        EXPECT_EQ(enc(s * std::nextafter(m, kInf), e4), sign | (c + 1)) << "just above the midpoint of " << c;
      }
      ++ties;
    }
    EXPECT_EQ(ties, max_code);
  }
}

TEST(Fp8Codes, BeyondTheLargestValueSaturatesOrOverflows) {
  // e4m3: 448 is the largest; 464 is halfway to 480 (which would be S.1111.111, NaN): ties to 448.
  for (float v : {448.0f, 449.0f, 463.99f, 464.0f}) {
    EXPECT_EQ(enc(v, kE4, true), 0x7e) << v;
    EXPECT_EQ(enc(v, kE4, false), 0x7e) << v;
    EXPECT_EQ(enc(-v, kE4, true), 0xfe) << v;
  }
  for (float v : {std::nextafter(464.0f, kInf), 480.0f, 1.0e6f, FLT_MAX, kInf}) {
    EXPECT_EQ(enc(v, kE4, true), 0x7e) << v;
    EXPECT_EQ(enc(-v, kE4, true), 0xfe) << v;
    EXPECT_EQ(enc(v, kE4, false), 0x7f) << v;  // no infinity in e4m3: NaN
    EXPECT_EQ(enc(-v, kE4, false), 0x7f) << v;
  }
  // e5m2: 57344 is the largest; 61440 is halfway to 65536 (the infinity's place): ties to it (even).
  for (float v : {57344.0f, 60000.0f, std::nextafter(61440.0f, 0.0f)}) {
    EXPECT_EQ(enc(v, kE5, true), 0x7b) << v;
    EXPECT_EQ(enc(v, kE5, false), 0x7b) << v;
  }
  for (float v : {61440.0f, 65536.0f, 1.0e9f, FLT_MAX, kInf}) {
    EXPECT_EQ(enc(v, kE5, true), 0x7b) << v;
    EXPECT_EQ(enc(-v, kE5, true), 0xfb) << v;
    EXPECT_EQ(enc(v, kE5, false), 0x7c) << v;
    EXPECT_EQ(enc(-v, kE5, false), 0xfc) << v;
  }
}

TEST(Fp8Codes, SubnormalBoundaries) {
  struct Case {
    bool e4;
    float unit;  // the smallest subnormal
  };
  for (Case k : {Case{kE4, 0.001953125f}, Case{kE5, 1.52587890625e-05f}}) {
    const float u = k.unit;
    EXPECT_EQ(enc(u / 2, k.e4), 0x00) << "half the smallest subnormal ties to zero";
    EXPECT_EQ(enc(std::nextafter(u / 2, 1.0f), k.e4), 0x01);
    EXPECT_EQ(enc(std::nextafter(u / 2, 0.0f), k.e4), 0x00);
    EXPECT_EQ(enc(u, k.e4), 0x01);
    EXPECT_EQ(enc(1.5f * u, k.e4), 0x02) << "1.5 units tie to 2 (even)";
    EXPECT_EQ(enc(2.5f * u, k.e4), 0x02) << "2.5 units tie to 2 (even)";
    const int top = k.e4 ? 7 : 3;                                  // the largest subnormal, in units
    EXPECT_EQ(enc(top * u, k.e4), top);
    EXPECT_EQ(enc((top + 0.5f) * u, k.e4), top + 1) << "ties up into the smallest normal (even)";
    EXPECT_EQ(enc(std::nextafter((top + 0.5f) * u, 0.0f), k.e4), top);
    EXPECT_EQ(enc((top + 1) * u, k.e4), top + 1) << "the smallest normal";
    EXPECT_EQ(enc(std::numeric_limits<float>::denorm_min(), k.e4), 0x00);
    EXPECT_EQ(enc(-std::numeric_limits<float>::denorm_min(), k.e4), 0x80);
    EXPECT_EQ(enc(-u, k.e4), 0x81);
    EXPECT_EQ(enc(FLT_MIN, k.e4), 0x00);
  }
}

TEST(Fp8Codes, SignedZerosAndNan) {
  for (bool e4 : {kE4, kE5}) {
    EXPECT_EQ(enc(0.0f, e4), 0x00);
    EXPECT_EQ(enc(-0.0f, e4), 0x80);
    const float nz = fp8::decode(0x80, e4);
    EXPECT_EQ(nz, 0.0f);
    EXPECT_TRUE(std::signbit(nz));
    EXPECT_FALSE(std::signbit(fp8::decode(0x00, e4)));
    for (bool sat : {true, false}) {
      EXPECT_EQ(enc(kNan, e4, sat), 0x7f);
      EXPECT_EQ(enc(-kNan, e4, sat), 0x7f);
    }
    EXPECT_TRUE(std::isnan(fp8::decode(enc(kNan, e4), e4)));
  }
}

// The code of x by search: the nearest of the finite non-negative values (codes 0..max in increasing order),
// ties to the even code, the place one step above the largest value (480, 65536) standing for overflow.
int searched_code(float x, bool e4, bool sat) {
  const int max_code = e4 ? 0x7e : 0x7b;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const double beyond = e4 ? 480.0 : 65536.0;
  const int overflow = sat ? sign | max_code : e4 ? 0x7f : sign | 0x7c;
  if (std::isinf(a) || a >= beyond) return overflow;
  int best = 0;
  double best_d = a;
  for (int c = 1; c <= max_code + 1; ++c) {
    const double v = c <= max_code ? defined_value(static_cast<uint8_t>(c), e4) : beyond;
    const double d = std::fabs(v - a);
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best = c;
      best_d = d;
    }
  }
  return best > max_code ? overflow : sign | best;
}

TEST(Fp8Codes, EncoderAgreesWithNearestValueSearch) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<int> exps(127 - 20, 127 + 17);  // 2^-20 .. 2^17: every place of both formats
  int checked = 0;
  for (int i = 0; i < 60000; ++i) {
    uint32_t u = any(rng);
    if (i % 4 != 0) u = (u & 0x807fffffu) | (static_cast<uint32_t>(exps(rng)) << 23);
    float x;
    std::memcpy(&x, &u, 4);
    if (std::isnan(x)) continue;
    for (bool e4 : {kE4, kE5})
      for (bool sat : {true, false}) {
        ASSERT_EQ(enc(x, e4, sat), searched_code(x, e4, sat))
            << (e4 ? "e4m3" : "e5m2") << (sat ? " saturating" : "") << " x = " << x << " (bits " << std::hex << bits(x)
            << ")";
        ++checked;
      }
  }
  EXPECT_GT(checked, 200000);
}

TEST(Fp8Recipe, NamesDefaultsAndChecks) {
  EXPECT_EQ(parse_fp8_format("E4M3"), Fp8Format::e4m3);
  EXPECT_EQ(parse_fp8_format("e5m2"), Fp8Format::e5m2);
  EXPECT_STREQ(fp8_format_name(Fp8Format::e5m2), "e5m2");
  EXPECT_THROW(parse_fp8_format("e3m4"), Error);
  const Fp8Recipe r;
  EXPECT_EQ(r.scaling, Fp8Scaling::current);
  EXPECT_EQ(r.forward_format, Fp8Format::e4m3);
  EXPECT_EQ(r.backward_format, Fp8Format::e5m2);
  EXPECT_EQ(r.history_rows(), 1);
  EXPECT_EQ(Fp8Recipe::delayed(16).history_rows(), 16);
  Fp8Recipe bad = Fp8Recipe::delayed(0);
  EXPECT_THROW(bad.validate(), Error);
  EXPECT_THROW(Fp8Recipe::current(-1).validate(), Error);
  EXPECT_THROW(Fp8Recipe::current(65).validate(), Error);
  EXPECT_NO_THROW(Fp8Recipe::current(64).validate());
  EXPECT_THROW(Fp8ScaleState(bad, Fp8Format::e4m3, 1, Device::cpu()), Error);
  EXPECT_THROW(Fp8ScaleState(Fp8Recipe(), Fp8Format::e4m3, 0, Device::cpu()), Error);
}

// ---- the scale update on the CPU

// history[row][slot] of a CPU state, written and read directly.
void set_history(const Fp8ScaleState& s, const std::vector<std::vector<float>>& rows) {
  float* h = s.amax_history().data<float>();
  ASSERT_EQ(static_cast<int64_t>(rows.size()), s.amax_history().size(0));
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t i = 0; i < rows[r].size(); ++i) h[r * s.count() + i] = rows[r][i];
}

std::vector<float> history_column(const Fp8ScaleState& s, int64_t slot) {
  std::vector<float> out;
  const float* h = s.amax_history().data<float>();
  for (int64_t r = 0; r < s.amax_history().size(0); ++r) out.push_back(h[r * s.count() + slot]);
  return out;
}

float at(const Tensor& t, int64_t i) { return t.data<float>()[i]; }

TEST(Fp8ScaleUpdate, DelayedMaxOverHistory) {
  Fp8ScaleState s(Fp8Recipe::delayed(4), Fp8Format::e4m3, 2, Device::cpu());
  set_history(s, {{3.5f, 0.5f}, {7.0f, 0.0f}, {1.0f, 0.0f}, {0.0f, 0.25f}});
  Tensor verdict = Tensor::zeros({1});
  s.update(verdict);
  EXPECT_EQ(at(s.scale(), 0), 64.0f);  // 448 / 7
  EXPECT_EQ(at(s.scale_inv(), 0), 1.0f / 64.0f);
  EXPECT_EQ(at(s.scale(), 1), 896.0f);  // 448 / 0.5
  EXPECT_EQ(at(s.scale_inv(), 1), 1.0f / 896.0f);
  // The history moved down a row (the oldest left) and row 0 waits for the next step.
  EXPECT_EQ(history_column(s, 0), (std::vector<float>{0.0f, 3.5f, 7.0f, 1.0f}));
  EXPECT_EQ(history_column(s, 1), (std::vector<float>{0.0f, 0.5f, 0.0f, 0.0f}));
  EXPECT_EQ(at(verdict, 0), 0.0f);
}

TEST(Fp8ScaleUpdate, MostRecentMarginAndFormat) {
  Fp8ScaleState recent(Fp8Recipe::delayed(3, Fp8AmaxCompute::most_recent), Fp8Format::e4m3, 1, Device::cpu());
  set_history(recent, {{3.5f}, {7.0f}, {100.0f}});
  recent.update();
  EXPECT_EQ(at(recent.scale(), 0), 128.0f);  // 448 / 3.5, the older maxima ignored

  Fp8ScaleState margin(Fp8Recipe::delayed(2, Fp8AmaxCompute::max, 2), Fp8Format::e4m3, 1, Device::cpu());
  set_history(margin, {{7.0f}, {0.0f}});
  margin.update();
  EXPECT_EQ(at(margin.scale(), 0), 16.0f);  // 448 / 7 / 2^2

  Fp8ScaleState e5(Fp8Recipe::delayed(1), Fp8Format::e5m2, 1, Device::cpu());
  set_history(e5, {{7.0f}});
  e5.update();
  EXPECT_EQ(at(e5.scale(), 0), 8192.0f);  // 57344 / 7
  EXPECT_EQ(at(e5.scale_inv(), 0), 1.0f / 8192.0f);

  Fp8ScaleState odd(Fp8Recipe::current(), Fp8Format::e4m3, 1, Device::cpu());
  set_history(odd, {{3.0f}});
  odd.update();
  const float want = 448.0f / 3.0f;  // 149.33333: rounded once, as the kernel divides
  EXPECT_EQ(at(odd.scale(), 0), want);
  EXPECT_EQ(at(odd.scale_inv(), 0), 1.0f / want);
}

TEST(Fp8ScaleUpdate, ZeroAmaxKeepsTheScale) {
  Fp8ScaleState s(Fp8Recipe::delayed(2), Fp8Format::e4m3, 1, Device::cpu());
  s.scale().data<float>()[0] = 5.0f;
  s.scale_inv().data<float>()[0] = 0.2f;
  Tensor verdict = Tensor::zeros({1});
  s.update(verdict);  // all zero
  EXPECT_EQ(at(s.scale(), 0), 5.0f);
  EXPECT_EQ(at(s.scale_inv(), 0), 0.2f);
  EXPECT_EQ(at(verdict, 0), 0.0f) << "a zero maximum is not a failure";
}

TEST(Fp8ScaleUpdate, NonFiniteAmaxSkipsTheSlotAndMarksTheVerdict) {
  for (float bad : {kInf, kNan}) {
    Fp8ScaleState s(Fp8Recipe::delayed(3), Fp8Format::e4m3, 2, Device::cpu());
    s.scale().data<float>()[0] = 5.0f;
    s.scale_inv().data<float>()[0] = 0.2f;
    set_history(s, {{bad, 14.0f}, {2.0f, 0.0f}, {1.0f, 0.0f}});
    Tensor verdict = Tensor::zeros({1});
    s.update(verdict);
    EXPECT_EQ(at(s.scale(), 0), 5.0f) << bad;
    EXPECT_EQ(at(s.scale_inv(), 0), 0.2f) << bad;
    // The bad entry is dropped, the older ones stay where they were (the step did not happen).
    EXPECT_EQ(history_column(s, 0), (std::vector<float>{0.0f, 2.0f, 1.0f})) << bad;
    EXPECT_TRUE(std::isnan(at(verdict, 0))) << bad;
    // The other slot updates as usual.
    EXPECT_EQ(at(s.scale(), 1), 32.0f);
    EXPECT_EQ(history_column(s, 1), (std::vector<float>{0.0f, 14.0f, 0.0f}));
    // The next clean update leaves a non-finite verdict as it is, and uses the history that was kept.
    set_history(s, {{0.5f, 1.0f}, {2.0f, 14.0f}, {1.0f, 0.0f}});
    s.update(verdict);
    EXPECT_EQ(at(s.scale(), 0), 224.0f);  // 448 / 2
    EXPECT_TRUE(std::isnan(at(verdict, 0)));
  }
}

TEST(Fp8ScaleUpdate, TinyAmaxGivesTheLargestFiniteScale) {
  Fp8ScaleState s(Fp8Recipe::current(), Fp8Format::e4m3, 1, Device::cpu());
  set_history(s, {{1.0e-38f}});  // 448 / 1e-38 overflows f32
  s.update();
  EXPECT_EQ(at(s.scale(), 0), FLT_MAX);
  EXPECT_EQ(at(s.scale_inv(), 0), 1.0f / FLT_MAX);
}

// Recorded steps' bookkeeping without a GPU: steps that each record a maximum, then update; the scale follows
// 448 / (the largest of the last H maxima); a non-finite step is skipped by the update and reported.
TEST(Fp8ScaleUpdate, DelayedScalingOverSteps) {
  const int64_t H = 3;
  Fp8ScaleState s(Fp8Recipe::delayed(H), Fp8Format::e4m3, 1, Device::cpu());
  const std::vector<float> maxima = {2.0f, 7.0f, 1.0f, 0.5f, kNan, 3.5f, 0.25f, 0.125f};
  std::vector<float> kept;  // the maxima of steps that counted
  Tensor verdict = Tensor::zeros({1});
  float expected_scale = 1.0f;
  for (float m : maxima) {
    verdict.data<float>()[0] = 0.0f;
    Tensor amax = s.amax(0);
    fp8_amax(Tensor::from_vector(std::vector<float>{m, -m / 2, 0.0f}, {3}), amax);
    s.update(verdict);
    if (std::isnan(m)) {
      EXPECT_TRUE(std::isnan(at(verdict, 0)));
    } else {
      EXPECT_EQ(at(verdict, 0), 0.0f);
      kept.push_back(m);
      float window = 0.0f;
      for (size_t j = kept.size() > static_cast<size_t>(H) ? kept.size() - H : 0; j < kept.size(); ++j)
        window = std::max(window, kept[j]);
      expected_scale = 448.0f / window;
    }
    EXPECT_EQ(at(s.scale(), 0), expected_scale) << "after the step of maximum " << m;
  }
}

}  // namespace
}  // namespace tandem
