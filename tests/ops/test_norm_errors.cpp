// The softmax, normalisation, loss and attention ops and layers reject bad shapes, axes and arguments with
// an Input error naming the op, the shapes and the axis.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tandem/nn/layers.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one mentioning '" << *fragments.begin() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
    for (const char* frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << "'" << frag << "' missing from: " << e.what();
  }
}

TEST(NormErrors, SoftmaxAxes) {
  Tensor x = Tensor::zeros({2, 3});
  expect_error([&] { softmax(x, 2); }, {"softmax", "dimension 2", "out of range", "f32[2, 3]"});
  expect_error([&] { log_softmax(x, -3); }, {"log_softmax", "dimension -3", "f32[2, 3]"});
  expect_error([&] { log_softmax(Tensor::zeros({})); }, {"log_softmax", "no dimension"});
  expect_error([&] { softmax(Tensor::zeros({3}, DType::i64)); }, {"softmax", "floating"});
}

TEST(NormErrors, LayerAndRmsNorm) {
  Tensor x = Tensor::zeros({2, 3, 4});
  expect_error([&] { layer_norm(x, {5}); }, {"layer_norm", "normalized_shape [5]", "[2, 3, 4]"});
  expect_error([&] { layer_norm(x, {3}); }, {"layer_norm", "trailing dimensions"});
  expect_error([&] { layer_norm(x, {}); }, {"layer_norm", "normalized_shape []"});
  expect_error([&] { layer_norm(x, {1, 2, 3, 4}); }, {"layer_norm", "between 1 and 3"});
  expect_error([&] { layer_norm(x, {4}, Tensor::ones({3})); }, {"layer_norm", "weight", "f32[3]", "[4]"});
  expect_error([&] { layer_norm(x, {4}, Tensor::ones({4}), Tensor::zeros({4}, DType::f64)); },
               {"layer_norm", "bias", "differ in dtype"});
  expect_error([&] { layer_norm(x, {4}, Tensor(), Tensor(), -1.0); }, {"layer_norm", "eps"});
  expect_error([&] { rms_norm(x, {3, 5}); }, {"rms_norm", "[3, 5]", "[2, 3, 4]"});
  expect_error([&] { rms_norm(x, {4}, Tensor::ones({4}, DType::f64)); }, {"rms_norm", "weight", "differ in dtype"});
}

TEST(NormErrors, Losses) {
  Tensor logits = Tensor::zeros({2, 3, 5});
  expect_error([&] { softmax_cross_entropy(logits, Tensor::zeros({2, 4}, DType::i64), Reduction::Mean); },
               {"softmax_cross_entropy", "targets i64[2, 4]", "f32[2, 3, 5]", "[2, 3]"});
  expect_error([&] { softmax_cross_entropy(logits, Tensor::zeros({2, 3}), Reduction::Mean); },
               {"softmax_cross_entropy", "class indices", "f32[2, 3]"});
  expect_error([&] { softmax_cross_entropy(logits, Tensor::full({2, 3}, 7, DType::i64), Reduction::Sum); },
               {"softmax_cross_entropy", "target 7", "outside [0, 5)", "ignored index -100"});
  expect_error([&] { softmax_cross_entropy(Tensor::zeros({}), Tensor::zeros({}, DType::i64), Reduction::Mean); },
               {"softmax_cross_entropy", "class dimension"});
  expect_error([&] { nll_loss(logits, Tensor::full({2, 3}, -1, DType::i64)); }, {"nll_loss", "target -1"});
  expect_error([&] { mse_loss(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})); },
               {"mse_loss", "f32[2, 3]", "f32[3, 2]", "differ in shape"});
  expect_error([&] { binary_cross_entropy(Tensor::zeros({2}), Tensor::zeros({2}, DType::i64)); },
               {"binary_cross_entropy", "target", "floating"});
  expect_error([&] { binary_cross_entropy_with_logits(Tensor::zeros({2}), Tensor::zeros({3})); },
               {"binary_cross_entropy_with_logits", "differ in shape"});
  expect_error([&] { parse_reduction("avg", "mse_loss"); }, {"mse_loss", "'avg'", "'none', 'mean', 'sum'"});
  EXPECT_EQ(parse_reduction("sum"), Reduction::Sum);
  EXPECT_STREQ(reduction_name(Reduction::None), "none");
  // The two-argument form keeps its own rules.
  expect_error([&] { softmax_cross_entropy(Tensor::zeros({3, 4}), Tensor::zeros({3})); }, {"labels must be i32 or i64"});
}

TEST(NormErrors, Attention) {
  Tensor q = Tensor::zeros({1, 2, 4, 8}), k = Tensor::zeros({1, 2, 5, 8}), v = Tensor::zeros({1, 2, 5, 8});
  expect_error([&] { scaled_dot_product_attention(Tensor::zeros({2, 4, 8}), k, v); },
               {"scaled_dot_product_attention", "query", "4 dimensions", "f32[2, 4, 8]"});
  expect_error([&] { scaled_dot_product_attention(q, Tensor::zeros({1, 2, 5, 4}), v); },
               {"scaled_dot_product_attention", "head size 4", "dimension 3"});
  expect_error([&] { scaled_dot_product_attention(q, k, Tensor::zeros({1, 2, 6, 8})); },
               {"scaled_dot_product_attention", "6 positions", "dimension 2"});
  expect_error([&] { scaled_dot_product_attention(q, Tensor::zeros({1, 3, 5, 8}), v); },
               {"scaled_dot_product_attention", "agree in batch", "heads must be the same number, dividing the query's"});
  expect_error([&] { scaled_dot_product_attention(q, k, v, false, 0.1); }, {"scaled_dot_product_attention", "generator"});
  expect_error([&] { packed_self_attention(Tensor::zeros({2, 4, 8}), 2); },
               {"packed_self_attention", "f32[2, 4, 8]", "2 heads", "multiple of 3 x 2"});
  expect_error([&] { packed_self_attention(Tensor::zeros({4, 12}), 2); }, {"packed_self_attention", "qkv", "3 dimensions"});
  expect_error([&] { linear_cross_entropy(Tensor::zeros({2, 3, 4}), Tensor::zeros({5, 6}), Tensor::zeros({2, 3}, DType::i64)); },
               {"linear_cross_entropy", "f32[2, 3, 4]", "6 features"});
  expect_error([&] { linear_cross_entropy(Tensor::zeros({2, 3, 4}), Tensor::zeros({5, 4}), Tensor::zeros({2, 4}, DType::i64)); },
               {"linear_cross_entropy", "targets", "[2, 3]"});
  Generator gen(1);
  expect_error([&] { scaled_dot_product_attention(q, k, v, false, 1.0, 0.0, &gen); }, {"outside [0, 1)"});
  expect_error([&] { scaled_dot_product_attention(q, k, Tensor::zeros({1, 2, 5, 8}, DType::f64)); },
               {"scaled_dot_product_attention", "differ in dtype"});
}

TEST(NormErrors, Layers) {
  Generator gen(1);
  expect_error([&] { nn::MultiHeadAttention(10, 3, gen); }, {"MultiHeadAttention", "embed_dim 10", "num_heads 3"});
  expect_error([&] { nn::LayerNorm(Shape{}); }, {"LayerNorm", "at least one dimension"});
  expect_error([&] { nn::RMSNorm(Shape{0}); }, {"RMSNorm", "positive"});
  nn::MultiHeadAttention mha(8, 2, gen);
  expect_error([&] { mha.forward(Tensor::zeros({2, 3, 6})); }, {"MultiHeadAttention", "[B, T, 8]", "f32[2, 3, 6]"});
}

}  // namespace
}  // namespace tandem
