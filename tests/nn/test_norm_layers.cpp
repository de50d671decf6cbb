// LayerNorm, RMSNorm and MultiHeadAttention: parameters by name, outputs against the ops they are made of,
// dropout only in training, gradients reaching every parameter.
#include <gtest/gtest.h>

#include "tandem/autograd.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"

using namespace tandem;

namespace {

void expect_same(const Tensor& a, const Tensor& b, double tol, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], tol) << what << " element " << i;
}

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

}  // namespace

TEST(NormLayers, LayerNormAndRmsNormParameters) {
  nn::LayerNorm ln({6});
  EXPECT_EQ(names(ln), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(nn::LayerNorm({2, 3}, 1e-5, true, false).num_parameters(), 6);
  EXPECT_EQ(nn::LayerNorm({6}, 1e-5, false).num_parameters(), 0);
  nn::RMSNorm rms({6});
  EXPECT_EQ(names(rms), (std::vector<std::string>{"weight"}));
  Generator gen(1);
  Tensor x = Tensor::uniform({3, 6}, -1, 1, gen);
  expect_same(ln.forward(x), layer_norm(x, {6}, ln.weight, ln.bias), 0.0, "LayerNorm");
  expect_same(rms.forward(x), rms_norm(x, {6}, rms.weight, rms.eps()), 0.0, "RMSNorm");
  EXPECT_EQ(ln.describe(), "LayerNorm([6], eps 1e-05)");
}

TEST(NormLayers, MultiHeadAttentionIsItsProjectionsAroundAttention) {
  Generator gen(2);
  nn::MultiHeadAttention mha(8, 2, gen, /*causal=*/true);
  EXPECT_EQ(names(mha), (std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                                   "v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(mha.num_parameters(), 4 * (8 * 8 + 8));
  Tensor x = Tensor::uniform({2, 5, 8}, -1, 1, gen);
  Tensor y = mha.forward(x);
  // The same by hand: heads of 4 split from the projections.
  auto heads = [](const Tensor& t) { return permute(reshape(t, {2, 5, 2, 4}), {0, 2, 1, 3}); };
  Tensor rows = reshape(x, {10, 8});
  Tensor q = heads(mha.q_proj->forward(rows)), k = heads(mha.k_proj->forward(rows)), v = heads(mha.v_proj->forward(rows));
  Tensor a = reshape(permute(scaled_dot_product_attention(q, k, v, true), {0, 2, 1, 3}), {10, 8});
  expect_same(y, reshape(mha.out_proj->forward(a), {2, 5, 8}), 1e-6, "MultiHeadAttention");
  // The first position attends only to itself: changing later positions leaves its output alone.
  Tensor x2 = concat({x.narrow(1, 0, 3), Tensor::full({2, 2, 8}, 0.5)}, 1);
  expect_same(mha.forward(x2).narrow(1, 0, 3).contiguous(), y.narrow(1, 0, 3).contiguous(), 1e-6, "causal prefix");
  // Every parameter gets a gradient.
  backward(sum(mha.forward(x)));
  for (const auto& [n, p] : mha.named_parameters()) EXPECT_TRUE(p.grad().defined()) << n;
  // Cross-attention over a longer sequence.
  Tensor kv = Tensor::uniform({2, 7, 8}, -1, 1, gen);
  EXPECT_EQ(mha.forward(x, kv, kv).shape(), (Shape{2, 5, 8}));
}

TEST(NormLayers, AttentionDropoutOnlyInTraining) {
  Generator gen(3);
  nn::MultiHeadAttention mha(8, 2, gen, false, true, 0.5, 9);
  Tensor x = Tensor::uniform({1, 6, 8}, -1, 1, gen);
  NoGradGuard ng;
  Tensor a = mha.forward(x), b = mha.forward(x);
  EXPECT_NE(a.to_vector<float>(), b.to_vector<float>());  // a new mask each call
  mha.eval();
  expect_same(mha.forward(x), mha.forward(x), 0.0, "evaluation is deterministic");
}
