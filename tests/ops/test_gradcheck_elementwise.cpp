// Finite-difference gradient checks (f64) of every elementwise op, on plain, broadcast and size-1
// operands; the gradients of ties, kinks and rounding; ops on empty tensors.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gradcheck.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;

struct UnaryCase {
  const char* name;
  Fn1 f;
  double lo, hi;  // the input's range: where the op is smooth and defined
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> c = {
      {"exp", [](const Tensor& x) { return exp(x); }, -1, 1},
      {"log", [](const Tensor& x) { return log(x); }, 0.2, 3},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.2, 3},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.3, 2},
      {"abs", [](const Tensor& x) { return abs(x); }, -1, 1},
      {"neg", [](const Tensor& x) { return neg(x); }, -1, 1},
      {"sign", [](const Tensor& x) { return sign(x); }, -1, 1},
      {"erf", [](const Tensor& x) { return erf(x); }, -2, 2},
      {"sin", [](const Tensor& x) { return sin(x); }, -3, 3},
      {"cos", [](const Tensor& x) { return cos(x); }, -3, 3},
      {"tan", [](const Tensor& x) { return tan(x); }, -1.2, 1.2},
      {"asin", [](const Tensor& x) { return asin(x); }, -0.9, 0.9},
      {"acos", [](const Tensor& x) { return acos(x); }, -0.9, 0.9},
      {"atan", [](const Tensor& x) { return atan(x); }, -3, 3},
      {"sinh", [](const Tensor& x) { return sinh(x); }, -2, 2},
      {"cosh", [](const Tensor& x) { return cosh(x); }, -2, 2},
      {"asinh", [](const Tensor& x) { return asinh(x); }, -3, 3},
      {"acosh", [](const Tensor& x) { return acosh(x); }, 1.2, 4},
      {"atanh", [](const Tensor& x) { return atanh(x); }, -0.9, 0.9},
      {"ceil", [](const Tensor& x) { return ceil(x); }, -3, 3},
      {"floor", [](const Tensor& x) { return floor(x); }, -3, 3},
      {"round", [](const Tensor& x) { return round(x); }, -3, 3},
      {"rounde", [](const Tensor& x) { return rounde(x); }, -3, 3},
      {"relu", [](const Tensor& x) { return relu(x); }, -1, 1},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -4, 4},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -2, 2},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.2); }, -1, 1},
      {"elu", [](const Tensor& x) { return elu(x, 0.7); }, -2, 2},
      {"selu", [](const Tensor& x) { return selu(x); }, -2, 2},
      {"softplus", [](const Tensor& x) { return softplus(x); }, -6, 6},
      {"softsign", [](const Tensor& x) { return softsign(x); }, -3, 3},
      {"hard_sigmoid", [](const Tensor& x) { return hard_sigmoid(x, 0.3, 0.4); }, -4, 4},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, -3, 3},
      {"silu", [](const Tensor& x) { return silu(x); }, -4, 4},
      {"clip", [](const Tensor& x) { return clip(x, -0.4, 0.6); }, -1, 1},
      {"clip_lower_only", [](const Tensor& x) { return clip(x, 0.1, std::numeric_limits<double>::infinity()); }, -1, 1},
      {"pow_scalar", [](const Tensor& x) { return pow(x, 2.5); }, 0.2, 2},
      {"pow_scalar_integer", [](const Tensor& x) { return pow(x, 3.0); }, -1, 1},
      {"scalar_pow", [](const Tensor& x) { return pow(1.7, x); }, -1, 1},
      {"scale", [](const Tensor& x) { return x * 2.5; }, -1, 1},
      {"add_scalar", [](const Tensor& x) { return x + 1.5; }, -1, 1},
      {"number_minus", [](const Tensor& x) { return 1.5 - x; }, -1, 1},
      {"number_over", [](const Tensor& x) { return 2.0 / x; }, 0.5, 2},
      {"cast_same_dtype", [](const Tensor& x) { return cast(x, DType::f64) * 3.0; }, -1, 1},
  };
  return c;
}

TEST(GradcheckElementwise, UnaryOps) {
  Generator gen(11);
  for (const UnaryCase& c : unary_cases()) {
    for (const Shape& shape : {Shape{2, 3}, Shape{5}, Shape{1, 3, 1}, Shape{}}) {
      // ceil, floor, round and sign jump at integers (and 0): keep the inputs away from them.
      Tensor x = leaf(shape, gen, c.lo, c.hi);
      EXPECT_TRUE(gradcheck1(c.f, x)) << c.name << " on " << shape_str(shape);
    }
  }
}

TEST(GradcheckElementwise, CastThroughF32) {
  Generator gen(12);
  GradCheckOptions opt;
  opt.eps = 1e-2;  // the f32 rounding in between must stay far below the differences
  opt.rtol = 1e-4;
  opt.atol = 1e-6;
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return cast(cast(x, DType::f32), DType::f64); }, leaf({2, 3}, gen),
                         opt));
}

struct BinaryCase {
  const char* name;
  Fn2 f;
  double lo_a, hi_a, lo_b, hi_b;
};

TEST(GradcheckElementwise, BinaryOpsBroadcast) {
  const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, -1, 1, -1, 1},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, -1, 1, -1, 1},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, -1, 1, -1, 1},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, -1, 1, 0.5, 2},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.3, 2, -1.5, 1.5},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, -1, 1, -1, 1},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, -1, 1, -1, 1},
      {"prelu", [](const Tensor& a, const Tensor& b) { return prelu(a, b); }, -1, 1, 0.05, 0.5},
  };
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{3}, {2, 2, 3}}, {{2, 3}, {}}, {{1, 3, 1}, {2, 1, 4}}};
  Generator gen(13);
  for (const BinaryCase& c : cases) {
    for (const auto& [sa, sb] : shapes) {
      Tensor a = leaf(sa, gen, c.lo_a, c.hi_a), b = leaf(sb, gen, c.lo_b, c.hi_b);
      EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return c.f(in[0], in[1]); }, {a, b}))
          << c.name << " on " << shape_str(sa) << " and " << shape_str(sb);
    }
  }
}

TEST(GradcheckElementwise, WhereBroadcast) {
  Generator gen(14);
  Tensor cond = Tensor::from_vector<double>({1, 0}, {2, 1});
  for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{2, 3}, {3}}, {{1, 3}, {}}, {{2, 3}, {2, 3}}}) {
    Tensor a = leaf(sa, gen), b = leaf(sb, gen);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); }, {a, b}))
        << shape_str(sa) << " and " << shape_str(sb);
  }
}

TEST(GradcheckElementwise, ComposedThroughStridedViews) {
  // An op's output viewed transposed feeds the next op: the kernels read it through its strides.
  Generator gen(15);
  Tensor a = leaf({2, 3}, gen, 0.5, 1.5), b = leaf({3, 2}, gen);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor e = exp(in[0]);
        return maximum(permute(e, {1, 0}), in[1]) * sin(permute(in[0], {1, 0}));
      },
      {a, b}));
}

// Where a finite difference cannot look (ties, kinks, jumps), the gradients PyTorch gives.
TEST(GradcheckElementwise, TiesAndKinksTakePyTorchsGradients) {
  auto grad_of = [](const std::function<Tensor(const Tensor&, const Tensor&)>& f, std::vector<double> av,
                    std::vector<double> bv, int which) {
    Tensor a = Tensor::from_vector(av, {static_cast<int64_t>(av.size())}).requires_grad_();
    Tensor b = Tensor::from_vector(bv, {static_cast<int64_t>(bv.size())}).requires_grad_();
    backward(sum(f(a, b)));
    return (which == 0 ? a : b).grad().to_vector<double>();
  };
  auto mx = [](const Tensor& a, const Tensor& b) { return maximum(a, b); };
  auto mn = [](const Tensor& a, const Tensor& b) { return minimum(a, b); };
  EXPECT_EQ(grad_of(mx, {1, 2, 3}, {1, 1, 4}, 0), (std::vector<double>{0.5, 1, 0}));
  EXPECT_EQ(grad_of(mx, {1, 2, 3}, {1, 1, 4}, 1), (std::vector<double>{0.5, 0, 1}));
  EXPECT_EQ(grad_of(mn, {1, 2, 3}, {1, 1, 4}, 0), (std::vector<double>{0.5, 0, 1}));
  EXPECT_EQ(grad_of(mn, {1, 2, 3}, {1, 1, 4}, 1), (std::vector<double>{0.5, 1, 0}));
  // pow at a zero base: nothing for the exponent where it is >= 0, nothing for the base where it is 0.
  auto pw = [](const Tensor& a, const Tensor& b) { return pow(a, b); };
  EXPECT_EQ(grad_of(pw, {0, 0, 2}, {0, 2, 1}, 0), (std::vector<double>{0, 0, 1}));
  EXPECT_EQ(grad_of(pw, {0, 0, 2}, {0, 2, 1}, 1), (std::vector<double>{0, 0, 2 * std::log(2.0)}));

  auto grad1 = [](const Fn1& f, std::vector<double> v) {
    Tensor x = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).requires_grad_();
    backward(sum(f(x)));
    return x.grad().to_vector<double>();
  };
  EXPECT_EQ(grad1([](const Tensor& x) { return abs(x); }, {0, -2, 3}), (std::vector<double>{0, -1, 1}));
  EXPECT_EQ(grad1([](const Tensor& x) { return relu(x); }, {0, -2, 3}), (std::vector<double>{0, 0, 1}));
  EXPECT_EQ(grad1([](const Tensor& x) { return leaky_relu(x, 0.5); }, {0, -2, 3}), (std::vector<double>{0.5, 0.5, 1}));
  EXPECT_EQ(grad1([](const Tensor& x) { return elu(x, 0.5); }, {0}), (std::vector<double>{0.5}));
  EXPECT_EQ(grad1([](const Tensor& x) { return clip(x, 0, 1); }, {0, 1, 2, -1}), (std::vector<double>{1, 1, 0, 0}));
  EXPECT_EQ(grad1([](const Tensor& x) { return pow(x, 0.0); }, {0, 2}), (std::vector<double>{0, 0}));
  EXPECT_EQ(grad1([](const Tensor& x) { return floor(x) + ceil(x) + round(x) + rounde(x) + sign(x); }, {0.5, -1.5}),
            (std::vector<double>{0, 0}));
}

TEST(GradcheckElementwise, EmptyOperands) {
  Tensor a = Tensor::zeros({0, 3}, DType::f64).requires_grad_();
  Tensor b = Tensor::ones({3}, DType::f64).requires_grad_();
  Tensor y = maximum(a, b) + exp(a) * b + where(less(a, b), a, b) + pow(a, b) + prelu(a, b);
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  backward(sum(y));
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().shape(), (Shape{0, 3}));
  ASSERT_TRUE(b.grad().defined());
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0, 0, 0}));
}

}  // namespace
}  // namespace tandem::testing
