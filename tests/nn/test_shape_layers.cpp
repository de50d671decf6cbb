// Shape layers and products: Gemm (SINGA's), Reshape, and pooling over one dimension.
#include <gtest/gtest.h>

#include "tandem/autograd.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"

using namespace tandem;

namespace {

void expect_same(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], tol) << "element " << i;
}

TEST(ShapeLayers, GemmIsAlphaXWPlusBetaBias) {
  Generator gen(3);
  nn::Gemm g(4, 3, gen, 0.5, 2.0);  // transB: weight [3, 4]
  EXPECT_EQ(g.weight.shape(), (Shape{3, 4}));
  EXPECT_EQ(g.bias.shape(), (Shape{1, 3}));
  g.bias.detach().fill_(0.25);
  Tensor x = Tensor::uniform({5, 4}, -1, 1, gen);
  Tensor y = g(x);
  expect_same(y, add_scalar(scale(matmul(x, transpose(g.weight, 0, 1)), 0.5), 0.5), 1e-6);
  backward(sum(y));
  ASSERT_TRUE(g.weight.grad().defined() && g.bias.grad().defined());
  expect_same(g.bias.grad(), Tensor::full({1, 3}, 2.0 * 5), 1e-6);  // beta * rows
  nn::Gemm plain(4, 2, gen, 1.0, 1.0, true, false, false);  // transA: x [in, N]; weight [in, out]
  EXPECT_EQ(plain.weight.shape(), (Shape{4, 2}));
  EXPECT_FALSE(plain.bias.defined());
  expect_same(plain(transpose(x, 0, 1)), matmul(x, plain.weight), 1e-6);
  EXPECT_EQ(plain.named_parameters().size(), 1u);
}

TEST(ShapeLayers, ReshapeAndPool1d) {
  Generator gen(4);
  Tensor x = Tensor::uniform({2, 3, 8}, -1, 1, gen);
  EXPECT_EQ(nn::Reshape({6, -1})(x).shape(), (Shape{6, 8}));
  Tensor m = nn::MaxPool1d(2)(x), a = nn::AvgPool1d(4, 2)(x);
  EXPECT_EQ(m.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(a.shape(), (Shape{2, 3, 3}));
  expect_same(m, amax(reshape(x, {2, 3, 4, 2}), {3}), 0.0);
  expect_same(slice(a, 2, 1, 1), mean(slice(x, 2, 2, 4), {2}, true), 1e-6);
  // [N, C, 1, W] as SINGA's layers take it.
  EXPECT_EQ(nn::MaxPool1d(2)(unsqueeze(x, {2})).shape(), (Shape{2, 3, 1, 4}));
  EXPECT_THROW(nn::MaxPool1d(2)(Tensor::zeros({2, 8})), Error);
}

}  // namespace
