// Llama: names, sizes and the count of parameters, the configuration's JSON and named shapes, the key-value
// cache against the full forward (grouped heads, rotary positions after the cached ones), sampling that stops at
// the end token and keeps to top_p, and the layer groups (the tied table in the first and the last).
#include <gtest/gtest.h>

#include <cmath>

#include "tandem/autograd.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"

using namespace tandem;

namespace {

nn::LlamaConfig tiny(bool tied = true) {
  nn::LlamaConfig c;
  c.layers = 2, c.width = 16, c.heads = 4, c.kv_heads = 2, c.mlp_hidden = 24, c.vocab = 40, c.context = 16;
  c.rope_theta = 10000.0, c.tied = tied, c.rope_scaling = {};
  return c;
}

}  // namespace

TEST(Llama, NamesSizesAndCount) {
  for (bool tied : {true, false}) {
    nn::Llama m(tiny(tied), 3);
    auto ps = m.named_parameters();
    std::vector<std::string> names;
    for (auto& [n, t] : ps) names.push_back(n);
    const std::vector<std::string> first = {"wte.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
                                            "h.0.attn.c_proj.weight", "h.0.ln_2.weight", "h.0.mlp.c_fc.weight",
                                            "h.0.mlp.c_proj.weight"};
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(names[i], first[i]);
    EXPECT_EQ(names.back(), tied ? "ln_f.weight" : "lm_head.weight");
    EXPECT_EQ(ps[2].second.shape(), (Shape{16 + 2 * 2 * 4, 16}));  // queries, then 2 key and 2 value heads of 4
    EXPECT_EQ(ps[5].second.shape(), (Shape{48, 16}));             // gate and up, 24 each
    EXPECT_EQ(m.num_parameters(), nn::llama_num_parameters(tiny(tied)));
    EXPECT_EQ(nn::llama_num_parameters(tiny(tied), false), nn::llama_num_parameters(tiny(tied)) - (tied ? 40 * 16 : 0));
    // Norms start at one; weights spread as N(0, 0.02^2).
    EXPECT_EQ(ps[1].second.to_vector<float>(), std::vector<float>(16, 1.0f));
    double sq = 0;
    for (float v : ps[2].second.to_vector<float>()) sq += double(v) * v;
    EXPECT_NEAR(std::sqrt(sq / ps[2].second.numel()), 0.02, 0.006);
  }
  // Llama 3.2 1B's 1,235,814,400 parameters.
  EXPECT_EQ(nn::llama_num_parameters(nn::llama_config("llama-1b")), 1235814400);
  EXPECT_THROW(nn::llama_config("llama-2b"), Error);
}

TEST(Llama, ConfigurationJsonRoundTripsAndIsChecked) {
  for (const std::string& name : nn::llama_config_names()) {
    const nn::LlamaConfig c = nn::llama_config(name);
    const nn::LlamaConfig back = nn::llama_config_from_json(nn::llama_config_to_json(c));
    EXPECT_EQ(nn::llama_config_to_json(back), nn::llama_config_to_json(c)) << name;
  }
  nn::LlamaConfig bad = tiny();
  bad.kv_heads = 3;
  EXPECT_THROW(nn::check_llama_config(bad), Error);
  EXPECT_THROW(nn::llama_config_from_json("{\"layers\": 2}"), Error);
  EXPECT_THROW(nn::llama_config_from_json("not json"), Error);
}

TEST(Llama, CachedForwardEqualsTheWholeSequence) {
  for (bool tied : {true, false}) {
    nn::Llama m(tiny(tied), 5);
    m.eval();
    NoGradGuard no_grad;
    Tensor tokens = Tensor::from_vector<int64_t>({3, 7, 1, 39, 0, 12, 5, 8, 20, 2}, {1, 10});
    const std::vector<float> whole = m.forward(tokens).to_vector<float>();
    nn::GptCache cache;
    std::vector<float> parts = m.forward_cached(tokens.narrow(1, 0, 6), cache).to_vector<float>();
    for (int64_t t = 6; t < 10; ++t) {
      std::vector<float> row = m.forward_cached(tokens.narrow(1, t, 1), cache).to_vector<float>();
      parts.insert(parts.end(), row.begin(), row.end());
    }
    ASSERT_EQ(parts.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) ASSERT_NEAR(parts[i], whole[i], 1e-5) << i;
  }
}

TEST(Llama, SamplingStopsAtTheEndTokenAndKeepsToTopP) {
  nn::Llama m(tiny(), 7);
  nn::SampleOptions greedy;
  greedy.temperature = 0.0;
  const std::vector<int64_t> full = m.generate({1, 2, 3}, 12, greedy);
  ASSERT_EQ(full.size(), 12u);
  nn::SampleOptions stop = greedy;
  stop.stop_token = full[4];
  const std::vector<int64_t> cut = m.generate({1, 2, 3}, 12, stop);
  size_t first = 0;
  while (full[first] != full[4]) ++first;
  EXPECT_EQ(cut, std::vector<int64_t>(full.begin(), full.begin() + static_cast<int64_t>(first) + 1));
  // top_p: only tokens of the nucleus are drawn.
  std::vector<float> logits = {4.0f, 3.0f, 0.0f, -1.0f};  // probabilities about .71, .26, .013, .005
  nn::SampleOptions p;
  p.top_p = 0.9;
  Generator gen(3);
  for (int i = 0; i < 200; ++i) EXPECT_LE(nn::sample_logits(logits, p, gen), 1);
  p.top_p = 0.5;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(nn::sample_logits(logits, p, gen), 0);
  p.top_p = 1.5;
  EXPECT_THROW(nn::sample_logits(logits, p, gen), Error);
}

TEST(Llama, LayerGroupsCoverEveryParameterAndShareTheTiedTable) {
  nn::Llama tied(tiny(true)), untied(tiny(false));
  auto groups = tied.layer_groups();
  ASSERT_EQ(groups.size(), 4u);  // embeddings, 2 blocks, head
  EXPECT_TRUE(groups.front()->params()[0].is_same(tied.wte->weight));
  EXPECT_TRUE(groups.back()->params().back().is_same(tied.wte->weight));
  EXPECT_TRUE(untied.layer_groups().back()->params().back().is_same(untied.lm_head->weight));
  size_t covered = 0;
  for (auto* g : groups) covered += g->params().size();
  EXPECT_EQ(covered, tied.parameters().size() + 1);  // the table counted twice
}

TEST(Llama, TrainsAsAModelOfMakeModelAndItsLossIsTheLogitsCrossEntropy) {
  nn::ModelConfig mc;
  mc.llama = tiny();
  auto m = nn::make_model("llama", mc);
  auto* lm = dynamic_cast<nn::CausalLm*>(m.get());
  ASSERT_NE(lm, nullptr);
  Tensor tokens = Tensor::from_vector<int64_t>({3, 7, 1, 39, 0, 12}, {2, 3});
  Tensor targets = Tensor::from_vector<int64_t>({7, 1, 39, 0, 12, 5}, {2, 3});
  Tensor a = lm->loss(tokens, targets);
  Tensor b = softmax_cross_entropy(m->forward(tokens), targets, Reduction::Mean);
  EXPECT_NEAR(a.item<float>(), b.item<float>(), 1e-5);
  backward(a);
  for (auto& [n, t] : m->named_parameters()) EXPECT_TRUE(t.grad().defined()) << n;
}
