// GEMM against a naive double-precision product, for every transpose combination.
#include <limits>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

struct GemmCase {
  int64_t m, n, k;
};

// c = alpha * op(a) op(b) + beta * c, row-major, in double.
std::vector<double> ref_gemm(bool ta, bool tb, const GemmCase& g, double alpha, const std::vector<double>& a,
                             const std::vector<double>& b, double beta, const std::vector<double>& c) {
  std::vector<double> out(g.m * g.n);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double av = ta ? a[p * g.m + i] : a[i * g.k + p], bv = tb ? b[j * g.k + p] : b[p * g.n + j];
        s += av * bv;
      }
      out[i * g.n + j] = alpha * s + (beta == 0 ? 0 : beta * c[i * g.n + j]);
    }
  return out;
}

void run_case(DType dt, bool ta, bool tb, const GemmCase& g, double alpha, double beta, Generator& gen) {
  Tensor a = rand_tensor(ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, dt, gen);
  Tensor b = rand_tensor(tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, dt, gen);
  Tensor c = rand_tensor({g.m, g.n}, dt, gen);
  auto want = ref_gemm(ta, tb, g, alpha, values(a), values(b), beta, values(c));
  cpu().gemm(ta, tb, g.m, g.n, g.k, alpha, a, b, beta, c);
  expect_close(c, want, tol_for(dt, 1 + g.k / 50.0),
               std::string("gemm ") + dtype_name(dt) + (ta ? " T" : " N") + (tb ? "T " : "N ") + std::to_string(g.m) +
                   "x" + std::to_string(g.n) + "x" + std::to_string(g.k));
}

TEST(CpuGemm, AllTransposesOddSizes) {
  Generator gen(11);
  for (DType dt : float_types())
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (GemmCase g : {GemmCase{1, 1, 1}, GemmCase{3, 5, 7}, GemmCase{17, 1, 9}, GemmCase{1, 33, 4},
                           GemmCase{31, 29, 37}})
          run_case(dt, ta, tb, g, 1.0, 0.0, gen);
}

TEST(CpuGemm, AlphaAndBeta) {
  Generator gen(12);
  for (DType dt : float_types()) {
    run_case(dt, false, false, {9, 10, 11}, 0.5, 1.0, gen);
    run_case(dt, true, true, {9, 10, 11}, -2.0, 0.25, gen);
  }
}

TEST(CpuGemm, BetaZeroIgnoresGarbageInC) {
  Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({3, 2});
  Tensor c = Tensor::full({2, 2}, std::numeric_limits<double>::quiet_NaN());
  cpu().gemm(false, false, 2, 2, 3, 1.0, a, b, 0.0, c);
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{3, 3, 3, 3}));
}

TEST(CpuGemm, EmptyInnerDimensionScalesC) {
  Tensor a = Tensor::empty({4, 0}), b = Tensor::empty({0, 3});
  Tensor c = Tensor::full({4, 3}, 2.0);
  cpu().gemm(false, false, 4, 3, 0, 1.0, a, b, 0.5, c);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(12, 1.0f));
  cpu().gemm(false, false, 4, 3, 0, 1.0, a, b, 0.0, c);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(12, 0.0f));
}

// Large enough to be split across threads, by rows (m > n) and by columns (n >= m).
TEST(CpuGemm, SplitAcrossThreads) {
  ThreadScope two(2);
  Generator gen(13);
  for (DType dt : float_types())
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        run_case(dt, ta, tb, {301, 97, 150}, 1.0, 0.0, gen);
        run_case(dt, ta, tb, {64, 500, 190}, 1.0, 0.5, gen);
      }
}

}  // namespace
}  // namespace tandem::testing
