// Broadcasting elementwise ops, division, exp and log, comparisons, and the reordering, joining,
// slicing, summing and softmax ops: values against hand-computed expectations, gradients by finite differences.
#include <cmath>

#include "gradcheck.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;

Tensor f64(const std::vector<double>& v, const Shape& s) { return Tensor::from_vector(v, s); }

TEST(Broadcast, ValuesFollowNumPysRules) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = f64({10, 20, 30}, {3});
  Tensor col = f64({100, 200}, {2, 1});
  Tensor one = f64({0.5}, {});
  EXPECT_EQ(add(a, row).to_vector<double>(), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(sub(a, col).to_vector<double>(), (std::vector<double>{-99, -98, -97, -196, -195, -194}));
  EXPECT_EQ(mul(one, a).to_vector<double>(), (std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3}));
  EXPECT_EQ(div(a, row).to_vector<double>(),
            (std::vector<double>{1.0 / 10, 2.0 / 20, 3.0 / 30, 4.0 / 10, 5.0 / 20, 6.0 / 30}));
  // Both operands stretched: [2, 1] with [3] gives [2, 3].
  Tensor both = add(col, row);
  EXPECT_EQ(both.shape(), (Shape{2, 3}));
  EXPECT_EQ(both.to_vector<double>(), (std::vector<double>{110, 120, 130, 210, 220, 230}));
}

TEST(Broadcast, ShapesThatDoNotBroadcastAreRefused) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2});
  try {
    add(a, b);
    FAIL() << "add of [2, 3] and [3, 2] must fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("add: operands of different shapes (f32[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("do not broadcast"), std::string::npos) << m;
  }
  EXPECT_THROW(mul(Tensor::zeros({4}), Tensor::zeros({4}, DType::f64)), Error);  // dtypes still must agree
}

TEST(Broadcast, GradientsSumOverStretchedDimensions) {
  Generator gen(31);
  Tensor a = leaf({2, 3, 4}, gen), row = leaf({4}, gen), mid = leaf({3, 1}, gen), s = leaf({}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return add(t[0], t[1]); }, {a, row}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return sub(t[1], t[0]); }, {a, mid}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return mul(t[0], t[1]); }, {a, mid}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return mul(t[1], t[0]); }, {a, s}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return mul(t[0], t[1]); }, {row, mid}));  // both stretched
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return expand(x, {2, 3, 4}); }, mid));
}

TEST(Broadcast, DivExpLogGradients) {
  Generator gen(32);
  Tensor a = leaf({3, 4}, gen), b = leaf({3, 4}, gen, 0.5, 2.0), col = leaf({3, 1}, gen, 0.5, 2.0);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return div(t[0], t[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return div(t[0], t[1]); }, {a, col}));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return exp(x); }, a));
  EXPECT_TRUE(gradcheck1([](const Tensor& x) { return log(x); }, b));
  EXPECT_NEAR(exp(f64({1.0}, {1})).item<double>(), std::exp(1.0), 1e-15);
  EXPECT_NEAR(log(f64({2.0}, {1})).item<double>(), std::log(2.0), 1e-15);
}

TEST(Compare, OneWhereTheComparisonHolds) {
  Tensor a = f64({1, 2, 3, NAN}, {4}), two = f64({2}, {1});
  EXPECT_EQ(compare(a, two, Comparison::Greater).to_vector<double>(), (std::vector<double>{0, 0, 1, 0}));
  EXPECT_EQ(compare(a, two, Comparison::GreaterEqual).to_vector<double>(), (std::vector<double>{0, 1, 1, 0}));
  EXPECT_EQ(compare(a, two, Comparison::Less).to_vector<double>(), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(compare(a, two, Comparison::LessEqual).to_vector<double>(), (std::vector<double>{1, 1, 0, 0}));
  EXPECT_EQ(compare(a, two, Comparison::Equal).to_vector<double>(), (std::vector<double>{0, 1, 0, 0}));
  Tensor i = Tensor::from_vector(std::vector<int32_t>{-1, 5}, {2});
  EXPECT_EQ(compare(i, Tensor::from_vector(std::vector<int32_t>{0}, {1}), Comparison::Greater).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1}));
  Generator gen(33);
  Tensor x = leaf({3}, gen);
  EXPECT_FALSE(compare(x, x, Comparison::Equal).requires_grad());  // a mask is data
}

TEST(Permute, ValuesAndGradients) {
  Tensor a = f64({0, 1, 2, 3, 4, 5}, {1, 2, 3});
  Tensor p = permute(a, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(permute(a, {-1, 1, 0}).shape(), (Shape{3, 2, 1}));
  EXPECT_THROW(permute(a, {0, 0, 1}), Error);
  EXPECT_THROW(permute(a, {0, 1}), Error);
  Generator gen(34);
  Tensor x = leaf({2, 3, 4}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return permute(t, {1, 2, 0}); }, x));
  // A strided input (a transposed view) reads its elements where they are.
  Tensor m = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(permute(m.transpose(0, 1), {1, 0}).to_vector<double>(), m.to_vector<double>());
}

TEST(Concat, JoinsAlongAnyDimension) {
  Tensor a = f64({1, 2, 3, 4}, {2, 2}), b = f64({5, 6}, {2, 1});
  Tensor c1 = concat({a, b}, 1);
  EXPECT_EQ(c1.shape(), (Shape{2, 3}));
  EXPECT_EQ(c1.to_vector<double>(), (std::vector<double>{1, 2, 5, 3, 4, 6}));
  Tensor c0 = concat({a, f64({7, 8}, {1, 2})}, -2);
  EXPECT_EQ(c0.to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 7, 8}));
  EXPECT_THROW(concat({a, f64({1, 2, 3}, {1, 3})}, 0), Error);
  EXPECT_THROW(concat({}, 0), Error);
  Generator gen(35);
  Tensor x = leaf({2, 3, 2}, gen), y = leaf({2, 1, 2}, gen), z = leaf({2, 4, 2}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return concat({t[0], t[1], t[2]}, 1); }, {x, y, z}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return concat({t[0], t[0]}, 0); }, {x}));  // one input twice
}

TEST(Slice, CopiesARangeAndSendsTheGradientBack) {
  Tensor a = f64({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4});
  EXPECT_EQ(slice(a, 1, 1, 2).to_vector<double>(), (std::vector<double>{1, 2, 5, 6}));
  EXPECT_EQ(slice(a, 0, 1, 1).shape(), (Shape{1, 4}));
  EXPECT_THROW(slice(a, 1, 3, 2), Error);
  EXPECT_THROW(slice(a, 2, 0, 1), Error);
  Generator gen(36);
  Tensor x = leaf({3, 5}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return slice(t, 1, 1, 3); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return slice(t, 0, 0, 1); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return slice(t, -1, 4, 1); }, x));
}

TEST(SumOverDimensions, ValuesShapesAndGradients) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(sum(a, {0}).to_vector<double>(), (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(sum(a, {-1}, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(sum(a, {1}).to_vector<double>(), (std::vector<double>{6, 15}));
  EXPECT_EQ(sum(a, {0, 1}).shape(), (Shape{}));
  EXPECT_THROW(sum(a, {0, 0}), Error);
  EXPECT_THROW(sum(a, {2}), Error);
  Generator gen(38);
  Tensor x = leaf({2, 3, 4}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return sum(t, {1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return sum(t, {0, 2}, true); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return sum(t, {}); }, x));
}

TEST(Softmax, RowsSumToOneAlongTheDimension) {
  Tensor x = f64({1, 2, 3, 1000, 1000, 1000}, {2, 3});
  std::vector<double> y = softmax(x).to_vector<double>();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(y[0], std::exp(1.0) / z, 1e-15);
  EXPECT_NEAR(y[2], std::exp(3.0) / z, 1e-15);
  EXPECT_NEAR(y[4], 1.0 / 3.0, 1e-15);  // large logits: the maximum is subtracted, nothing overflows
  // Along dimension 0: columns sum to one.
  std::vector<double> c = softmax(f64({0, 1, 2, 3}, {2, 2}), 0).to_vector<double>();
  EXPECT_NEAR(c[0] + c[2], 1.0, 1e-15);
  EXPECT_NEAR(c[0], 1.0 / (1.0 + std::exp(2.0)), 1e-15);
  EXPECT_THROW(softmax(x, 2), Error);
}

TEST(Softmax, Gradients) {
  Generator gen(37);
  Tensor x = leaf({3, 5}, gen, -2, 2), y = leaf({2, 3, 4}, gen, -2, 2);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return softmax(t); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return softmax(t, 1); }, y));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return softmax(t, 0); }, y));
}

}  // namespace
}  // namespace tandem::testing
