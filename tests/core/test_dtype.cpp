// Element types and the 16-bit float formats: exact values, round-to-nearest-even, subnormals,
// overflow and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "tandem/dtype.h"
#include "tandem/error.h"

namespace tandem {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t half_bits(float f) { return Half(f).bits; }
float half_value(uint16_t bits) {
  Half h;
  h.bits = bits;
  return static_cast<float>(h);
}
uint16_t bf16_bits(float f) { return BFloat16(f).bits; }

TEST(Dtype, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("int64"), DType::i64);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i32));
  try {
    parse_dtype("float8");
    FAIL() << "unknown dtype accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float8"), std::string::npos);
  }
}

TEST(Half, ExactValues) {
  EXPECT_EQ(half_bits(0.0f), 0x0000);
  EXPECT_EQ(half_bits(-0.0f), 0x8000);
  EXPECT_EQ(half_bits(1.0f), 0x3C00);
  EXPECT_EQ(half_bits(-2.0f), 0xC000);
  EXPECT_EQ(half_bits(0.5f), 0x3800);
  EXPECT_EQ(half_bits(65504.0f), 0x7BFF);           // largest finite half
  EXPECT_EQ(half_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(half_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(half_value(0x3555), 0.333251953125f);
  EXPECT_EQ(half_value(0xFBFF), -65504.0f);
}

TEST(Half, RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -10);  // spacing of halves in [1, 2)
  EXPECT_EQ(half_bits(1.0f + ulp / 2), 0x3C00);             // tie: down to the even 1.0
  EXPECT_EQ(half_bits(1.0f + 3 * ulp / 2), 0x3C02);         // tie: up to the even 1 + 2 ulp
  EXPECT_EQ(half_bits(1.0f + ulp / 2 + ulp / 64), 0x3C01);  // just past the tie: up
  EXPECT_EQ(half_bits(1.0f + ulp / 2 - ulp / 64), 0x3C00);  // just below: down
  EXPECT_EQ(half_bits(2047.0f + 0.5f), 0x67FF + 1);        // 2047.5 ties to 2048 (even)
  // A tie that carries into the exponent: the largest value below 2 rounds up to 2.
  EXPECT_EQ(half_bits(2.0f - ulp / 2), 0x4000);
}

TEST(Half, Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);
  EXPECT_EQ(half_bits(3 * tiny), 0x0003);
  EXPECT_EQ(half_bits(1023 * tiny), 0x03FF);              // largest subnormal
  EXPECT_EQ(half_bits(tiny / 2), 0x0000);                 // tie between 0 and the smallest: even is 0
  EXPECT_EQ(half_bits(tiny / 2 * 1.0001f), 0x0001);       // past the tie
  EXPECT_EQ(half_bits(3 * tiny / 2), 0x0002);             // tie between 1 and 2 units: even is 2
  EXPECT_EQ(half_bits(5 * tiny / 2), 0x0002);             // tie between 2 and 3 units: even is 2
  EXPECT_EQ(half_bits(-tiny), 0x8001);
  EXPECT_EQ(half_bits(std::ldexp(1.0f, -30)), 0x0000);    // underflows to zero
  EXPECT_EQ(half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  for (uint16_t b = 1; b < 0x0400; ++b) EXPECT_EQ(half_value(b), b * tiny) << b;
}

TEST(Half, OverflowToInfinity) {
  EXPECT_EQ(half_bits(65519.0f), 0x7BFF);  // below the midpoint to 65536: the largest finite
  EXPECT_EQ(half_bits(65520.0f), 0x7C00);  // the midpoint ties to the even "65536": infinity
  EXPECT_EQ(half_bits(1e10f), 0x7C00);
  EXPECT_EQ(half_bits(-1e10f), 0xFC00);
  EXPECT_EQ(half_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isinf(half_value(0x7C00)));
  EXPECT_LT(half_value(0xFC00), 0.0f);
}

TEST(Half, NaN) {
  const uint16_t b = half_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(b & 0x7C00, 0x7C00);
  EXPECT_NE(b & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(half_value(b)));
  EXPECT_TRUE(std::isnan(half_value(0x7C01)));  // a signalling pattern still reads as NaN
  EXPECT_TRUE(std::isnan(half_value(0xFE00)));
  // A NaN whose payload sits only in the low float bits must not turn into infinity.
  EXPECT_TRUE(std::isnan(half_value(half_bits(from_bits(0x7F800001u)))));
}

TEST(Half, EveryHalfSurvivesARoundTripThroughFloat) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = half_value(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(half_bits(f), b) << std::hex << b;
  }
}

TEST(BFloat16, ExactValuesAndRounding) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
  const float ulp = std::ldexp(1.0f, -7);            // spacing in [1, 2)
  EXPECT_EQ(bf16_bits(1.0f + ulp / 2), 0x3F80);      // tie: down to even
  EXPECT_EQ(bf16_bits(1.0f + 3 * ulp / 2), 0x3F82);  // tie: up to even
  EXPECT_EQ(bf16_bits(1.0f + ulp / 2 + ulp / 256), 0x3F81);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest: infinity
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  // Subnormal floats keep their leading bits.
  EXPECT_EQ(bf16_bits(from_bits(0x00010000u)), 0x0001);
  EXPECT_EQ(bf16_bits(from_bits(0x00018000u)), 0x0002);  // tie: up to even
}

TEST(BFloat16, NaN) {
  const uint16_t b = bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(b & 0x7F80, 0x7F80);
  // Low payload bits only: rounding must not carry the NaN into infinity.
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(from_bits(0xFFFFFFFFu)))));
}

}  // namespace
}  // namespace tandem
