// The CPU backend's FP8 kernels: the scaled cast (codes against values worked out by hand, then against the
// codec element by element), the maximum (NaN and infinity, parallel ranges), the decode, the transposed cast
// against the transpose of the cast, and the cast's error bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "core/fp8.h"
#include "tandem/fp8.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

namespace tandem {
namespace {

backend::Backend& cpu() { return backend::cpu_backend(); }
const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

Tensor scalar(float v) { return Tensor::from_vector(std::vector<float>{v}, {1}); }

std::vector<uint8_t> codes(const Tensor& q) {
  std::vector<uint8_t> out(static_cast<size_t>(q.numel()));
  if (!out.empty()) std::memcpy(out.data(), q.data_ptr(), out.size());
  return out;
}

std::vector<uint8_t> quantize(const Tensor& x, float scale, Fp8Format f, Tensor amax = Tensor()) {
  Tensor q = Tensor::empty(x.shape(), DType::u8);
  cpu().fp8_quantize(x, scalar(scale), f, q, amax);
  return codes(q);
}

TEST(CpuFp8, QuantizeKnownValues) {
  const std::vector<float> x = {1.0f, -2.0f, 0.3f, 1000.0f, -kInf, kNan, 0.0f, -0.0f, 0.0009f};
  // times 2: 2 (0x40), -4 (0xc8), 0.6 -> 0.625 (0x32), 2000 -> 448 (0x7e), -inf -> -448 (0xfe), NaN (0x7f),
  // +0, -0, 0.0018 -> 1 unit of 2^-9 = 0.00195 (0x01).
  EXPECT_EQ(quantize(Tensor::from_vector(x, {9}), 2.0f, Fp8Format::e4m3),
            (std::vector<uint8_t>{0x40, 0xc8, 0x32, 0x7e, 0xfe, 0x7f, 0x00, 0x80, 0x01}));
  // e5m2: 2 (0x40), -4 (0xc4), 0.6 -> 0.625 (0x39), 2000 -> 2048 (0x68), -inf -> -57344 (0xfb), NaN, +0, -0,
  // 0.0018 -> 1.75 * 2^-10 = 0.00170898 (0x17; 2^-9 is farther).
  EXPECT_EQ(quantize(Tensor::from_vector(x, {9}), 2.0f, Fp8Format::e5m2),
            (std::vector<uint8_t>{0x40, 0xc4, 0x39, 0x68, 0xfb, 0x7f, 0x00, 0x80, 0x17}));
}

TEST(CpuFp8, QuantizeMatchesTheCodecForEveryInputType) {
  Generator gen(7);
  Tensor x = Tensor::normal({4099}, 0.0, 30.0, gen);
  float* p = x.data<float>();
  p[0] = kNan, p[1] = kInf, p[2] = -kInf, p[3] = 1e-7f, p[4] = -0.0f, p[5] = 5000.0f;
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Tensor xd = x.to(dt);
      const std::vector<float> v = xd.to(DType::f32).to_vector<float>();
      const float s = 3.0f;
      Tensor amax = scalar(0.0f);
      const std::vector<uint8_t> q = quantize(xd, s, f, amax);
      int bad = 0;
      for (size_t i = 0; i < v.size(); ++i)
        if (q[i] != fp8::encode(v[i] * s, f, true) && bad++ < 5) ADD_FAILURE() << "element " << i << " " << v[i];
      EXPECT_EQ(bad, 0) << dtype_name(dt) << " " << fp8_format_name(f);
      EXPECT_TRUE(std::isnan(amax.item<float>())) << "a NaN element makes the maximum NaN";
      // Without the NaN: the infinity.
      Tensor y = xd.clone();
      y.narrow(0, 0, 1).fill_(0.0);
      Tensor amax2 = scalar(0.0f);
      quantize(y, s, f, amax2);
      EXPECT_EQ(amax2.item<float>(), kInf);
    }
  }
}

TEST(CpuFp8, AmaxTakesTheLargestMagnitudeAndAccumulates) {
  Generator gen(11);
  Tensor x = Tensor::uniform({300001}, -2.0, 2.0, gen);  // several parallel ranges
  x.data<float>()[123457] = -9.5f;
  Tensor amax = scalar(0.0f);
  cpu().fp8_amax(x, amax);
  EXPECT_EQ(amax.item<float>(), 9.5f);
  // max(amax, max |x|): a larger value already there stays; a smaller one is replaced.
  Tensor big = scalar(20.0f);
  cpu().fp8_amax(x, big);
  EXPECT_EQ(big.item<float>(), 20.0f);
  Tensor bf = x.to(DType::bf16);
  Tensor amax_bf = scalar(1.0f);
  cpu().fp8_amax(bf, amax_bf);
  EXPECT_EQ(amax_bf.item<float>(), 9.5f);
  // Infinity, then NaN anywhere (also past an infinity) wins; -0 counts as 0.
  x.data<float>()[7] = -kInf;
  Tensor a1 = scalar(0.0f);
  cpu().fp8_amax(x, a1);
  EXPECT_EQ(a1.item<float>(), kInf);
  x.data<float>()[299999] = -kNan;
  Tensor a2 = scalar(0.0f);
  cpu().fp8_amax(x, a2);
  EXPECT_TRUE(std::isnan(a2.item<float>()));
  Tensor z = Tensor::from_vector(std::vector<float>{-0.0f, 0.0f}, {2});
  Tensor a3 = scalar(0.0f);
  cpu().fp8_amax(z, a3);
  EXPECT_EQ(a3.item<float>(), 0.0f);
  EXPECT_FALSE(std::signbit(a3.item<float>()));
}

TEST(CpuFp8, DequantizeEveryCode) {
  std::vector<uint8_t> all(256);
  for (int c = 0; c < 256; ++c) all[c] = static_cast<uint8_t>(c);
  Tensor q = Tensor::from_data(all.data(), {256}, DType::u8);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Tensor y = Tensor::empty({256}, dt);
      cpu().fp8_dequantize(q, scalar(0.25f), f, y);
      const std::vector<float> v = y.to(DType::f32).to_vector<float>();
      for (int c = 0; c < 256; ++c) {
        const float want = fp8::decode(static_cast<uint8_t>(c), f) * 0.25f;  // exact: a power of two
        if (std::isnan(want))
          EXPECT_TRUE(std::isnan(v[c])) << c;
        else
          EXPECT_EQ(v[c], want) << fp8_format_name(f) << " " << dtype_name(dt) << " code " << c;
      }
    }
  }
}

TEST(CpuFp8, TransposedCastIsTheTransposeOfTheCast) {
  Generator gen(3);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 53}, {64, 32}, {1, 70}, {70, 1}}) {
    Tensor x = Tensor::normal({rows, cols}, 0.0, 4.0, gen);
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const float s = 17.0f;
      const std::vector<uint8_t> q = quantize(x, s, f);
      Tensor q2 = Tensor::empty({rows, cols}, DType::u8), qt = Tensor::empty({cols, rows}, DType::u8);
      Tensor amax = scalar(0.0f), amax_ref = scalar(0.0f);
      cpu().fp8_quantize_transposed(x, scalar(s), f, rows, cols, q2, qt, amax);
      cpu().fp8_amax(x, amax_ref);
      EXPECT_EQ(codes(q2), q);
      const std::vector<uint8_t> t = codes(qt);
      int bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) bad += t[c * rows + r] != q[r * cols + c];
      EXPECT_EQ(bad, 0) << rows << "x" << cols;
      EXPECT_EQ(amax.item<float>(), amax_ref.item<float>());
      // Only the transposed codes.
      Tensor none, qt2 = Tensor::empty({cols, rows}, DType::u8), no_amax;
      cpu().fp8_quantize_transposed(x, scalar(s), f, rows, cols, none, qt2, no_amax);
      EXPECT_EQ(codes(qt2), t);
    }
  }
}

// A scaled round trip is within the format's relative error (2^-4 for e4m3, 2^-3 for e5m2) for values in its
// normal range, and within half the smallest subnormal below it.
TEST(CpuFp8, RoundTripErrorBound) {
  Generator gen(5);
  Tensor x = Tensor::normal({20000}, 0.0, 1.0, gen);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    Tensor amax = scalar(0.0f);
    cpu().fp8_amax(x, amax);
    const float s = fp8_max(f) / amax.item<float>();
    Tensor q = Tensor::empty({20000}, DType::u8), y = Tensor::empty({20000});
    Tensor none;
    cpu().fp8_quantize(x, scalar(s), f, q, none);
    cpu().fp8_dequantize(q, scalar(1.0f / s), f, y);
    const double rel = f == Fp8Format::e4m3 ? 0.0625 : 0.125;
    const double sub = (f == Fp8Format::e4m3 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17)) / s;
    const std::vector<float> a = x.to_vector<float>(), b = y.to_vector<float>();
    double worst = 0.0;
    int exact = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double err = std::fabs(double(a[i]) - double(b[i]));
      const double bound = rel * std::fabs(double(a[i])) + sub + 1e-6 * std::fabs(double(a[i]));
      ASSERT_LE(err, bound) << fp8_format_name(f) << " element " << i << ": " << a[i] << " -> " << b[i];
      worst = std::max(worst, err / std::max(std::fabs(double(a[i])), 1e-30));
      exact += err == 0.0;
    }
    // The bound is close to what happens: the worst relative error is above half of it.
    EXPECT_GT(worst, rel / 2) << fp8_format_name(f);
    EXPECT_LT(exact, 20000 / 10);
  }
}

TEST(CpuFp8, ScaleUpdateKernelChecksItsOperands) {
  Tensor h = Tensor::zeros({2, 3}), s = Tensor::ones({2}), si = Tensor::ones({3}), v;
  EXPECT_THROW(cpu().fp8_scale_update(h, s, si, 448.0f, 1.0f, true, v), Error);
  Tensor q = Tensor::empty({3}, DType::u8), none;
  EXPECT_THROW(cpu().fp8_quantize(Tensor::zeros({4}), scalar(1.0f), Fp8Format::e4m3, q, none), Error);
  Tensor q4 = Tensor::empty({4}, DType::u8);
  EXPECT_THROW(cpu().fp8_quantize(Tensor::zeros({4}, DType::i32), scalar(1.0f), Fp8Format::e4m3, q4, none), Error);
}

}  // namespace
}  // namespace tandem
