// Padded rows (ops/padded_rows.h): a layer norm's output written as the first columns of rows that end in a
// one and zeros, read in place by the product after it, whose weight-gradient product then yields the bias
// gradient too. Values and gradients against the plain path and f64; the bias gradient shown to come from
// the column of ones.
#include <gtest/gtest.h>

#include <cmath>

#include "core/tensor_impl.h"
#include "ops/padded_rows.h"
#include "tandem/autograd.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

struct ModeScope {
  explicit ModeScope(int mode) { ops::set_bias_from_product(mode); }
  ~ModeScope() { ops::set_bias_from_product(-1); }
};

::testing::AssertionResult near(const Tensor& expected, const Tensor& actual, double rtol, const char* what) {
  if (!actual.defined() || expected.shape() != actual.shape())
    return ::testing::AssertionFailure() << what << ": " << (actual.defined() ? actual.str() : "undefined")
                                         << " against " << expected.str();
  const auto e = expected.to_vector<double>(), a = actual.to_vector<double>();
  for (size_t i = 0; i < e.size(); ++i)
    if (!(std::fabs(a[i] - e[i]) <= rtol * (1.0 + std::fabs(e[i]))))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << a[i] << ", expected " << e[i];
  return ::testing::AssertionSuccess();
}

TEST(PaddedRows, RowStrideIsTheWidthPlusOneRoundedToEight) {
  EXPECT_EQ(ops::padded_ld(1), 8);
  EXPECT_EQ(ops::padded_ld(7), 8);
  EXPECT_EQ(ops::padded_ld(8), 16);
  EXPECT_EQ(ops::padded_ld(768), 776);
  EXPECT_EQ(ops::padded_ld(3072), 3080);
}

TEST(PaddedRows, LayerNormWritesItsRowsFollowedByAOneAndZeros) {
  Generator gen(4);
  const int64_t c = 5, ld = ops::padded_ld(c);
  Tensor x = Tensor::uniform({2, 3, c}, -1.0, 1.0, gen);
  Tensor w = Tensor::uniform({c}, 0.5, 1.5, gen), b = Tensor::uniform({c}, -0.5, 0.5, gen);
  Tensor y = ops::layer_norm_padded(x, {c}, w, b, 1e-5);
  ASSERT_EQ(y.shape(), Shape({2, 3, c}));
  EXPECT_EQ(y.strides(), Shape({3 * ld, ld, 1}));
  EXPECT_EQ(y.to_vector<float>(), layer_norm(x, {c}, w, b, 1e-5).to_vector<float>());
  const Tensor rows = reshape(y, {6, c});
  const Tensor xp = ops::padded_rows_of(rows);
  ASSERT_TRUE(xp.defined());
  ASSERT_EQ(xp.shape(), Shape({6, ld}));
  const std::vector<float> full = xp.to_vector<float>(), plain = rows.to_vector<float>();
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t j = 0; j < c; ++j) EXPECT_EQ(full[r * ld + j], plain[r * c + j]) << r << ", " << j;
    EXPECT_EQ(full[r * ld + c], 1.0f) << "row " << r;
    for (int64_t j = c + 1; j < ld; ++j) EXPECT_EQ(full[r * ld + j], 0.0f) << r << ", " << j;
  }
  // Rows 2..5 (a view further into the storage) are padded rows too; other views of them and other
  // tensors are not.
  const Tensor tail = ops::padded_rows_of(rows.narrow(0, 2, 4));
  ASSERT_TRUE(tail.defined());
  EXPECT_EQ(tail.storage_offset(), 2 * ld);
  EXPECT_FALSE(ops::padded_rows_of(rows.narrow(1, 0, c - 1)).defined());
  EXPECT_FALSE(ops::padded_rows_of(rows.contiguous()).defined());
  EXPECT_FALSE(ops::padded_rows_of(reshape(layer_norm(x, {c}, w, b, 1e-5), {6, c})).defined());
  EXPECT_FALSE(ops::padded_rows_of(y).defined());  // three dimensions: the product's rows are taken 2-D
  // Over two trailing dimensions the rows are not padded.
  Tensor y2 = ops::layer_norm_padded(x, {3, c}, Tensor(), Tensor(), 1e-5);
  EXPECT_TRUE(y2.is_contiguous());
  EXPECT_EQ(y2.to_vector<float>(), layer_norm(x, {3, c}, Tensor(), Tensor(), 1e-5).to_vector<float>());
}

// A norm feeding a linear layer and the MLP (with a residual), f32: padded against plain rows and against
// f64, every gradient.
TEST(PaddedRows, ProductsReadingPaddedRowsGiveThePlainValuesAndGradients) {
  const int64_t n = 2, t = 9, c = 12, hidden = 20;
  auto run = [&](bool padded, DType dt) {
    Generator g(7);
    Tensor x = Tensor::uniform({n, t, c}, -1.0, 1.0, g, dt).requires_grad_();
    Tensor lw = Tensor::uniform({c}, 0.5, 1.5, g, dt).requires_grad_();
    Tensor lb = Tensor::uniform({c}, -0.5, 0.5, g, dt).requires_grad_();
    Tensor w = Tensor::uniform({c, c}, -0.3, 0.3, g, dt).requires_grad_();
    Tensor b = Tensor::uniform({c}, -0.1, 0.1, g, dt).requires_grad_();
    Tensor w1 = Tensor::uniform({hidden, c}, -0.3, 0.3, g, dt).requires_grad_();
    Tensor b1 = Tensor::uniform({hidden}, -0.1, 0.1, g, dt).requires_grad_();
    Tensor w2 = Tensor::uniform({c, hidden}, -0.3, 0.3, g, dt).requires_grad_();
    Tensor b2 = Tensor::uniform({c}, -0.1, 0.1, g, dt).requires_grad_();
    Tensor r = Tensor::uniform({n, t, c}, -1.0, 1.0, g, dt);
    auto norm = [&](const Tensor& v) {
      return padded ? ops::layer_norm_padded(v, {c}, lw, lb, 1e-5) : layer_norm(v, {c}, lw, lb, 1e-5);
    };
    Tensor h = linear_residual(norm(x), w, b, x);
    Tensor out = gelu_mlp(norm(h), w1, b1, w2, b2, h);
    Tensor y = add(out, linear(norm(out), w, b));
    backward(sum(mul(y, r)));
    return std::vector<Tensor>{y.detach(), x.grad(), lw.grad(), lb.grad(), w.grad(), b.grad(),
                               w1.grad(),  b1.grad(), w2.grad(), b2.grad()};
  };
  const auto plain = run(false, DType::f32), padded = run(true, DType::f32), f64 = run(false, DType::f64);
  const char* names[] = {"output", "x", "norm weight", "norm bias", "w", "b", "w1", "b1", "w2", "b2"};
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(near(plain[i], padded[i], 2e-6, names[i]));
    EXPECT_TRUE(near(f64[i], padded[i], 2e-5, names[i]));
  }
}

// The bias gradient is the product's column of the ones: with that column made 2, the bias gradient of the
// layer reading the rows (a linear layer, the MLP's first) doubles and its weight gradient does not change.
TEST(PaddedRows, TheBiasGradientComesFromTheColumnOfOnes) {
  const int64_t rows = 6, c = 5, out = 3;
  auto run = [&](float pad, bool mlp) {
    Generator g(9);
    Tensor x = Tensor::uniform({rows, c}, -1.0, 1.0, g);
    Tensor w = Tensor::uniform({out, c}, -0.5, 0.5, g).requires_grad_();
    Tensor b = Tensor::uniform({out}, -0.1, 0.1, g).requires_grad_();
    Tensor w2 = Tensor::uniform({c, out}, -0.5, 0.5, g).requires_grad_();
    Tensor b2 = Tensor::uniform({c}, -0.1, 0.1, g).requires_grad_();
    Tensor r = Tensor::uniform({rows, mlp ? c : out}, -1.0, 1.0, g);
    Tensor xn = ops::layer_norm_padded(x, {c}, Tensor(), Tensor(), 1e-5);
    const Tensor xp = ops::padded_rows_of(xn);
    EXPECT_TRUE(xp.defined());
    if (xp.defined()) {
      float* p = static_cast<float*>(xp.data_ptr());
      for (int64_t i = 0; i < rows; ++i) p[i * xp.size(1) + c] = pad;
    }
    backward(sum(mul(mlp ? gelu_mlp(xn, w, b, w2, b2) : linear(xn, w, b), r)));
    return std::make_pair(w.grad().to_vector<float>(), b.grad().to_vector<float>());
  };
  for (bool mlp : {false, true}) {
    const auto ones = run(1.0f, mlp), twos = run(2.0f, mlp);
    EXPECT_EQ(ones.first, twos.first) << (mlp ? "mlp" : "linear");
    ASSERT_EQ(ones.second.size(), static_cast<size_t>(out));
    for (int64_t j = 0; j < out; ++j) {
      EXPECT_NE(ones.second[j], 0.0f);
      EXPECT_FLOAT_EQ(twos.second[j], 2.0f * ones.second[j]) << (mlp ? "mlp " : "linear ") << j;
    }
  }
}

// Where gradients are not recorded, or the setting is off, a transformer block's norms write plain rows;
// the block's values and gradients are the same either way.
TEST(PaddedRows, TransformerBlockGivesTheSameValuesAndGradientsWithPaddedRows) {
  for (double dropout : {0.0, 0.2}) {
    auto run = [dropout](int mode) {
      ModeScope scope(mode);
      Generator gen(11);
      nn::TransformerBlockOptions opt;
      opt.causal = true;
      opt.dropout = dropout;
      nn::TransformerBlock block(16, 2, gen, opt);
      block.train();
      Generator data(12);
      Tensor x = Tensor::uniform({2, 7, 16}, -1.0, 1.0, data).requires_grad_();
      Tensor y = block.forward(x);
      backward(sum(mul(y, y)));
      std::vector<Tensor> out{y.detach(), x.grad()};
      for (auto& [name, p] : block.named_parameters()) out.push_back(p.grad());
      return out;
    };
    const auto off = run(0), on = run(1);
    ASSERT_EQ(off.size(), on.size());
    for (size_t i = 0; i < off.size(); ++i) EXPECT_TRUE(near(off[i], on[i], 2e-6, "block tensor")) << dropout;
  }
  {
    ModeScope scope(1);
    Generator gen(11);
    nn::LayerNorm ln(Shape{16});
    Tensor x = Tensor::uniform({3, 16}, -1.0, 1.0, gen);
    EXPECT_FALSE(ln.forward_padded(x).is_contiguous());
    NoGradGuard no_grad;
    EXPECT_TRUE(ln.forward_padded(x).is_contiguous());
  }
  ModeScope off_scope(0);
  Generator gen(11);
  nn::LayerNorm ln(Shape{16});
  EXPECT_TRUE(ln.forward_padded(Tensor::uniform({3, 16}, -1.0, 1.0, gen)).is_contiguous());
}

}  // namespace
}  // namespace tandem
