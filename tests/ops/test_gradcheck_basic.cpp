// Finite-difference gradient checks of the elementwise, shape and reduction ops.
#include "gradcheck.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;

TEST(GradCheck, HelperCatchesAWrongGradient) {
  // An op whose backward claims d(2x)/dx = 3: the checker must reject it.
  Generator gen(1);
  Tensor x = leaf({4}, gen);
  auto wrong = [](const Tensor& a) {
    Tensor y = scale(a, 2.0).detach();
    return record_op(y, {a}, "wrong", [](const Tensor& g) { return std::vector<Tensor>{scale(g, 3.0)}; });
  };
  EXPECT_FALSE(gradcheck1(wrong, x));
  // And one that drops the gradient entirely.
  auto dropped = [](const Tensor& a) {
    Tensor y = scale(a, 2.0).detach();
    return record_op(y, {a}, "dropped", [](const Tensor&) { return std::vector<Tensor>{Tensor()}; });
  };
  EXPECT_FALSE(gradcheck1(dropped, x));
}

TEST(GradCheck, AddSubMul) {
  Generator gen(2);
  Tensor a = leaf({3, 4}, gen), b = leaf({3, 4}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return add(t[0], t[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return sub(t[0], t[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return mul(t[0], t[1]); }, {a, b}));
  // The same tensor on both sides: its two gradients must be summed.
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return mul(x, x); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return sub(add(x, x), mul(x, x)); }, a));
}

TEST(GradCheck, OnlyInputsThatRequireGradients) {
  Generator gen(3);
  Tensor a = leaf({5}, gen);
  Tensor b = Tensor::uniform({5}, -1, 1, gen, DType::f64);  // a constant
  EXPECT_TRUE(gradcheck([](const Ts& t) { return mul(t[0], t[1]); }, {a, b}));
  EXPECT_FALSE(b.grad().defined());
}

TEST(GradCheck, ScaleAndAddScalar) {
  Generator gen(4);
  Tensor a = leaf({2, 3, 2}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return scale(x, -1.75); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return add_scalar(x, 3.5); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return x * 0.5; }, a));
}

TEST(GradCheck, Activations) {
  Generator gen(5);
  Tensor a = leaf({4, 7}, gen, -3, 3);
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return relu(x); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return sigmoid(x); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return tanh(x); }, a));
  // Composed: the chain rule through saved outputs.
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return tanh(sigmoid(relu(x) * 2.0)); }, a));
}

TEST(GradCheck, BiasAdd) {
  Generator gen(6);
  Tensor x2 = leaf({5, 3}, gen), b3 = leaf({3}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return bias_add(t[0], t[1]); }, {x2, b3}));
  Tensor x4 = leaf({2, 3, 4, 5}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return bias_add(t[0], t[1]); }, {x4, b3}));
}

TEST(GradCheck, ReshapeAndFlatten) {
  Generator gen(7);
  Tensor a = leaf({2, 3, 4}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return reshape(x, {4, -1}) * reshape(x, {4, 6}); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return tanh(flatten(x)); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return sigmoid(flatten(x, 0)); }, a));
}

TEST(GradCheck, Cat) {
  Generator gen(9);
  Tensor a = leaf({2, 3, 4}, gen), b = leaf({2, 1, 4}, gen), c = leaf({2, 2, 4}, gen);
  // A nonlinearity after the join: each input's gradient must come from its own slice.
  EXPECT_TRUE(gradcheck([](const Ts& t) { return tanh(cat(t, 1)); }, {a, b, c}));
  Tensor d = leaf({1, 3, 4}, gen), e = leaf({2, 3, 2}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return tanh(cat({t[0], t[1]}, 0)); }, {a, d}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return tanh(cat({t[0], t[1]}, -1)); }, {a, e}));
  // The same tensor twice: both slices' gradients reach it.
  EXPECT_TRUE(gradcheck([](const Ts& t) { return tanh(cat({t[0], t[0]}, 2)); }, {a}));
}

// cat places each input's values in its slice, in order, along any dimension.
TEST(Cat, ValuesInOrder) {
  Tensor a = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector(std::vector<double>{7, 8}, {2, 1});
  EXPECT_EQ(cat({a, b}, 1).to_vector<double>(), (std::vector<double>{1, 2, 3, 7, 4, 5, 6, 8}));
  Tensor c = Tensor::from_vector(std::vector<double>{9, 10, 11}, {1, 3});
  EXPECT_EQ(cat({a, c}, 0).to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6, 9, 10, 11}));
  EXPECT_EQ(cat({a}, 0).shape(), Shape({2, 3}));
}

TEST(GradCheck, SumAndMean) {
  Generator gen(8);
  Tensor a = leaf({3, 5}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return sum(x); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return mean(x); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return mean(mul(x, x)); }, a));
}

}  // namespace
}  // namespace tandem::testing
