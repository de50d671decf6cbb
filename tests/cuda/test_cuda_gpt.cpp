// The GPT on a GPU against the CPU: logits, loss and every gradient in f32, the cached forward against the
// full one (the key-value cache written on the device), greedy sampling's tokens, a bf16 run, and a token
// out of range reported at the next synchronisation, a padded token table.
#include "cuda/cuda_test_util.h"
#include "ops/padded_rows.h"
#include "tandem/autograd.h"
#include "tandem/nn/gpt.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

nn::GptConfig small() {
  nn::GptConfig c;
  c.layers = 2, c.heads = 4, c.width = 64, c.context = 32, c.vocab = 96, c.dropout = 0.0, c.bias = true;
  return c;
}

Tensor tokens(int64_t b, int64_t t, uint64_t seed, int64_t vocab) {
  Generator g(seed);
  std::vector<int32_t> v;
  for (int64_t i = 0; i < b * t; ++i) v.push_back(static_cast<int32_t>(g.next_below(vocab)));
  return Tensor::from_vector(v, {b, t});
}

TEST(CudaGpt, LossAndGradientsMatchTheCpu) {
  REQUIRE_GPU();
  nn::GPT cpu_model(small(), 5), gpu_model(small(), 5);
  gpu_model.to(gpu());
  Tensor x = tokens(2, 32, 1, 96), y = tokens(2, 32, 2, 96);
  Tensor lc = softmax_cross_entropy(cpu_model.forward(x), y, Reduction::Mean);
  Tensor logits_g = gpu_model.forward(x.to(gpu()));
  Tensor lg = softmax_cross_entropy(logits_g, y.to(gpu()), Reduction::Mean);
  expect_norm_close(cpu_model.forward(x), logits_g, 1e-5, "logits");
  EXPECT_NEAR(lg.item<double>(), lc.item<double>(), 1e-5 * lc.item<double>());
  backward(lc);
  backward(lg);
  const auto pc = cpu_model.named_parameters(), pg = gpu_model.named_parameters();
  for (size_t i = 0; i < pc.size(); ++i)
    expect_norm_close(pc[i].second.grad(), pg[i].second.grad(), 1e-4, "gradient of " + pc[i].first);
}

// A GPT whose table is padded (97 tokens in 128 rows, the padding zero, as a Hugging Face GPT-2 is read): the
// model's own loss (the fused head, its padding masked on the device) and every gradient are the CPU's, the
// padding rows' gradient is zero, the logits have the 97 columns, and greedy tokens are the CPU's.
TEST(CudaGpt, APaddedTableGivesTheCpusLossGradientsAndTokens) {
  REQUIRE_GPU();
  nn::GptConfig c = small();
  c.vocab = 128, c.logical_vocab = 97;
  nn::GPT cpu_model(c, 8), gpu_model(c, 8);
  {
    NoGradGuard ng;
    cpu_model.wte->weight.narrow(0, 97, 31).zero_();
  }
  {
    NoGradGuard ng;
    auto a = cpu_model.parameters(), b = gpu_model.parameters();
    for (size_t i = 0; i < a.size(); ++i) Tensor(b[i]).detach().copy_(a[i]);
  }
  gpu_model.to(gpu());
  Tensor x = tokens(2, 32, 9, 97), y = tokens(2, 32, 10, 97);
  Tensor lc = cpu_model.loss(x, y), lg = gpu_model.loss(x.to(gpu()), y.to(gpu()));
  EXPECT_NEAR(lg.item<double>(), lc.item<double>(), 1e-5 * lc.item<double>());
  backward(lc);
  backward(lg);
  const auto pc = cpu_model.named_parameters(), pg = gpu_model.named_parameters();
  for (size_t i = 0; i < pc.size(); ++i)
    expect_norm_close(pc[i].second.grad(), pg[i].second.grad(), 1e-4, "gradient of " + pc[i].first);
  int64_t nonzero = 0;
  for (double v : host_values(gpu_model.wte->weight.grad().narrow(0, 97, 31))) nonzero += v != 0.0;
  EXPECT_EQ(nonzero, 0) << "the padding rows' gradient";
  NoGradGuard ng;
  Tensor logits = gpu_model.forward(x.to(gpu()));
  EXPECT_EQ(logits.shape(), (Shape{2, 32, 97}));
  expect_norm_close(cpu_model.forward(x), logits, 1e-5, "logits");
  const nn::SampleOptions greedy{0.0, 0, 0};
  const std::vector<int64_t> prompt = {5, 17, 42};
  EXPECT_EQ(gpu_model.generate(prompt, 40, greedy), cpu_model.generate(prompt, 40, greedy));
}

TEST(CudaGpt, CachedStepsGiveTheFullForwardsLogits) {
  REQUIRE_GPU();
  nn::GPT m(small(), 6);
  m.to(gpu());
  Tensor x = tokens(3, 20, 3, 96).to(gpu());
  NoGradGuard ng;
  Tensor full = m.forward(x);
  nn::GptCache cache;
  std::vector<Tensor> parts = {m.forward_cached(x.narrow(1, 0, 7).contiguous(), cache)};
  for (int64_t t = 7; t < 17; ++t) parts.push_back(m.forward_cached(x.narrow(1, t, 1).contiguous(), cache));
  parts.push_back(m.forward_cached(x.narrow(1, 17, 3).contiguous(), cache));
  EXPECT_TRUE(cache.layers[0].keys.device() == gpu());
  expect_close(full, concat(parts, 1), 1e-4, 1e-5, "cached logits");
}

TEST(CudaGpt, GreedyTokensMatchTheCpuAndSamplingIsReproducible) {
  REQUIRE_GPU();
  nn::GPT cpu_model(small(), 7), gpu_model(small(), 7);
  gpu_model.to(gpu());
  const std::vector<int64_t> prompt = {5, 17, 42};
  const nn::SampleOptions greedy{0.0, 0, 0};
  EXPECT_EQ(gpu_model.generate(prompt, 40, greedy), cpu_model.generate(prompt, 40, greedy));  // crops past 32
  const nn::SampleOptions drawn{0.9, 20, 11};
  EXPECT_EQ(gpu_model.generate(prompt, 40, drawn), gpu_model.generate(prompt, 40, drawn));
}

TEST(CudaGpt, Bf16RunsCloseToF32) {
  REQUIRE_GPU();
  nn::GPT m(small(), 8);
  m.to(gpu());
  m.eval();
  Tensor x = tokens(2, 32, 4, 96).to(gpu());
  NoGradGuard ng;
  Tensor ref = m.forward(x);
  PrecisionScope bf16(Precision::bf16);
  Tensor got = m.forward(x);
  expect_norm_close(ref, got.to(DType::f32), 3e-2, "bf16 logits");
  nn::GptCache cache;
  Tensor cached = concat({m.forward_cached(x.narrow(1, 0, 31).contiguous(), cache),
                          m.forward_cached(x.narrow(1, 31, 1).contiguous(), cache)},
                         1);
  expect_norm_close(ref, cached.to(DType::f32), 3e-2, "bf16 cached logits");
  EXPECT_EQ(m.generate({1, 2, 3}, 10, nn::SampleOptions{0.8, 10, 1}).size(), 10u);
}

// Under bf16 (f32 weights, 16-bit products) the blocks' bias gradients from the weight-gradient products
// (TANDEM_BIAS_FROM_PRODUCT=1, padded rows) against the reductions: the same loss, gradients within bf16's
// rounding.
TEST(CudaGpt, BiasGradientsFromTheWeightProductsMatchTheReductions) {
  REQUIRE_GPU();
  auto run = [](int mode) {
    ops::set_bias_from_product(mode);
    nn::GPT m(small(), 10);
    m.to(gpu());
    Tensor x = tokens(4, 32, 5, 96).to(gpu()), y = tokens(4, 32, 6, 96).to(gpu());
    Tensor loss;
    {
      PrecisionScope bf16(Precision::bf16);
      loss = m.loss(x, y);
      backward(loss);
    }
    ops::set_bias_from_product(-1);
    std::vector<Tensor> out{loss.detach().cpu().to(DType::f32)};
    for (auto& [name, p] : m.named_parameters()) out.push_back(p.grad().cpu().to(DType::f32));
    return std::make_pair(out, m.named_parameters());
  };
  const auto [off, names] = run(0);
  const auto [on, unused] = run(1);
  ASSERT_EQ(off.size(), on.size());
  EXPECT_NEAR(on[0].item<double>(), off[0].item<double>(), 1e-3 * std::fabs(off[0].item<double>()));
  for (size_t i = 1; i < off.size(); ++i) expect_norm_close(off[i], on[i], 2e-2, "gradient of " + names[i - 1].first);
}

TEST(CudaGpt, TokenOutOfRangeIsReportedAtTheNextSync) {
  REQUIRE_GPU();
  nn::GPT m(small(), 9);
  m.to(gpu());
  Tensor bad = Tensor::from_vector(std::vector<int32_t>{1, 2, 96, 3}, {1, 4}).to(gpu());
  Tensor loss = softmax_cross_entropy(m.forward(bad), Tensor::zeros({1, 4}, DType::i32, gpu()), Reduction::Mean);
  try {
    (void)loss.item<float>();
    ADD_FAILURE() << "the bad token was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find("index 96"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
