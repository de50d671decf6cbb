// tandem's own f32 product (backend/cpu/cpu_sgemm.h) against a product in double: every transpose, edges that
// are not multiples of its 6 x 16 tiles, depths past one block, leading dimensions wider than the rows, the
// fused epilogues, the triangles of causal attention, thread counts; the vectorised GELU against the scalar
// formula; and the backend's gemm_fused against the default composition.
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_sgemm.h"
#include "backend/elementwise_functors.h"
#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

namespace own = backend::cpu;
using Epi = own::SgemmEpilogue;

struct Dims {
  int64_t m, n, k;
};

std::vector<float> random_floats(int64_t n, Generator& gen) {
  return Tensor::uniform({n}, -1, 1, gen).to_vector<float>();
}

// op(A)(i, p) and op(B)(p, j) of row-major storage with leading dimensions lda, ldb.
double a_at(const std::vector<float>& a, bool ta, int64_t lda, int64_t i, int64_t p) {
  return ta ? a[static_cast<size_t>(p * lda + i)] : a[static_cast<size_t>(i * lda + p)];
}
double b_at(const std::vector<float>& b, bool tb, int64_t ldb, int64_t p, int64_t j) {
  return tb ? b[static_cast<size_t>(j * ldb + p)] : b[static_cast<size_t>(p * ldb + j)];
}

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}

// One product through sgemm against double arithmetic; C (and aux) rows ldc apart, the columns past n left
// as they were (checked).
void check(bool ta, bool tb, Dims d, float alpha, float beta, Epi::Kind kind, bool addend, int threads, int64_t pad,
           Generator& gen) {
  const int64_t lda = (ta ? d.m : d.k) + pad, ldb = (tb ? d.k : d.n) + pad, ldc = d.n + pad;
  const std::vector<float> a = random_floats((ta ? d.k : d.m) * lda, gen), b = random_floats((tb ? d.n : d.k) * ldb, gen);
  std::vector<float> c = random_floats(d.m * ldc, gen), aux = random_floats(d.m * ldc, gen);
  const std::vector<float> bias = random_floats(d.n, gen), add = random_floats(d.m * ldc, gen);
  const std::vector<float> c0 = c, aux0 = aux;
  Epi e;
  e.kind = kind;
  e.bias = bias.data();
  e.aux = aux.data();
  e.ld_aux = ldc;
  if (addend) {
    e.addend = add.data();
    e.ld_addend = ldc;
  }
  own::sgemm(ta, tb, d.m, d.n, d.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, e, threads);
  const std::string what = std::string("sgemm ") + (ta ? "T" : "N") + (tb ? "T " : "N ") + std::to_string(d.m) + "x" +
                           std::to_string(d.n) + "x" + std::to_string(d.k) + " kind " + std::to_string(int(kind)) +
                           (addend ? " +addend" : "") + " threads " + std::to_string(threads);
  const double tol = 2e-5 * (1.0 + static_cast<double>(d.k) / 16.0);
  for (int64_t i = 0; i < d.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= d.n) {  // outside the product: untouched
        ASSERT_EQ(c[at], c0[at]) << what << " wrote past column " << d.n;
        ASSERT_EQ(aux[at], aux0[at]) << what << " wrote aux past column " << d.n;
        continue;
      }
      double v = 0.0;
      for (int64_t p = 0; p < d.k; ++p) v += a_at(a, ta, lda, i, p) * b_at(b, tb, ldb, p, j);
      v = alpha * v + (beta == 0.0f ? 0.0 : beta * c0[at]) + (addend ? add[at] : 0.0);
      double want = v;
      switch (kind) {
        case Epi::Kind::None: break;
        case Epi::Kind::Bias: want = v + bias[static_cast<size_t>(j)]; break;
        case Epi::Kind::BiasGelu: {
          const double pre = v + bias[static_cast<size_t>(j)];
          ASSERT_NEAR(aux[at], pre, tol * (1 + std::fabs(pre))) << what << " aux at " << i << ", " << j;
          want = gelu(pre);
          break;
        }
        case Epi::Kind::DGelu: want = v * gelu_grad(aux0[at]); break;
      }
      ASSERT_NEAR(c[at], want, tol * (1 + std::fabs(want))) << what << " at " << i << ", " << j;
    }
  }
}

TEST(CpuSgemm, EveryTransposeAndEdgeAgainstDouble) {
  if (!own::sgemm_available()) GTEST_SKIP() << "no AVX2 + FMA: the backend keeps OpenBLAS";
  Generator gen(21);
  // Edges below, at and past the 6 x 16 tile, rows past one task's 48, depths past one block of 512 (split
  // into equal blocks), one column past a 256-column block.
  for (Dims d : {Dims{1, 1, 1}, Dims{5, 15, 3}, Dims{6, 16, 8}, Dims{7, 17, 9}, Dims{13, 33, 31}, Dims{49, 47, 64},
                 Dims{50, 257, 20}, Dims{20, 40, 1100}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) check(ta, tb, d, 1.0f, 0.0f, Epi::Kind::None, false, 1, 0, gen);
}

TEST(CpuSgemm, AlphaBetaAndWideLeadingDimensions) {
  if (!own::sgemm_available()) GTEST_SKIP() << "no AVX2 + FMA";
  Generator gen(22);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check(ta, tb, {19, 35, 23}, 0.5f, 1.0f, Epi::Kind::None, false, 1, 5, gen);
      check(ta, tb, {12, 32, 600}, -2.0f, 0.25f, Epi::Kind::None, false, 1, 3, gen);
    }
}

TEST(CpuSgemm, BetaZeroIgnoresNaNInC) {
  if (!own::sgemm_available()) GTEST_SKIP() << "no AVX2 + FMA";
  std::vector<float> a(7 * 5, 1.0f), b(5 * 18, 1.0f), c(7 * 18, std::numeric_limits<float>::quiet_NaN());
  own::sgemm(false, false, 7, 18, 5, 1.0f, a.data(), 5, b.data(), 18, 0.0f, c.data(), 18);
  for (float v : c) ASSERT_EQ(v, 5.0f);
}

TEST(CpuSgemm, EmptyDepthStillAppliesTheEpilogue) {
  if (!own::sgemm_available()) GTEST_SKIP() << "no AVX2 + FMA";
  std::vector<float> c(3 * 20, 7.0f), bias(20, 1.5f);
  Epi e;
  e.kind = Epi::Kind::Bias;
  e.bias = bias.data();
  own::sgemm(false, false, 3, 20, 0, 1.0f, nullptr, 1, nullptr, 20, 0.0f, c.data(), 20, e);
  for (float v : c) ASSERT_EQ(v, 1.5f);
}

TEST(CpuSgemm, FusedEpiloguesAgainstDouble) {
  if (!own::sgemm_available()) GTEST_SKIP() << "no AVX2 + FMA";
  Generator gen(23);
  for (Epi::Kind kind : {Epi::Kind::Bias, Epi::Kind::BiasGelu, Epi::Kind::DGelu})
    for (Dims d : {Dims{7, 17, 9}, Dims{50, 70, 40}, Dims{13, 40, 700}})
      for (bool tb : {false, true}) {
        check(false, tb, d, 1.0f, 0.0f, kind, false, 1, 2, gen);
        check(false, tb, d, 1.0f, 0.0f, kind, true, 1, 0, gen);  // a residual added first
      }
  check(false, false, {11, 21, 7}, 1.0f, 0.0f, Epi::Kind::None, true, 1, 1, gen);
}

// Every element is summed in the same order whatever the thread count: the results agree bit for bit.
TEST(CpuSgemm, SameBitsOnOneOrTwoThreads) {
  if (!own::sgemm_available()) GTEST_SKIP() << "no AVX2 + FMA";
  ThreadScope two(2);
  Generator gen(24);
  for (bool ta : {false, true})
    for (Epi::Kind kind : {Epi::Kind::None, Epi::Kind::BiasGelu}) {
      const Dims d{200, 300, 700};
      const int64_t lda = ta ? d.m : d.k;
      const std::vector<float> a = random_floats(d.m * d.k, gen), b = random_floats(d.k * d.n, gen),
                               bias = random_floats(d.n, gen);
      std::vector<float> c1(d.m * d.n), c2(d.m * d.n), x1(d.m * d.n), x2(d.m * d.n);
      Epi e;
      e.kind = kind;
      e.bias = bias.data();
      e.ld_aux = d.n;
      e.aux = x1.data();
      own::sgemm(ta, false, d.m, d.n, d.k, 1.0f, a.data(), lda, b.data(), d.n, 0.0f, c1.data(), d.n, e, 1);
      e.aux = x2.data();
      own::sgemm(ta, false, d.m, d.n, d.k, 1.0f, a.data(), lda, b.data(), d.n, 0.0f, c2.data(), d.n, e, 2);
      EXPECT_EQ(c1, c2) << "ta " << ta;
      if (kind == Epi::Kind::BiasGelu) {
        EXPECT_EQ(x1, x2);
      }
    }
}

// The triangles of causal attention: with op(A) zero past (LowerA) or before (UpperA) the diagonal, skipping
// that part changes nothing; UpperC computes at least every element up to the diagonal (and leaves whole
// tiles past it alone).
TEST(CpuSgemm, TrianglesOfCausalAttention) {
  if (!own::sgemm_available()) GTEST_SKIP() << "no AVX2 + FMA";
  Generator gen(25);
  for (int64_t diag : {0, 5, -7, 40})
    for (Dims d : {Dims{64, 32, 64}, Dims{23, 17, 41}, Dims{70, 64, 70}}) {
      for (Epi::Triangle tri : {Epi::Triangle::LowerA, Epi::Triangle::UpperA})
        for (bool ta : {false, true}) {
          const int64_t lda = ta ? d.m : d.k;
          std::vector<float> a = random_floats(d.m * d.k, gen);
          for (int64_t i = 0; i < d.m; ++i)
            for (int64_t p = 0; p < d.k; ++p) {
              const bool zero = tri == Epi::Triangle::LowerA ? p > i + diag : p < i + diag;
              if (zero) a[static_cast<size_t>(ta ? p * lda + i : i * lda + p)] = 0.0f;
            }
          const std::vector<float> b = random_floats(d.k * d.n, gen);
          std::vector<float> full(d.m * d.n), skipped(d.m * d.n, std::numeric_limits<float>::quiet_NaN());
          own::sgemm(ta, false, d.m, d.n, d.k, 0.5f, a.data(), lda, b.data(), d.n, 0.0f, full.data(), d.n);
          Epi e;
          e.triangle = tri;
          e.diagonal = diag;
          own::sgemm(ta, false, d.m, d.n, d.k, 0.5f, a.data(), lda, b.data(), d.n, 0.0f, skipped.data(), d.n, e);
          EXPECT_EQ(skipped, full) << "triangle " << int(tri) << " diagonal " << diag << " ta " << ta;
        }
      const std::vector<float> a = random_floats(d.m * d.k, gen), b = random_floats(d.k * d.n, gen);
      std::vector<float> full(d.m * d.n), upper(d.m * d.n, std::numeric_limits<float>::quiet_NaN());
      own::sgemm(false, true, d.m, d.n, d.k, 1.0f, a.data(), d.k, b.data(), d.k, 0.0f, full.data(), d.n);
      Epi e;
      e.triangle = Epi::Triangle::UpperC;
      e.diagonal = diag;
      own::sgemm(false, true, d.m, d.n, d.k, 1.0f, a.data(), d.k, b.data(), d.k, 0.0f, upper.data(), d.n, e);
      for (int64_t i = 0; i < d.m; ++i)
        for (int64_t j = 0; j <= std::min(d.n - 1, i + diag); ++j)
          ASSERT_EQ(upper[static_cast<size_t>(i * d.n + j)], full[static_cast<size_t>(i * d.n + j)])
              << "UpperC at " << i << ", " << j << " diagonal " << diag;
    }
}

// The vector GELU against the scalar formula of the elementwise functors, over lengths that are not multiples
// of the 8 lanes, values from the linear region to the saturated ends, infinities and NaN.
TEST(CpuSgemm, VectorGeluMatchesTheScalarFormula) {
  Generator gen(26);
  for (int64_t n : {1, 7, 8, 9, 37}) {
    std::vector<float> x = Tensor::uniform({n}, -12, 12, gen).to_vector<float>(), g = random_floats(n, gen);
    x[0] = n > 3 ? 1e-7f : x[0];
    if (n >= 8) {
      x[1] = std::numeric_limits<float>::infinity();
      x[2] = -std::numeric_limits<float>::infinity();
      x[3] = std::numeric_limits<float>::quiet_NaN();
      x[4] = 0.0f;
      x[5] = -3.0f;
    }
    std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    own::gelu_tanh_f32(x.data(), y.data(), n);
    own::gelu_tanh_backward_f32(g.data(), x.data(), dx.data(), n);
    const backend::ewf::GeluTanhF<float> f{};
    for (int64_t i = 0; i < n; ++i) {
      const float want = f(x[static_cast<size_t>(i)]), want_dx = backend::ewf::gelu_tanh_grad_(g[i], x[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(y[static_cast<size_t>(i)])) << "gelu(" << x[i] << ")";
      } else if (std::isinf(want)) {
        EXPECT_EQ(y[i], want) << "gelu(" << x[i] << ")";
      } else {
        EXPECT_NEAR(y[i], want, 1e-6 * (1 + std::fabs(want))) << "gelu(" << x[i] << ")";
      }
      if (std::isnan(want_dx)) {
        EXPECT_TRUE(std::isnan(dx[static_cast<size_t>(i)])) << "gelu'(" << x[i] << ")";
      } else if (std::isinf(want_dx)) {
        EXPECT_EQ(dx[i], want_dx) << "gelu'(" << x[i] << ")";
      } else {
        EXPECT_NEAR(dx[i], want_dx, 1e-6 * (1 + std::fabs(want_dx))) << "gelu'(" << x[i] << ")";
      }
    }
  }
}

// The backend's fused product (the own kernel, epilogues fused) against the default composition (gemm, then
// the bias, GELU and reduction kernels), f32 and f64.
TEST(CpuSgemm, GemmFusedAgreesWithTheComposition) {
  using backend::GemmEpilogue;
  Generator gen(27);
  for (DType dt : float_types())
    for (GemmEpilogue epi : {GemmEpilogue::None, GemmEpilogue::Bias, GemmEpilogue::BiasGelu, GemmEpilogue::DGelu})
      for (bool tb : {false, true}) {
        const int64_t m = 37, n = 45, k = 29;
        Tensor a = rand_tensor({m, k}, dt, gen), b = rand_tensor(tb ? Shape{n, k} : Shape{k, n}, dt, gen);
        Tensor bias = rand_tensor({n}, dt, gen), pre = rand_tensor({m, n}, dt, gen), res = rand_tensor({m, n}, dt, gen);
        auto run = [&](bool fused, Tensor& c, Tensor& aux, Tensor& sums) {
          backend::GemmFusion f;
          f.epilogue = epi;
          if (epi == GemmEpilogue::Bias || epi == GemmEpilogue::BiasGelu) f.bias = bias;
          if (epi == GemmEpilogue::BiasGelu) f.aux = aux;
          if (epi == GemmEpilogue::DGelu) {
            f.aux = pre;
            f.c_col_sums = sums;
          }
          if (epi != GemmEpilogue::DGelu) f.addend = res;
          if (fused)
            cpu().gemm_fused(false, tb, m, n, k, 1.0, a, b, 0.0, c, f);
          else
            cpu().backend::Backend::gemm_fused(false, tb, m, n, k, 1.0, a, b, 0.0, c, f);
        };
        Tensor c1 = Tensor::empty({m, n}, dt), c2 = Tensor::empty({m, n}, dt), x1 = Tensor::empty({m, n}, dt),
               x2 = Tensor::empty({m, n}, dt), s1 = Tensor::empty({n}, dt), s2 = Tensor::empty({n}, dt);
        run(true, c1, x1, s1);
        run(false, c2, x2, s2);
        const std::string what = std::string("gemm_fused ") + dtype_name(dt) + " epilogue " + std::to_string(int(epi));
        expect_close(c1, values(c2), tol_for(dt, 4), what);
        if (epi == GemmEpilogue::BiasGelu) expect_close(x1, values(x2), tol_for(dt, 4), what + " aux");
        if (epi == GemmEpilogue::DGelu) expect_close(s1, values(s2), tol_for(dt, 40), what + " column sums");
      }
}

// A 1 x 1 product is a dot product: summed as a reduction, over many blocks, the same on one or two threads.
TEST(CpuSgemm, DotProductThroughGemm) {
  Generator gen(28);
  for (DType dt : float_types())
    for (int64_t k : {1, 13, 2048, 200003}) {
      Tensor a = rand_tensor({1, k}, dt, gen), b = rand_tensor({1, k}, dt, gen);
      const std::vector<double> av = values(a), bv = values(b);
      double want = 0.0;
      for (int64_t i = 0; i < k; ++i) want += av[static_cast<size_t>(i)] * bv[static_cast<size_t>(i)];
      Tensor c1 = Tensor::full({1, 1}, 3.0, dt), c2 = Tensor::full({1, 1}, 3.0, dt);
      {
        ThreadScope one(1);
        cpu().gemm(false, true, 1, 1, k, 2.0, a, b, 0.5, c1);
      }
      {
        ThreadScope two(2);
        cpu().gemm(false, true, 1, 1, k, 2.0, a, b, 0.5, c2);
      }
      expect_close(c1, {2.0 * want + 1.5}, tol_for(dt, 1 + std::sqrt(static_cast<double>(k))),
                   "dot of " + std::to_string(k));
      EXPECT_EQ(c1.item<double>(), c2.item<double>()) << "dot of " << k << " on one and two threads";
    }
}

}  // namespace
}  // namespace tandem::testing
