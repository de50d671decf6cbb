// fp8_linear on the CPU (the emulation): exactly equal to a hand-written emulation where every product and sum
// is exact (values on a grid, scales powers of two), its scales and maxima as worked out by hand under current
// and delayed scaling, non-finite maxima reported through the verdict, and within the formats' error bound of
// the f32 linear layer on random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/fp8.h"
#include "tandem/autograd.h"
#include "tandem/fp8.h"
#include "tandem/ops.h"
#include "tandem/random.h"

namespace tandem {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

// rows x cols values k / 16 with |k| <= 28 (so at most 1.75), element `peak` set to +-1.75.
Tensor grid(int64_t rows, int64_t cols, uint64_t seed, int64_t peak, float peak_sign) {
  Generator g(seed);
  Tensor u = Tensor::uniform({rows, cols}, -28.0, 29.0, g);
  std::vector<float> v = u.to_vector<float>();
  for (float& e : v) e = std::floor(e) / 16.0f;
  v[static_cast<size_t>(peak)] = 1.75f * peak_sign;
  return Tensor::from_vector(v, {rows, cols});
}

// The values the codes of x * scale stand for, as the emulation computes them.
std::vector<double> fake_quant(const Tensor& x, float scale, Fp8Format f) {
  std::vector<double> out;
  for (float v : x.to(DType::f32).to_vector<float>())
    out.push_back(static_cast<double>(fp8::decode(fp8::encode(v * scale, f, true), f) * (1.0f / scale)));
  return out;
}

struct Reference {
  std::vector<double> y, dx, dw, db;
};

// The layer by hand: x [n, in], w [out, in], b [out], output gradient g [n, out], with the given scales.
Reference by_hand(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& g, float sx, float sw, float sg,
                  Fp8Format fwd = Fp8Format::e4m3, Fp8Format bwd = Fp8Format::e5m2) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const std::vector<double> xd = fake_quant(x, sx, fwd), wd = fake_quant(w, sw, fwd), gd = fake_quant(g, sg, bwd);
  const std::vector<float> bv = b.to_vector<float>(), gv = g.to(DType::f32).to_vector<float>();
  Reference r;
  r.y.assign(n * out, 0.0), r.dx.assign(n * in, 0.0), r.dw.assign(out * in, 0.0), r.db.assign(out, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < out; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < in; ++k) s += xd[i * in + k] * wd[j * in + k];
      r.y[i * out + j] = s + bv[j];
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < in; ++k) {
      double s = 0.0;
      for (int64_t j = 0; j < out; ++j) s += gd[i * out + j] * wd[j * in + k];
      r.dx[i * in + k] = s;
    }
  for (int64_t j = 0; j < out; ++j)
    for (int64_t k = 0; k < in; ++k) {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += gd[i * out + j] * xd[i * in + k];
      r.dw[j * in + k] = s;
    }
  for (int64_t j = 0; j < out; ++j)
    for (int64_t i = 0; i < n; ++i) r.db[j] += gv[i * out + j];
  return r;
}

void expect_equal(const Tensor& got, const std::vector<double>& want, const char* what) {
  const std::vector<double> v = got.to(DType::f32).to_vector<double>();
  ASSERT_EQ(v.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != want[i] && bad++ < 5) ADD_FAILURE() << what << "[" << i << "] = " << v[i] << ", by hand " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

std::vector<float> values(const Tensor& t) { return t.to(DType::f32).to_vector<float>(); }

struct Layer {
  Tensor x, w, b, g;
};

Layer grid_layer(int64_t n = 5, int64_t in = 16, int64_t out = 6) {
  Layer l;
  l.x = grid(n, in, 1, 0, 1.0f);
  l.w = grid(out, in, 2, 2 * in + 3, -1.0f);
  l.b = Tensor::from_vector(std::vector<float>{0.5f, -1.25f, 2.0f, 0.0f, 0.125f, -3.0f}, {out});
  l.g = grid(n, out, 3, out + 1, 1.0f);
  return l;
}

TEST(Fp8Linear, CurrentScalingEqualsTheEmulationByHand) {
  Layer l = grid_layer();
  Fp8LinearState st(Fp8Recipe::current(), Device::cpu());
  Tensor x = l.x.clone().requires_grad_(), w = l.w.clone().requires_grad_(), b = l.b.clone().requires_grad_();
  Tensor y = fp8_linear(x, w, b, st);
  backward(y, {}, l.g);
  // amax 1.75 everywhere: 448 / 1.75 = 256 for the e4m3 operands, 57344 / 1.75 = 32768 for the e5m2 gradient.
  EXPECT_EQ(values(st.forward.scale()), (std::vector<float>{256.0f, 256.0f}));
  EXPECT_EQ(values(st.forward.scale_inv()), (std::vector<float>{1.0f / 256, 1.0f / 256}));
  EXPECT_EQ(values(st.backward.scale()), (std::vector<float>{32768.0f}));
  EXPECT_EQ(values(st.verdict), (std::vector<float>{0.0f}));
  const Reference r = by_hand(l.x, l.w, l.b, l.g, 256.0f, 256.0f, 32768.0f);
  expect_equal(y, r.y, "y");
  expect_equal(x.grad(), r.dx, "dx");
  expect_equal(w.grad(), r.dw, "dw");
  expect_equal(b.grad(), r.db, "db");
  // The casts did round: the emulation is not the f32 layer.
  const std::vector<double> xq = fake_quant(l.x, 256.0f, Fp8Format::e4m3);
  const std::vector<float> xv = l.x.to_vector<float>();
  int rounded = 0;
  for (size_t i = 0; i < xv.size(); ++i) rounded += xq[i] != xv[i];
  EXPECT_GT(rounded, 5);
  Tensor y32 = linear(l.x, l.w, l.b);
  EXPECT_NE(values(y32), values(y));
}

TEST(Fp8Linear, Bf16InputAndLeadingDimensions) {
  Layer l = grid_layer(6, 16, 6);
  Fp8LinearState st(Fp8Recipe::current(), Device::cpu());
  Tensor x = l.x.to(DType::bf16).view({2, 3, 16}).detach().requires_grad_();
  Tensor w = l.w.clone().requires_grad_();
  Tensor y = fp8_linear(x, w, Tensor(), st);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 6}));
  ASSERT_EQ(y.dtype(), DType::bf16);
  backward(y, {}, l.g.to(DType::bf16).view({2, 3, 6}));
  const Reference r = by_hand(l.x, l.w, Tensor::zeros({6}), l.g, 256.0f, 256.0f, 32768.0f);
  std::vector<double> y_bf;
  for (double v : r.y) y_bf.push_back(static_cast<float>(BFloat16(static_cast<float>(v))));
  expect_equal(y.view({6, 6}), y_bf, "y (bf16)");
  ASSERT_EQ(x.grad().shape(), (Shape{2, 3, 16}));
  ASSERT_EQ(x.grad().dtype(), DType::bf16);
  std::vector<double> dx_bf;
  for (double v : r.dx) dx_bf.push_back(static_cast<float>(BFloat16(static_cast<float>(v))));
  expect_equal(x.grad().view({6, 16}), dx_bf, "dx (bf16)");
  expect_equal(w.grad(), r.dw, "dw");
}

TEST(Fp8Linear, DelayedScalingUsesTheLastStepsMaxima) {
  Layer l = grid_layer();
  Fp8LinearState st(Fp8Recipe::delayed(4), Device::cpu());
  auto step = [&](const Tensor& xin) {
    Tensor x = xin.clone().requires_grad_(), w = l.w.clone().requires_grad_(), b = l.b.clone().requires_grad_();
    Tensor y = fp8_linear(x, w, b, st);
    backward(y, {}, l.g);
    return std::vector<Tensor>{y, x.grad(), w.grad()};
  };
  // Step 1 casts with the first scales (1) and records the maxima.
  std::vector<Tensor> s1 = step(l.x);
  const Reference r1 = by_hand(l.x, l.w, l.b, l.g, 1.0f, 1.0f, 1.0f);
  expect_equal(s1[0], r1.y, "step 1 y");
  expect_equal(s1[1], r1.dx, "step 1 dx");
  expect_equal(s1[2], r1.dw, "step 1 dw");
  EXPECT_EQ(values(st.forward.amax_history().narrow(0, 0, 1)), (std::vector<float>{1.75f, 1.75f}));
  EXPECT_EQ(values(st.backward.amax_history().narrow(0, 0, 1)), (std::vector<float>{1.75f}));
  EXPECT_EQ(values(st.forward.scale()), (std::vector<float>{1.0f, 1.0f}));
  st.update();
  EXPECT_EQ(values(st.forward.scale()), (std::vector<float>{256.0f, 256.0f}));
  EXPECT_EQ(values(st.backward.scale()), (std::vector<float>{32768.0f}));
  EXPECT_EQ(values(st.forward.amax_history()),
            (std::vector<float>{0.0f, 0.0f, 1.75f, 1.75f, 0.0f, 0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(values(st.verdict), (std::vector<float>{0.0f}));
  // Step 2 with the scales of step 1's maxima; x half as large records 0.875, but the history still holds 1.75.
  Tensor half = (l.x * 0.5).detach();
  std::vector<Tensor> s2 = step(half);
  const Reference r2 = by_hand(half, l.w, l.b, l.g, 256.0f, 256.0f, 32768.0f);
  expect_equal(s2[0], r2.y, "step 2 y");
  expect_equal(s2[1], r2.dx, "step 2 dx");
  expect_equal(s2[2], r2.dw, "step 2 dw");
  st.update();
  EXPECT_EQ(values(st.forward.scale()), (std::vector<float>{256.0f, 256.0f}));
  // Step 3 meets an infinity in x: the saturating cast keeps y finite, the update refuses the maximum, keeps
  // x's scale and reports the step through the verdict; the weight's slot updates as usual.
  Tensor bad = l.x.clone();
  bad.data<float>()[4] = -kInf;
  std::vector<Tensor> s3 = step(bad);
  for (float v : values(s3[0])) EXPECT_TRUE(std::isfinite(v));
  st.update();
  EXPECT_TRUE(std::isnan(values(st.verdict)[0]));
  EXPECT_EQ(values(st.forward.scale()), (std::vector<float>{256.0f, 256.0f}));
  EXPECT_EQ(values(st.forward.amax_history().narrow(1, 0, 1)), (std::vector<float>{0.0f, 0.875f, 1.75f, 0.0f}));
  st.reset_verdict();
  EXPECT_EQ(values(st.verdict), (std::vector<float>{0.0f}));
}

TEST(Fp8Linear, CurrentScalingReportsANanInput) {
  Layer l = grid_layer();
  Fp8LinearState st(Fp8Recipe::current(), Device::cpu());
  (void)fp8_linear(l.x, l.w, l.b, st);  // scales 256
  Tensor bad = l.x.clone();
  bad.data<float>()[17] = std::numeric_limits<float>::quiet_NaN();  // row 1
  Tensor y = fp8_linear(bad, l.w, l.b, st);
  EXPECT_TRUE(std::isnan(values(st.verdict)[0]));
  EXPECT_EQ(values(st.forward.scale()), (std::vector<float>{256.0f, 256.0f})) << "the previous scale stays";
  const std::vector<float> v = values(y);
  for (int64_t j = 0; j < 6; ++j) {
    EXPECT_TRUE(std::isnan(v[6 + j])) << "row 1 reads the NaN";
    EXPECT_TRUE(std::isfinite(v[j])) << "row 0 does not";
  }
}

// Against the f32 layer on random data: every element within the bound the formats' rounding gives.
// A value v cast with scale s is off by at most 2^-4 |v| (e4m3; 2^-3 for e5m2) in the normal range, and by half
// the smallest subnormal, 2^-10 / s (2^-17 / s), below it; a product of two cast values is then off by at most
// e_a |b| + |a| e_b + e_a e_b, summed over the products; f32 sums add a little.
TEST(Fp8Linear, WithinTheFormatsErrorOfTheF32Layer) {
  Generator gen(21);
  const int64_t n = 64, in = 96, out = 48;
  Tensor x0 = Tensor::normal({n, in}, 0.0, 1.0, gen), w0 = Tensor::normal({out, in}, 0.0, 0.2, gen);
  Tensor b0 = Tensor::normal({out}, 0.0, 0.5, gen), g0 = Tensor::normal({n, out}, 0.0, 0.01, gen);
  Fp8LinearState st(Fp8Recipe::current(), Device::cpu());
  Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  Tensor y = fp8_linear(x, w, b, st);
  backward(y, {}, g0);
  Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_(), br = b0.clone().requires_grad_();
  Tensor yr = linear(xr, wr, br);
  backward(yr, {}, g0);

  const std::vector<float> xv = x0.to_vector<float>(), wv = w0.to_vector<float>(), gv = g0.to_vector<float>();
  const float sxi = values(st.forward.scale_inv())[0], swi = values(st.forward.scale_inv())[1];
  const float sgi = values(st.backward.scale_inv())[0];
  auto e4 = [](double v, double si) { return std::ldexp(std::fabs(v), -4) + std::ldexp(si, -10); };
  auto e5 = [](double v, double si) { return std::ldexp(std::fabs(v), -3) + std::ldexp(si, -17); };
  auto pair = [](double a, double ea, double b, double eb) {
    return ea * std::fabs(b) + std::fabs(a) * eb + ea * eb;
  };
  auto check = [&](const Tensor& got, const Tensor& ref, int64_t rows, int64_t cols, int64_t inner,
                   auto&& term, const char* what) {
    const double f32_slack = static_cast<double>(inner) * std::ldexp(1.0, -23);  // both sides' f32 sums
    const std::vector<double> a = got.to_vector<double>(), r = ref.to_vector<double>();
    double worst = 0.0;
    int differ = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double bound = 0.0, mag = 0.0;
        for (int64_t k = 0; k < inner; ++k) term(i, j, k, bound, mag);
        bound += f32_slack * mag;
        const double err = std::fabs(a[i * cols + j] - r[i * cols + j]);
        ASSERT_LE(err, bound) << what << "[" << i << ", " << j << "]";
        worst = std::max(worst, err / bound);
        differ += err > f32_slack * mag;
      }
    EXPECT_GT(differ, rows * cols / 2) << what << ": the casts change most elements";
    EXPECT_GT(worst, 0.01) << what << ": the bound is not vacuous";
  };
  check(y, yr, n, out, in, [&](int64_t i, int64_t j, int64_t k, double& bound, double& mag) {
    const double a = xv[i * in + k], c = wv[j * in + k];
    bound += pair(a, e4(a, sxi), c, e4(c, swi));
    mag += std::fabs(a * c);
  }, "y");
  check(x.grad(), xr.grad(), n, in, out, [&](int64_t i, int64_t k, int64_t j, double& bound, double& mag) {
    const double a = gv[i * out + j], c = wv[j * in + k];
    bound += pair(a, e5(a, sgi), c, e4(c, swi));
    mag += std::fabs(a * c);
  }, "dx");
  check(w.grad(), wr.grad(), out, in, n, [&](int64_t j, int64_t k, int64_t i, double& bound, double& mag) {
    const double a = gv[i * out + j], c = xv[i * in + k];
    bound += pair(a, e5(a, sgi), c, e4(c, sxi));
    mag += std::fabs(a * c);
  }, "dw");
  // The bias gradient is the uncast gradient's sums.
  const std::vector<float> db = values(b.grad()), dbr = values(br.grad());
  for (int64_t j = 0; j < out; ++j) EXPECT_NEAR(db[j], dbr[j], 1e-6) << j;
}

TEST(Fp8Linear, ChecksItsOperands) {
  Fp8LinearState st(Fp8Recipe::current(), Device::cpu());
  EXPECT_THROW(fp8_linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}), Tensor(), st), Error);
  EXPECT_THROW(fp8_linear(Tensor::zeros({2, 3}, DType::f64), Tensor::zeros({4, 3}), Tensor(), st), Error);
  EXPECT_THROW(fp8_linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 3}), Tensor::zeros({5}), st), Error);
  EXPECT_THROW(fp8_linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 3}), Tensor(), Fp8LinearState()), Error);
}

}  // namespace
}  // namespace tandem
