// Finite-difference gradient checks of the layer ops: matrix products, convolution, pooling,
// normalisation, dropout and the loss.
#include <algorithm>

#include "gradcheck.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;

TEST(GradCheck, Matmul) {
  Generator gen(11);
  Tensor a = leaf({3, 5}, gen), b = leaf({5, 4}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], t[1]); }, {a, b}));
  Tensor v = leaf({1, 7}, gen), m = leaf({7, 1}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], t[1]); }, {v, m}));
}

TEST(GradCheck, LinearWithAndWithoutBias) {
  Generator gen(12);
  Tensor x = leaf({4, 6}, gen), w = leaf({3, 6}, gen), b = leaf({3}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear(t[0], t[1], t[2]); }, {x, w, b}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear(t[0], t[1], Tensor()); }, {x, w}));
  // A frozen weight: gradients for the input and bias only.
  Tensor frozen = Tensor::uniform({3, 6}, -1, 1, gen, DType::f64);
  EXPECT_TRUE(gradcheck([&](const Ts& t) { return linear(t[0], frozen, t[1]); }, {x, b}));
}

// GPT-2's MLP as one op: every input and parameter, frozen parameters, and the composition it stands for.
TEST(GradCheck, GeluMlp) {
  Generator gen(13);
  Tensor x = leaf({2, 3, 4}, gen), w1 = leaf({8, 4}, gen), b1 = leaf({8}, gen), w2 = leaf({5, 8}, gen),
         b2 = leaf({5}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return gelu_mlp(t[0], t[1], t[2], t[3], t[4]); }, {x, w1, b1, w2, b2}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return gelu_mlp(t[0], t[1], Tensor(), t[2], Tensor()); }, {x, w1, w2}));
  // Only the first layer's parameters, then only the second's, take a gradient.
  const Tensor fw1 = w1.detach(), fb1 = b1.detach(), fw2 = w2.detach(), fb2 = b2.detach();
  EXPECT_TRUE(gradcheck([&](const Ts& t) { return gelu_mlp(t[0], t[1], t[2], fw2, fb2); }, {x, w1, b1}));
  EXPECT_TRUE(gradcheck([&](const Ts& t) { return gelu_mlp(x.detach(), fw1, fb1, t[0], t[1]); }, {w2, b2}));
  const Tensor fused = gelu_mlp(x, w1, b1, w2, b2), plain = linear(gelu(linear(x, w1, b1), true), w2, b2);
  const std::vector<double> a = fused.contiguous().to_vector<double>(), e = plain.contiguous().to_vector<double>();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], e[i], 1e-12) << i;
  EXPECT_THROW(gelu_mlp(x, w1, b1, leaf({5, 7}, gen), b2), Error);
  EXPECT_THROW(gelu_mlp(x, w1, b1, w2, Tensor()), Error);
}

// A residual connection taken by the product: every input, the residual included, against finite differences
// and against the composition; a layer norm reading the same input as the residual (its gradient then added
// into the residual's by the norm's backward); bad residuals.
TEST(GradCheck, LinearResidual) {
  Generator gen(14);
  Tensor x = leaf({2, 3, 6}, gen), w = leaf({6, 6}, gen), b = leaf({6}, gen), r = leaf({2, 3, 6}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear_residual(t[0], t[1], t[2], t[3]); }, {x, w, b, r}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear_residual(t[0], t[1], Tensor(), t[2]); }, {x, w, r}));
  Tensor g = leaf({6}, gen), beta = leaf({6}, gen);
  EXPECT_TRUE(gradcheck(
      [](const Ts& t) { return linear_residual(layer_norm(t[0], {6}, t[3], t[4]), t[1], t[2], t[0]); },
      {x, w, b, g, beta}));
  const Tensor fused = linear_residual(x, w, b, r), plain = add(r, linear(x, w, b));
  const std::vector<double> a = fused.contiguous().to_vector<double>(), e = plain.contiguous().to_vector<double>();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], e[i], 1e-12) << i;
  EXPECT_THROW(linear_residual(x, w, b, leaf({2, 3, 5}, gen)), Error);
  EXPECT_THROW(linear_residual(x, w, b, Tensor()), Error);
  Tensor wide = leaf({4, 6}, gen);
  EXPECT_THROW(linear_residual(x, wide, Tensor(), r), Error);  // the output is [2, 3, 4]
}

TEST(GradCheck, GeluMlpResidual) {
  Generator gen(15);
  Tensor x = leaf({2, 3, 4}, gen), w1 = leaf({8, 4}, gen), b1 = leaf({8}, gen), w2 = leaf({4, 8}, gen),
         b2 = leaf({4}, gen), r = leaf({2, 3, 4}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return gelu_mlp(t[0], t[1], t[2], t[3], t[4], t[5]); },
                        {x, w1, b1, w2, b2, r}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return gelu_mlp(t[0], t[1], Tensor(), t[2], Tensor(), t[3]); }, {x, w1, w2, r}));
  const Tensor fused = gelu_mlp(x, w1, b1, w2, b2, r), plain = add(r, gelu_mlp(x, w1, b1, w2, b2));
  const std::vector<double> a = fused.contiguous().to_vector<double>(), e = plain.contiguous().to_vector<double>();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], e[i], 1e-12) << i;
  EXPECT_THROW(gelu_mlp(x, w1, b1, w2, b2, leaf({2, 3, 8}, gen)), Error);
}

struct ConvCase {
  Shape x, w;
  Conv2dOptions opt;
  bool bias;
};

TEST(GradCheck, Conv2d) {
  const ConvCase cases[] = {
      {{2, 3, 6, 5}, {4, 3, 3, 3}, {{1, 1}, {0, 0}}, true},
      {{2, 2, 7, 6}, {3, 2, 3, 2}, {{2, 2}, {1, 1}}, true},   // stride 2, padding 1, non-square kernel
      {{1, 2, 5, 6}, {2, 2, 2, 3}, {{1, 2}, {2, 1}}, false},  // mixed strides, padding 2
      {{3, 4, 4, 4}, {2, 4, 1, 1}, {{1, 1}, {0, 0}}, true},   // pointwise
      {{2, 1, 8, 8}, {3, 1, 5, 5}, {{1, 1}, {0, 0}}, true},   // the CNN's first layer shape, smaller
  };
  Generator gen(13);
  for (const ConvCase& c : cases) {
    Tensor x = leaf(c.x, gen), w = leaf(c.w, gen);
    Tensor b = c.bias ? leaf({c.w[0]}, gen) : Tensor();
    Conv2dOptions opt = c.opt;
    if (c.bias)
      EXPECT_TRUE(gradcheck([opt](const Ts& t) { return conv2d(t[0], t[1], t[2], opt); }, {x, w, b}))
          << shape_str(c.x) << " * " << shape_str(c.w);
    else
      EXPECT_TRUE(gradcheck([opt](const Ts& t) { return conv2d(t[0], t[1], Tensor(), opt); }, {x, w}))
          << shape_str(c.x) << " * " << shape_str(c.w);
  }
  // Only the bias requires a gradient: the weight gradient is skipped, the bias one still computed.
  Tensor x = Tensor::uniform({2, 2, 5, 5}, -1, 1, gen, DType::f64);
  Tensor w = Tensor::uniform({3, 2, 3, 3}, -1, 1, gen, DType::f64);
  Tensor b = leaf({3}, gen);
  EXPECT_TRUE(gradcheck([&](const Ts& t) { return conv2d(x, w, t[0]); }, {b}));
}

TEST(GradCheck, GroupedConv2d) {
  struct GroupCase {
    Shape x, w;
    Conv2dOptions opt;
    bool bias;
  };
  const GroupCase cases[] = {
      {{2, 4, 6, 5}, {6, 2, 3, 3}, {{1, 1}, {0, 0}, false, 2}, true},
      {{2, 6, 7, 6}, {3, 2, 3, 2}, {{2, 2}, {1, 1}, false, 3}, true},  // stride 2, padding 1, non-square kernel
      {{2, 3, 5, 5}, {3, 1, 3, 3}, {{1, 1}, {1, 1}, false, 3}, false},  // depthwise (SeparableConv2d's first half)
      {{1, 2, 5, 4}, {4, 1, 3, 3}, {{1, 1}, {1, 1}, true, 2}, true},    // depthwise, two filters per channel, ReLU
      {{3, 4, 4, 4}, {6, 2, 1, 1}, {{1, 1}, {0, 0}, false, 2}, true},   // grouped pointwise
  };
  Generator gen(17);
  for (const GroupCase& c : cases) {
    Tensor x = leaf(c.x, gen), w = leaf(c.w, gen);
    Tensor b = c.bias ? leaf({c.w[0]}, gen) : Tensor();
    const Conv2dOptions opt = c.opt;
    const std::string what = shape_str(c.x) + " * " + shape_str(c.w) + " in " + std::to_string(opt.groups) + " groups";
    if (c.bias)
      EXPECT_TRUE(gradcheck([opt](const Ts& t) { return conv2d(t[0], t[1], t[2], opt); }, {x, w, b})) << what;
    else
      EXPECT_TRUE(gradcheck([opt](const Ts& t) { return conv2d(t[0], t[1], Tensor(), opt); }, {x, w})) << what;
  }
}

// A grouped convolution is the channel-wise concatenation of one ordinary convolution per group, each
// over its slice of the input channels with its slice of the filters.
TEST(Conv2dGroups, EqualSeparateConvolutionsPerGroup) {
  Generator gen(18);
  const int64_t groups = 3, cg = 2, kg = 2;
  Tensor x = Tensor::uniform({2, groups * cg, 6, 7}, -1, 1, gen, DType::f64);
  Tensor w = Tensor::uniform({groups * kg, cg, 3, 3}, -1, 1, gen, DType::f64);
  Tensor b = Tensor::uniform({groups * kg}, -1, 1, gen, DType::f64);
  const Conv2dOptions opt{{2, 1}, {1, 1}, false, static_cast<int>(groups)};
  const Tensor y = conv2d(x, w, b, opt);
  ASSERT_EQ(y.shape(), Shape({2, groups * kg, 3, 7}));
  for (int64_t j = 0; j < groups; ++j) {
    const Tensor part = conv2d(x.narrow(1, j * cg, cg).contiguous(), w.narrow(0, j * kg, kg).contiguous(),
                               b.narrow(0, j * kg, kg).contiguous(), {{2, 1}, {1, 1}});
    const std::vector<double> want = part.to_vector<double>();
    const std::vector<double> got = y.narrow(1, j * kg, kg).contiguous().to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << "group " << j << " element " << i;
  }
}

// Distinct values at least 0.01 apart, shuffled: no ties, and +-eps never changes a window's maximum.
Tensor tie_free(const Shape& shape, Generator& gen) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.01 * static_cast<double>(i) - 0.005 * static_cast<double>(n);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[gen.next_below(static_cast<uint64_t>(i + 1))]);
  Tensor t = Tensor::from_vector(v, shape);
  t.requires_grad_();
  return t;
}

TEST(GradCheck, MaxPool2d) {
  Generator gen(14);
  const Pool2dOptions opts[] = {{{2, 2}, {2, 2}, {0, 0}}, {{3, 3}, {2, 2}, {1, 1}}, {{3, 2}, {1, 2}, {1, 0}}};
  for (const Pool2dOptions& o : opts) {
    Tensor x = tie_free({2, 3, 7, 6}, gen);
    EXPECT_TRUE(gradcheck1([o](const Tensor& t) { return max_pool2d(t, o); }, x));
  }
}

TEST(GradCheck, AvgPool2dWithPadding) {
  Generator gen(15);
  const Pool2dOptions opts[] = {{{2, 2}, {2, 2}, {0, 0}}, {{3, 3}, {2, 2}, {1, 1}}, {{4, 3}, {1, 2}, {2, 1}}};
  for (const Pool2dOptions& o : opts) {
    Tensor x = leaf({2, 2, 7, 6}, gen);
    EXPECT_TRUE(gradcheck1([o](const Tensor& t) { return avg_pool2d(t, o); }, x));
  }
}

// ONNX's pooling geometry: asymmetric pads, ceil mode (windows that overhang the padded input) and the mean
// over the input elements only, for both pools.
TEST(GradCheck, Pool2dCeilModeAndAsymmetricPads) {
  Generator gen(17);
  const Pool2dOptions opts[] = {{{2, 2}, {2, 2}, {1, 1}, {-1, -1}, true, true},
                                {{2, 2}, {2, 2}, {1, 1}, {-1, -1}, true, false},
                                {{3, 3}, {2, 2}, {1, 0}, {0, 1}, true, true},
                                {{3, 2}, {2, 3}, {0, 1}, {1, 0}, false, false}};
  for (const Pool2dOptions& o : opts) {
    Tensor x = tie_free({2, 2, 7, 6}, gen);
    EXPECT_TRUE(gradcheck1([o](const Tensor& t) { return max_pool2d(t, o); }, x));
    Tensor y = leaf({2, 2, 7, 6}, gen);
    EXPECT_TRUE(gradcheck1([o](const Tensor& t) { return avg_pool2d(t, o); }, y));
  }
}

// The output sizes and means ONNX gives: a 5x5 input, kernel 2, stride 2, pads 1 in ceil mode is 3x3 (a 4th
// window would start in the trailing padding), and ceil mode's overhang never counts in the divisor.
TEST(Pool2d, CeilModeSizesAndDivisors) {
  std::vector<double> v(25);
  for (int i = 0; i < 25; ++i) v[i] = i + 1;
  Tensor x = Tensor::from_vector(v, {1, 1, 5, 5}).to(DType::f64);
  const Pool2dOptions ceil_pads{{2, 2}, {2, 2}, {1, 1}, {-1, -1}, true, true};
  Tensor m = max_pool2d(x, ceil_pads);
  ASSERT_EQ(m.shape(), Shape({1, 1, 3, 3}));
  EXPECT_EQ(m.to_vector<double>(), (std::vector<double>{1, 3, 5, 11, 13, 15, 21, 23, 25}));
  // count_include_pad: the corner window covers one input element and three padded positions (divisor 4);
  // the last window in ceil mode covers rows 3..4 and columns 3..4 of the input, inside the padded input.
  Tensor a = avg_pool2d(x, ceil_pads);
  EXPECT_DOUBLE_EQ(a.to_vector<double>()[0], 1.0 / 4);
  EXPECT_DOUBLE_EQ(a.to_vector<double>()[8], (19 + 20 + 24 + 25) / 4.0);
  // No padding, ceil mode: the last row and column of windows overhang a 5x5 input by one; they average the
  // elements they cover, with or without count_include_pad (nothing is padded).
  for (bool count : {true, false}) {
    Tensor b = avg_pool2d(x, {{2, 2}, {2, 2}, {0, 0}, {-1, -1}, true, count});
    ASSERT_EQ(b.shape(), Shape({1, 1, 3, 3}));
    EXPECT_DOUBLE_EQ(b.to_vector<double>()[2], (5 + 10) / 2.0) << count;
    EXPECT_DOUBLE_EQ(b.to_vector<double>()[8], 25.0) << count;
  }
  // Pads 1 before and 0 after, ceil mode, kernel 3, stride 2 on a 5x5 input of ones: windows start at -1, 1
  // and 3; the last one's third row and column lie past the input, where no padding is, and never count.
  Tensor o = Tensor::ones({1, 1, 5, 5}, DType::f64);
  for (bool count : {true, false}) {
    Tensor c = avg_pool2d(o, {{3, 3}, {2, 2}, {1, 1}, {0, 0}, true, count});
    ASSERT_EQ(c.shape(), Shape({1, 1, 3, 3}));
    EXPECT_DOUBLE_EQ(c.to_vector<double>()[0], count ? 4.0 / 9 : 1.0);  // 2x2 input elements of 3x3 positions
    EXPECT_DOUBLE_EQ(c.to_vector<double>()[8], 1.0) << count;              // 2x2 input elements, 2x2 positions
  }
}

TEST(GradCheck, BatchNormTraining) {
  Generator gen(16);
  Tensor x = leaf({4, 3, 3, 2}, gen), gamma = leaf({3}, gen, 0.5, 1.5), beta = leaf({3}, gen);
  Tensor rm = Tensor::zeros({3}, DType::f64), rv = Tensor::ones({3}, DType::f64);
  EXPECT_TRUE(gradcheck(
      [&](const Ts& t) { return batch_norm2d(t[0], t[1], t[2], rm, rv, true, 0.1, 1e-5); }, {x, gamma, beta}));
}

TEST(GradCheck, BatchNormEval) {
  Generator gen(17);
  Tensor x = leaf({3, 2, 4, 3}, gen), gamma = leaf({2}, gen, 0.5, 1.5), beta = leaf({2}, gen);
  Tensor rm = Tensor::uniform({2}, -0.5, 0.5, gen, DType::f64), rv = Tensor::uniform({2}, 0.5, 2.0, gen, DType::f64);
  EXPECT_TRUE(gradcheck(
      [&](const Ts& t) { return batch_norm2d(t[0], t[1], t[2], rm, rv, false, 0.1, 1e-5); }, {x, gamma, beta}));
}

TEST(GradCheck, DropoutWithAFixedMask) {
  Generator probe(18);
  Tensor x = leaf({6, 7}, probe);
  // Each call draws from a fresh generator with the same seed: the same mask every time.
  auto f = [](const Tensor& t) {
    Generator gen(1234);
    return dropout(t, 0.4, true, gen);
  };
  EXPECT_TRUE(gradcheck1(f, x));
  // The mask really drops something and scales the rest.
  NoGradGuard no_grad;
  auto y = f(x).to_vector<double>(), xv = x.to_vector<double>();
  int64_t zeros = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0.0) ++zeros;
    else EXPECT_NEAR(y[i], xv[i] / 0.6, 1e-12);
  }
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, static_cast<int64_t>(y.size()));
}

TEST(GradCheck, SoftmaxCrossEntropy) {
  Generator gen(19);
  for (DType lt : {DType::i32, DType::i64}) {
    Tensor logits = leaf({5, 4}, gen, -2, 2);
    Tensor labels = Tensor::from_vector<int64_t>({0, 3, 1, 1, 2}, {5}).to(lt);
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return softmax_cross_entropy(t, labels); }, logits));
    // Scaled by a later op: the incoming gradient is not 1.
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return scale(softmax_cross_entropy(t, labels), 3.0); }, logits));
  }
}

// Targets [N, C]: one-hot rows, a distribution per row, and rows of any weights (the gradient's
// softmax term is weighed by each row's sum, which is 1 only for distributions).
TEST(GradCheck, SoftmaxCrossEntropyWithTargets) {
  Generator gen(23);
  Tensor logits = leaf({5, 4}, gen, -2, 2);
  std::vector<double> one_hot(20, 0.0);
  for (int64_t i = 0; i < 5; ++i) one_hot[static_cast<size_t>(i * 4 + (i * 3 + 1) % 4)] = 1.0;
  std::vector<double> weights = Tensor::uniform({5, 4}, 0.0, 1.0, gen, DType::f64).to_vector<double>();
  std::vector<double> dist = weights;
  for (int64_t i = 0; i < 5; ++i) {
    double s = 0;
    for (int64_t j = 0; j < 4; ++j) s += dist[static_cast<size_t>(i * 4 + j)];
    for (int64_t j = 0; j < 4; ++j) dist[static_cast<size_t>(i * 4 + j)] /= s;
  }
  for (const auto& tv : {one_hot, dist, weights}) {
    Tensor targets = Tensor::from_vector(tv, {5, 4});
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return softmax_cross_entropy(t, targets); }, logits));
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return scale(softmax_cross_entropy(t, targets), 3.0); }, logits));
  }
}

// One-hot targets, in a float type or an integer one, give the loss and gradient of the class indices.
TEST(GradCheck, OneHotTargetsAreTheClassIndices) {
  Generator gen(29);
  const std::vector<int64_t> idx = {3, 0, 9, 9, 1, 4, 7, 2};
  std::vector<float> hot(8 * 10, 0.0f);
  for (size_t i = 0; i < idx.size(); ++i) hot[i * 10 + static_cast<size_t>(idx[i])] = 1.0f;
  Tensor base = Tensor::uniform({8, 10}, -3.0, 3.0, gen, DType::f32);
  auto loss_and_grad = [&](const Tensor& labels) {
    Tensor x = base.clone().requires_grad_();
    Tensor loss = softmax_cross_entropy(x, labels);
    backward(loss);
    return std::make_pair(loss.item<double>(), x.grad().to_vector<float>());
  };
  const auto [want_loss, want_grad] = loss_and_grad(Tensor::from_vector(idx, {8}));
  for (DType dt : {DType::f32, DType::i32}) {
    const auto [loss, grad] = loss_and_grad(Tensor::from_vector(hot, {8, 10}).to(dt));
    EXPECT_NEAR(loss, want_loss, 1e-6 * want_loss) << dtype_name(dt);
    ASSERT_EQ(grad.size(), want_grad.size());
    for (size_t k = 0; k < grad.size(); ++k) EXPECT_NEAR(grad[k], want_grad[k], 1e-7) << dtype_name(dt) << " " << k;
  }
}

TEST(GradCheck, SmallNetworkEndToEnd) {
  // conv -> relu -> max pool -> flatten -> linear -> softmax cross-entropy, every parameter at once.
  Generator gen(20);
  Tensor x = Tensor::uniform({2, 1, 6, 6}, -1, 1, gen, DType::f64);
  Tensor w1 = leaf({2, 1, 3, 3}, gen), b1 = leaf({2}, gen), w2 = leaf({3, 8}, gen), b2 = leaf({3}, gen);
  Tensor labels = Tensor::from_vector<int32_t>({2, 0}, {2});
  EXPECT_TRUE(gradcheck(
      [&](const Ts& t) {
        Tensor h = max_pool2d(relu(conv2d(x, t[0], t[1])));
        return softmax_cross_entropy(linear(flatten(h), t[2], t[3]), labels);
      },
      {w1, b1, w2, b2}));
}

}  // namespace
}  // namespace tandem::testing
