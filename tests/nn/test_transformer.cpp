// SelfAttention, FeedForward and TransformerBlock: their parameters, outputs against the ops they are made of,
// f64 finite-difference gradients of the block (input and every parameter), dropout only in training, and the
// key-value cache of SelfAttention.
#include <gtest/gtest.h>

#include <cmath>

#include "core/tensor_impl.h"
#include "ops/gradcheck.h"
#include "tandem/autograd.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"

using namespace tandem;

namespace {

void to_f64(nn::Module& m) {
  for (auto& [name, t] : m.named_parameters()) {
    Tensor d = t.detach().to(DType::f64).contiguous();
    TensorImpl* impl = t.impl();
    impl->storage = d.impl()->storage;
    impl->strides = d.impl()->strides;
    impl->offset = d.impl()->offset;
    impl->dtype = DType::f64;
  }
}

// Parameters drawn again from U(lo, hi): biases and LayerNorm weights away from their zeros and ones.
void randomise(nn::Module& m, Generator& gen, double lo = -0.5, double hi = 0.5) {
  NoGradGuard ng;
  for (auto& [name, t] : m.named_parameters()) {
    Tensor(t).copy_(Tensor::uniform(t.shape(), lo, hi, gen, t.dtype()));
    if (name.find("ln_") != std::string::npos && name.find(".weight") != std::string::npos)
      Tensor(t).copy_(add_scalar(t, 1.0));
  }
}

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

void expect_same(const Tensor& a, const Tensor& b, double tol, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], tol) << what << " element " << i;
}

// The block written out from the ops.
Tensor block_by_hand(nn::TransformerBlock& blk, const Tensor& x, int64_t heads) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hd = c / heads;
  auto ln = [&](const nn::LayerNorm& l, const Tensor& y) { return layer_norm(y, {c}, l.weight, l.bias, 1e-5); };
  Tensor y = ln(*blk.ln_1, x);
  Tensor qkv = linear(y, blk.attn->c_attn->weight, blk.attn->c_attn->bias);
  auto head = [&](int64_t i) {
    return permute(reshape(slice(qkv, 2, i * c, c), {b, t, heads, hd}), {0, 2, 1, 3});
  };
  Tensor a = scaled_dot_product_attention(head(0), head(1), head(2), blk.options().causal);
  a = reshape(permute(a, {0, 2, 1, 3}), {b, t, c});
  Tensor h = add(x, linear(a, blk.attn->c_proj->weight, blk.attn->c_proj->bias));
  Tensor m = gelu(linear(ln(*blk.ln_2, h), blk.mlp->c_fc->weight, blk.mlp->c_fc->bias), true);
  return add(h, linear(m, blk.mlp->c_proj->weight, blk.mlp->c_proj->bias));
}

}  // namespace

TEST(TransformerBlock, ParametersAreGpt2s) {
  Generator gen(1);
  nn::TransformerBlock blk(8, 2, gen);
  EXPECT_EQ(names(blk), (std::vector<std::string>{"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                                   "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                                   "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                                                   "mlp.c_proj.bias"}));
  EXPECT_EQ(blk.num_parameters(), 12 * 8 * 8 + 13 * 8);
  EXPECT_EQ(blk.attn->c_attn->weight.shape(), (Shape{24, 8}));
  EXPECT_EQ(blk.mlp->c_fc->weight.shape(), (Shape{32, 8}));
  nn::TransformerBlockOptions o;
  o.bias = false;
  o.mlp_ratio = 2;
  nn::TransformerBlock nb(8, 4, gen, o);
  EXPECT_EQ(nb.num_parameters(), 2 * 8 + 3 * 64 + 64 + 2 * 2 * 64);
  EXPECT_EQ(blk.describe(), "TransformerBlock(8, 2 heads, causal)");
}

TEST(TransformerBlock, IsPreNormAttentionThenMlp) {
  Generator gen(2);
  for (bool causal : {true, false}) {
    nn::TransformerBlockOptions o;
    o.causal = causal;
    nn::TransformerBlock blk(8, 2, gen, o);
    randomise(blk, gen);
    Tensor x = Tensor::uniform({2, 5, 8}, -1, 1, gen);
    expect_same(blk.forward(x), block_by_hand(blk, x, 2), 1e-5, causal ? "causal" : "not causal");
  }
  // Causal: a position's output does not depend on later positions.
  nn::TransformerBlock blk(8, 2, gen);
  Tensor x = Tensor::uniform({1, 6, 8}, -1, 1, gen);
  Tensor x2 = concat({x.narrow(1, 0, 4), Tensor::full({1, 2, 8}, 0.3)}, 1);
  expect_same(blk.forward(x2).narrow(1, 0, 4).contiguous(), blk.forward(x).narrow(1, 0, 4).contiguous(), 1e-6,
              "causal prefix");
}

TEST(TransformerBlock, Gpt2Initialisation) {
  Generator gen(3);
  nn::TransformerBlockOptions o;
  o.residual_layers = 8;
  o.init_std = 0.05;
  nn::TransformerBlock blk(128, 4, gen, o);
  auto stddev = [](const Tensor& t) {
    double s2 = 0;
    for (double v : t.to_vector<double>()) s2 += v * v;
    return std::sqrt(s2 / t.numel());
  };
  EXPECT_NEAR(stddev(blk.attn->c_attn->weight), 0.05, 0.003);
  EXPECT_NEAR(stddev(blk.mlp->c_fc->weight), 0.05, 0.003);
  EXPECT_NEAR(stddev(blk.attn->c_proj->weight), 0.05 / 4, 0.001);
  EXPECT_NEAR(stddev(blk.mlp->c_proj->weight), 0.05 / 4, 0.001);
  EXPECT_EQ(stddev(blk.attn->c_attn->bias), 0.0);
}

// f64 central differences for the input and every parameter, causal and not, with and without biases.
TEST(TransformerBlock, GradCheckF64) {
  Generator gen(4);
  for (bool causal : {true, false}) {
    for (bool bias : {true, false}) {
      nn::TransformerBlockOptions o;
      o.causal = causal;
      o.bias = bias;
      nn::TransformerBlock blk(8, 2, gen, o);
      to_f64(blk);
      randomise(blk, gen);
      std::vector<Tensor> inputs = {tandem::testing::leaf({2, 3, 8}, gen)};
      for (const auto& [n, p] : blk.named_parameters()) inputs.push_back(p);
      EXPECT_TRUE(tandem::testing::gradcheck([&](const std::vector<Tensor>& in) { return blk.forward(in[0]); }, inputs))
          << "causal " << causal << ", bias " << bias;
    }
  }
}

TEST(TransformerBlock, DropoutOnlyInTraining) {
  Generator gen(5);
  nn::TransformerBlockOptions o;
  o.dropout = 0.4;
  nn::TransformerBlock blk(8, 2, gen, o);
  Tensor x = Tensor::uniform({2, 4, 8}, -1, 1, gen);
  NoGradGuard ng;
  EXPECT_NE(blk.forward(x).to_vector<float>(), blk.forward(x).to_vector<float>());
  blk.eval();
  EXPECT_EQ(blk.forward(x).to_vector<float>(), blk.forward(x).to_vector<float>());
  expect_same(blk.forward(x), block_by_hand(blk, x, 2), 1e-5, "evaluation: no dropout");
}

TEST(TransformerBlock, CachedPositionsGiveTheFullOutput) {
  Generator gen(6);
  for (bool causal : {true, false}) {
    nn::TransformerBlockOptions o;
    o.causal = causal;
    nn::TransformerBlock blk(8, 2, gen, o);
    randomise(blk, gen);
    Tensor x = Tensor::uniform({2, 7, 8}, -1, 1, gen);
    NoGradGuard ng;
    if (causal) {
      nn::KVCache cache;
      std::vector<Tensor> parts = {blk.forward_cached(x.narrow(1, 0, 3).contiguous(), cache, 10)};
      parts.push_back(blk.forward_cached(x.narrow(1, 3, 1).contiguous(), cache, 10));
      parts.push_back(blk.forward_cached(x.narrow(1, 4, 3).contiguous(), cache, 10));
      EXPECT_EQ(cache.length, 7);
      EXPECT_EQ(cache.capacity(), 10);
      expect_same(concat(parts, 1), blk.forward(x), 1e-5, "cached causal");
      try {
        blk.forward_cached(x.narrow(1, 0, 4).contiguous(), cache, 10);
        ADD_FAILURE() << "no error past the capacity";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("4 more positions after 7 exceed the cache's capacity of 10"),
                  std::string::npos)
            << e.what();
      }
      try {
        blk.forward_cached(Tensor::zeros({3, 1, 8}), cache, 10);
        ADD_FAILURE() << "no error for another batch";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("clear it first"), std::string::npos) << e.what();
      }
    } else {
      // Without the mask every position sees every other: the whole sequence at once matches.
      nn::KVCache cache;
      expect_same(blk.forward_cached(x, cache, 7), blk.forward(x), 1e-5, "cached, not causal");
    }
  }
}

TEST(TransformerBlock, Errors) {
  Generator gen(7);
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { nn::TransformerBlock(10, 4, gen); }).find("width 10 must be a positive multiple of heads 4"),
            std::string::npos);
  nn::TransformerBlockOptions o;
  o.dropout = 1.5;
  EXPECT_NE(message([&] { nn::TransformerBlock(8, 2, gen, o); }).find("dropout 1.5"), std::string::npos);
  nn::TransformerBlock blk(8, 2, gen);
  EXPECT_NE(message([&] { blk.forward(Tensor::zeros({2, 3, 6})); }).find("[B, T, 8], got f32[2, 3, 6]"),
            std::string::npos);
  EXPECT_NE(message([&] { blk.attn->forward(Tensor::zeros({3, 8})); }).find("SelfAttention: input must be [B, T, 8]"),
            std::string::npos);
}
