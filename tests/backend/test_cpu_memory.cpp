// Strided copies and conversions between every pair of dtypes, fills, random fills and dropout masks.
#include <cmath>

#include "core/counter_rng.h"
#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

const DType kAllTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};

// Small integers: exact in every dtype, so every conversion must reproduce them.
std::vector<double> small_ints(int64_t n) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37) % 101);
  return v;
}

TEST(CpuCopy, EveryPairOfDtypesContiguous) {
  const auto src_vals = small_ints(24);
  for (DType from : kAllTypes)
    for (DType to : kAllTypes) {
      Tensor src = Tensor::from_vector(src_vals, {4, 6}).to(from);
      Tensor dst = Tensor::empty({4, 6}, to);
      cpu().copy_strided(src, dst);
      expect_close(dst, src_vals, Tol{0, 0}, std::string(dtype_name(from)) + " -> " + dtype_name(to));
    }
}

TEST(CpuCopy, EveryPairOfDtypesFromTransposedAndNarrowedSources) {
  const auto base = small_ints(5 * 7 * 3);
  for (DType from : kAllTypes)
    for (DType to : kAllTypes) {
      Tensor src = Tensor::from_vector(base, {5, 7, 3}).to(from);
      const std::string what = std::string(dtype_name(from)) + " -> " + dtype_name(to);

      Tensor t = src.transpose(0, 2);  // [3, 7, 5]
      ASSERT_FALSE(t.is_contiguous());
      Tensor dt = Tensor::empty({3, 7, 5}, to);
      cpu().copy_strided(t, dt);
      std::vector<double> want_t(base.size());
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 7; ++j)
          for (int64_t k = 0; k < 5; ++k) want_t[(i * 7 + j) * 5 + k] = base[(k * 7 + j) * 3 + i];
      expect_close(dt, want_t, Tol{0, 0}, "transposed " + what);

      Tensor nr = src.narrow(1, 2, 4).narrow(2, 1, 2);  // [5, 4, 2] at an offset
      ASSERT_FALSE(nr.is_contiguous());
      Tensor dn = Tensor::empty({5, 4, 2}, to);
      cpu().copy_strided(nr, dn);
      std::vector<double> want_n;
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 2; j < 6; ++j)
          for (int64_t k = 1; k < 3; ++k) want_n.push_back(base[(i * 7 + j) * 3 + k]);
      expect_close(dn, want_n, Tol{0, 0}, "narrowed " + what);
    }
}

TEST(CpuCopy, ConversionsRoundAndTruncate) {
  Tensor src = Tensor::from_vector<double>({1.75, -2.5, 3.0000001, 65519.0, 1.0 / 3.0}, {5});
  Tensor i32 = Tensor::empty({5}, DType::i32), f16 = Tensor::empty({5}, DType::f16),
         bf = Tensor::empty({5}, DType::bf16);
  cpu().copy_strided(src, i32);
  EXPECT_EQ(i32.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 65519, 0}));  // toward zero
  cpu().copy_strided(src, f16);
  auto h = f16.to_vector<float>();
  EXPECT_EQ(h[0], 1.75f);
  EXPECT_EQ(h[2], 3.0f);
  EXPECT_EQ(h[3], 65504.0f);  // the largest half below the rounding threshold
  EXPECT_EQ(h[4], static_cast<float>(Half(1.0f / 3.0f)));
  cpu().copy_strided(src, bf);
  EXPECT_EQ(bf.to_vector<float>()[4], static_cast<float>(BFloat16(1.0f / 3.0f)));
}

TEST(CpuCopy, LargeStridedCopyOnSeveralThreads) {
  ThreadScope two(2);
  Generator gen(61);
  Tensor src = rand_tensor({300, 500}, DType::f32, gen);
  Tensor t = src.transpose(0, 1);
  Tensor dst = Tensor::empty({500, 300}, DType::f64);
  cpu().copy_strided(t, dst);
  auto s = values(src), d = values(dst);
  for (int64_t i = 0; i < 500; ++i)
    for (int64_t j = 0; j < 300; ++j) ASSERT_EQ(d[i * 300 + j], s[j * 500 + i]) << i << "," << j;
}

TEST(CpuFill, EveryDtype) {
  for (DType dt : kAllTypes) {
    Tensor t = Tensor::empty({70000}, dt);
    cpu().fill(t, 7.0);
    auto v = values(t);
    EXPECT_EQ(v.front(), 7.0) << dtype_name(dt);
    EXPECT_EQ(v.back(), 7.0) << dtype_name(dt);
  }
}

TEST(CpuRandom, UniformAndNormalUseTheirCounters) {
  for (DType dt : float_types()) {
    Tensor u = Tensor::empty({1000}, dt), nrm = Tensor::empty({1000}, dt);
    cpu().random_uniform(u, 9, 100, -2.0, 3.0);
    cpu().random_normal(nrm, 9, 100, 1.0, 0.5);
    auto vu = values(u), vn = values(nrm);
    const Tol tol = dt == DType::f64 ? Tol{1e-15, 1e-15} : Tol{1e-7, 1e-7};
    for (int i = 0; i < 1000; i += 97) {
      EXPECT_NEAR(vu[i], -2.0 + 5.0 * rng::uniform(9, 100 + i), tol.atol + 3 * tol.rtol);
      EXPECT_NEAR(vn[i], 1.0 + 0.5 * rng::normal(9, 100 + i), tol.atol + 3 * tol.rtol);
    }
    double mean = 0;
    for (double x : vu) {
      EXPECT_GE(x, -2.0);
      EXPECT_LT(x, 3.0);
      mean += x / 1000;
    }
    EXPECT_NEAR(mean, 0.5, 0.2);
  }
}

TEST(CpuRandom, DropoutMaskKeepsAboutOneMinusP) {
  Tensor mask = Tensor::empty({100000});
  cpu().dropout_mask(mask, 3, 0, 0.25);
  auto v = mask.to_vector<float>();
  int64_t kept = 0;
  for (float x : v) {
    ASSERT_TRUE(x == 0.0f || std::abs(x - 1.0f / 0.75f) < 1e-6f) << x;
    kept += x != 0.0f;
  }
  EXPECT_NEAR(kept / 100000.0, 0.75, 0.01);
}

}  // namespace
}  // namespace tandem::testing
