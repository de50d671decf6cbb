// Elementwise kernels, bias broadcast and reductions against double-precision references.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

using backend::Binary;
using backend::Unary;

double ref_binary(Binary op, double a, double b) {
  switch (op) {
    case Binary::Add: return a + b;
    case Binary::Sub: return a - b;
    case Binary::Mul: return a * b;
    case Binary::Div: return a / b;
    case Binary::Max: return std::max(a, b);
    case Binary::Min: return std::min(a, b);
    default: break;
  }
  return 0;
}

const Binary kBinaryOps[] = {Binary::Add, Binary::Sub, Binary::Mul, Binary::Div, Binary::Max, Binary::Min};

TEST(CpuBinary, FloatOpsMatchReference) {
  Generator gen(1);
  for (DType dt : float_types()) {
    for (int64_t n : {1, 7, 1000, 70001}) {  // the last one runs on several threads
      Tensor a = rand_tensor({n}, dt, gen), b = rand_tensor({n}, dt, gen, 0.5, 2.0);
      auto va = values(a), vb = values(b);
      for (Binary op : kBinaryOps) {
        Tensor out = Tensor::empty({n}, dt);
        cpu().binary(op, a, b, out);
        std::vector<double> want(n);
        for (int64_t i = 0; i < n; ++i) want[i] = ref_binary(op, va[i], vb[i]);
        // f32 inputs are exact in double, so the only error is the final f32 rounding.
        expect_close(out, want, dt == DType::f64 ? Tol{1e-15, 0} : Tol{1e-7, 0},
                     std::string("binary op ") + std::to_string(int(op)) + " " + dtype_name(dt));
      }
    }
  }
}

TEST(CpuBinary, OutputMayAliasAnInput) {
  Generator gen(2);
  Tensor a = rand_tensor({5, 9}, DType::f64, gen), b = rand_tensor({5, 9}, DType::f64, gen);
  auto va = values(a), vb = values(b);
  cpu().binary(Binary::Mul, a, b, a);
  std::vector<double> want(va.size());
  for (size_t i = 0; i < va.size(); ++i) want[i] = va[i] * vb[i];
  expect_close(a, want, Tol{0, 0}, "a *= b");
  cpu().binary(Binary::Sub, a, b, b);
  for (size_t i = 0; i < va.size(); ++i) want[i] = va[i] * vb[i] - vb[i];
  expect_close(b, want, Tol{0, 0}, "b = a - b");
}

template <typename I>
void check_integer_ops() {
  std::vector<I> va{7, -7, 100, 0, 3, -9, 12, 5}, vb{2, 2, -3, 5, 3, 4, -12, 1};
  Tensor a = Tensor::from_vector(va, {8}), b = Tensor::from_vector(vb, {8});
  for (Binary op : kBinaryOps) {
    Tensor out = Tensor::empty({8}, dtype_of<I>());
    cpu().binary(op, a, b, out);
    auto got = out.to_vector<I>();
    for (size_t i = 0; i < va.size(); ++i) {
      I want{};
      switch (op) {
        case Binary::Add: want = va[i] + vb[i]; break;
        case Binary::Sub: want = va[i] - vb[i]; break;
        case Binary::Mul: want = va[i] * vb[i]; break;
        case Binary::Div: want = va[i] / vb[i]; break;  // truncates toward zero
        case Binary::Max: want = std::max(va[i], vb[i]); break;
        case Binary::Min: want = std::min(va[i], vb[i]); break;
        default: break;
      }
      EXPECT_EQ(got[i], want) << "op " << int(op) << " element " << i << " " << dtype_name(dtype_of<I>());
    }
  }
}

TEST(CpuBinary, IntegerOps) {
  check_integer_ops<int32_t>();
  check_integer_ops<int64_t>();
}

TEST(CpuBinary, IntegerDivisionByZeroIsAnError) {
  Tensor a = Tensor::from_vector<int32_t>({1, 2, 3}, {3}), b = Tensor::from_vector<int32_t>({1, 0, 3}, {3});
  Tensor out = Tensor::empty({3}, DType::i32);
  try {
    cpu().binary(Binary::Div, a, b, out);
    FAIL() << "integer division by zero did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("division by zero"), std::string::npos) << e.what();
  }
}

TEST(CpuBinary, IntegerOverflowWraps) {
  const int32_t mn = std::numeric_limits<int32_t>::min(), mx = std::numeric_limits<int32_t>::max();
  Tensor a = Tensor::from_vector<int32_t>({mx, mn}, {2}), b = Tensor::from_vector<int32_t>({1, -1}, {2});
  Tensor out = Tensor::empty({2}, DType::i32);
  cpu().binary(Binary::Add, a, b, out);
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{mn, mx}));
  cpu().binary(Binary::Div, a, b, out);  // min / -1 wraps to min instead of trapping
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{mx, mn}));
}

TEST(CpuBinary, UnsupportedDtypeNamesIt) {
  Tensor a = Tensor::zeros({3}, DType::f16), out = Tensor::empty({3}, DType::f16);
  try {
    cpu().binary(Binary::Add, a, a, out);
    FAIL() << "f16 binary did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
  }
}

TEST(CpuBinary, FloatMaxMinPropagateNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor a = Tensor::from_vector<double>({nan, 1.0}, {2}), b = Tensor::from_vector<double>({1.0, nan}, {2});
  Tensor out = Tensor::empty({2}, DType::f64);
  for (Binary op : {Binary::Max, Binary::Min}) {
    cpu().binary(op, a, b, out);
    auto v = values(out);
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1])) << "op " << int(op);
  }
}

double ref_unary(Unary op, double x) {
  switch (op) {
    case Unary::Neg: return -x;
    case Unary::Relu: return x > 0 ? x : 0;
    case Unary::Sigmoid: return 1 / (1 + std::exp(-x));
    case Unary::Tanh: return std::tanh(x);
    case Unary::Exp: return std::exp(x);
    case Unary::Log: return std::log(x);
    case Unary::Abs: return std::abs(x);
    case Unary::Sqrt: return std::sqrt(x);
    default: break;
  }
  return 0;
}

TEST(CpuUnary, MatchesReference) {
  Generator gen(3);
  const Unary ops[] = {Unary::Neg, Unary::Relu, Unary::Sigmoid, Unary::Tanh,
                       Unary::Exp, Unary::Log,  Unary::Abs,     Unary::Sqrt};
  for (DType dt : float_types()) {
    for (int64_t n : {3, 513, 40000}) {
      Tensor x = rand_tensor({n}, dt, gen, -4, 4);
      Tensor pos = rand_tensor({n}, dt, gen, 0.01, 5);
      for (Unary op : ops) {
        const Tensor& in = (op == Unary::Log || op == Unary::Sqrt) ? pos : x;
        auto v = values(in);
        Tensor out = Tensor::empty({n}, dt);
        cpu().unary(op, in, out);
        std::vector<double> want(n);
        for (int64_t i = 0; i < n; ++i) want[i] = ref_unary(op, v[i]);
        expect_close(out, want, dt == DType::f64 ? Tol{1e-14, 1e-15} : Tol{1e-6, 1e-7},
                     std::string("unary op ") + std::to_string(int(op)) + " " + dtype_name(dt));
      }
    }
  }
}

TEST(CpuUnary, SigmoidSaturatesWithoutNaN) {
  Tensor x = Tensor::from_vector<float>({-1000.f, 1000.f, 0.f}, {3}), y = Tensor::empty({3});
  cpu().unary(Unary::Sigmoid, x, y);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.f, 1.f, 0.5f}));
}

TEST(CpuUnary, AffineAndAxpy) {
  Generator gen(4);
  for (DType dt : float_types()) {
    Tensor a = rand_tensor({101}, dt, gen), y = rand_tensor({101}, dt, gen);
    auto va = values(a), vy = values(y);
    Tensor out = Tensor::empty({101}, dt);
    cpu().affine(a, -2.5, 0.75, out);
    std::vector<double> want(101);
    for (int i = 0; i < 101; ++i) want[i] = -2.5 * va[i] + 0.75;
    expect_close(out, want, tol_for(dt), "affine");
    cpu().axpy(3.0, a, y);
    for (int i = 0; i < 101; ++i) want[i] = 3.0 * va[i] + vy[i];
    expect_close(y, want, tol_for(dt), "axpy");
  }
}

TEST(CpuUnary, BackwardFromOutput) {
  Generator gen(5);
  for (DType dt : float_types()) {
    Tensor x = rand_tensor({257}, dt, gen, -3, 3), g = rand_tensor({257}, dt, gen);
    auto vg = values(g);
    for (Unary op : {Unary::Relu, Unary::Sigmoid, Unary::Tanh}) {
      Tensor y = Tensor::empty({257}, dt), dx = Tensor::empty({257}, dt);
      cpu().unary(op, x, y);
      cpu().unary_backward(op, g, y, dx);
      auto vx = values(x), vy = values(y);
      std::vector<double> want(257);
      for (int i = 0; i < 257; ++i) {
        if (op == Unary::Relu) want[i] = vx[i] > 0 ? vg[i] : 0.0;
        if (op == Unary::Sigmoid) want[i] = vg[i] * vy[i] * (1 - vy[i]);
        if (op == Unary::Tanh) want[i] = vg[i] * (1 - vy[i] * vy[i]);
      }
      expect_close(dx, want, tol_for(dt), std::string("unary_backward ") + std::to_string(int(op)));
    }
  }
}

TEST(CpuUnary, BackwardOfZeroDerivativeOpsIsAnError) {
  Tensor t = Tensor::ones({4}), out = Tensor::empty({4});
  EXPECT_THROW(cpu().unary_backward(Unary::Floor, t, t, out), Error);
  EXPECT_THROW(cpu().unary_backward(Unary::Sign, t, t, out), Error);
  // Exp and Sqrt are differentiated from their output: g * y and g / (2 y).
  Tensor g = Tensor::full({4}, 3.0), y = Tensor::full({4}, 2.0);
  cpu().unary_backward(Unary::Exp, g, y, out);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(4, 6.0f));
  cpu().unary_backward(Unary::Sqrt, g, y, out);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(4, 0.75f));
}

TEST(CpuBias, AddAndGradMatchReference) {
  Generator gen(6);
  struct Case {
    int64_t n, c, s;
  };
  for (DType dt : float_types()) {
    for (Case k : {Case{3, 5, 1}, Case{64, 500, 1}, Case{2, 3, 7}, Case{7, 20, 576}, Case{1, 1, 9}}) {
      Tensor x = rand_tensor({k.n, k.c, k.s}, dt, gen), b = rand_tensor({k.c}, dt, gen);
      auto vx = values(x), vb = values(b);
      Tensor out = Tensor::empty({k.n, k.c, k.s}, dt);
      cpu().bias_add(x, b, k.n, k.c, k.s, out);
      std::vector<double> want(vx.size()), gsum(k.c, 0.0);
      for (int64_t i = 0; i < k.n; ++i)
        for (int64_t j = 0; j < k.c; ++j)
          for (int64_t q = 0; q < k.s; ++q) {
            const int64_t at = (i * k.c + j) * k.s + q;
            want[at] = vx[at] + vb[j];
            gsum[j] += vx[at];
          }
      expect_close(out, want, tol_for(dt), "bias_add");
      Tensor db = Tensor::empty({k.c}, dt);
      cpu().bias_grad(x, k.n, k.c, k.s, db);
      expect_close(db, gsum, tol_for(dt, 10), "bias_grad");
      cpu().bias_add(x, b, k.n, k.c, k.s, x);  // in place, as linear does
      expect_close(x, want, tol_for(dt), "bias_add in place");
    }
  }
}

TEST(CpuSum, FloatsAccumulateAccurately) {
  Generator gen(7);
  for (DType dt : float_types()) {
    for (int64_t n : {1, 10, 8192, 8193, 100003}) {
      Tensor x = rand_tensor({n}, dt, gen);
      auto v = values(x);
      double want = 0;
      for (double e : v) want += e;
      Tensor out = Tensor::empty({}, dt);
      cpu().sum(x, out);
      EXPECT_NEAR(out.item<double>(), want, dt == DType::f64 ? 1e-12 : 1e-5 * std::max(1.0, std::abs(want)))
          << n << " " << dtype_name(dt);
    }
  }
  // f32 inputs whose running f32 sum would lose the small terms.
  std::vector<float> big(20000, 1.0f);
  big[0] = 1e8f;
  Tensor t = Tensor::from_vector(big, {20000}), out = Tensor::empty({});
  cpu().sum(t, out);
  EXPECT_EQ(out.item<float>(), 1e8f + 19999.0f);
}

TEST(CpuSum, SameResultOnOneOrTwoThreads) {
  Generator gen(8);
  Tensor x = rand_tensor({300001}, DType::f32, gen);
  Tensor a = Tensor::empty({}), b = Tensor::empty({});
  {
    ThreadScope one(1);
    cpu().sum(x, a);
  }
  {
    ThreadScope two(2);
    cpu().sum(x, b);
  }
  EXPECT_EQ(a.item<float>(), b.item<float>());
}

TEST(CpuSum, Integers) {
  std::vector<int32_t> v32(50000);
  int64_t want = 0;
  for (int i = 0; i < 50000; ++i) want += (v32[i] = (i * 7919) % 2001 - 1000);
  Tensor t32 = Tensor::from_vector(v32, {50000});
  Tensor own = Tensor::empty({}, DType::i32), wide = Tensor::empty({}, DType::i64);
  cpu().sum(t32, own);
  cpu().sum(t32, wide);
  EXPECT_EQ(own.item<int64_t>(), want);
  EXPECT_EQ(wide.item<int64_t>(), want);
  std::vector<int64_t> v64{int64_t(1) << 40, -3, int64_t(1) << 41};
  Tensor t64 = Tensor::from_vector(v64, {3}), o64 = Tensor::empty({}, DType::i64);
  cpu().sum(t64, o64);
  EXPECT_EQ(o64.item<int64_t>(), (int64_t(1) << 40) + (int64_t(1) << 41) - 3);
}

}  // namespace
}  // namespace tandem::testing
