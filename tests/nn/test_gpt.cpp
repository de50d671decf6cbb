// GPT: the loss and every gradient against PyTorch's (tests/fixtures/pytorch/gpt.json, from
// tests/fixtures/make_gpt.py) in f32 and f64, names, sizes and initialisation, the errors it raises, the
// key-value cache against the full forward, sampling, and the configuration's JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/tensor_impl.h"
#include "ops/padded_rows.h"
#include "tandem/autograd.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"

using namespace tandem;

namespace {

nn::GptConfig tiny(bool bias = true, double dropout = 0.0) {
  nn::GptConfig c;
  c.layers = 2, c.heads = 2, c.width = 16, c.context = 8, c.vocab = 32, c.dropout = dropout, c.bias = bias;
  return c;
}

// Converts every parameter to f64 in place (handles follow), for checks at double precision.
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

Tensor tokens_of(const nlohmann::json& rows, DType dtype = DType::i64) {
  std::vector<int64_t> v;
  for (const auto& r : rows)
    for (const auto& x : r) v.push_back(x.get<int64_t>());
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  return dtype == DType::i64 ? t : t.to(dtype);
}

Tensor tensor_of(const nlohmann::json& j) {
  return Tensor::from_vector(j.at("data").get<std::vector<double>>(), j.at("shape").get<Shape>());
}

nlohmann::json load_gpt_fixture() {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/pytorch/gpt.json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing fixture file " << path;
    return nlohmann::json::object({{"cases", nlohmann::json::array()}});
  }
  return nlohmann::json::parse(in);
}

// |actual - expected| <= rtol |expected| + atol elementwise; the worst relative error is reported.
::testing::AssertionResult close(const Tensor& expected, const Tensor& actual, double rtol, double atol,
                                 const std::string& what) {
  if (!actual.defined()) return ::testing::AssertionFailure() << what << ": no tensor";
  if (expected.shape() != actual.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape()) << ", PyTorch's "
                                         << shape_str(expected.shape());
  const auto e = expected.to_vector<double>(), a = actual.to_vector<double>();
  for (size_t k = 0; k < e.size(); ++k)
    if (!(std::fabs(a[k] - e[k]) <= rtol * std::fabs(e[k]) + atol))
      return ::testing::AssertionFailure() << what << ": element " << k << " is " << a[k] << ", PyTorch's " << e[k];
  return ::testing::AssertionSuccess();
}

nn::GptConfig config_of(const nlohmann::json& c) { return nn::gpt_config_from_json(c.at("config").dump()); }

// Builds the case's model with its weights, in f32 or f64.
std::shared_ptr<nn::GPT> model_of(const nlohmann::json& c, bool f64) {
  auto m = std::make_shared<nn::GPT>(config_of(c), 0);
  const auto params = m->named_parameters();
  EXPECT_EQ(params.size(), c.at("params").size()) << c.at("name");
  for (size_t i = 0; i < params.size() && i < c.at("params").size(); ++i) {
    const auto& p = c.at("params")[i];
    EXPECT_EQ(params[i].first, p.at("name").get<std::string>()) << "parameter " << i;
    Tensor(params[i].second).copy_(tensor_of(p));
  }
  if (f64) to_f64(*m);
  m->eval();
  return m;
}

// fused: the loss from GPT::loss (the head taken with the loss, as training takes it), else from the logits.
void check_against_pytorch(bool f64, double rtol, double atol, bool fused) {
  const auto doc = load_gpt_fixture();
  ASSERT_EQ(doc.at("cases").size(), 2u);
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("name").get<std::string>() + (fused ? " (fused head)" : "");
    auto m = model_of(c, f64);
    const Tensor tokens = tokens_of(c.at("tokens"), DType::i32);
    Tensor loss;
    if (fused) {
      loss = m->loss(tokens, tokens_of(c.at("targets")));
    } else {
      Tensor logits = m->forward(tokens);
      EXPECT_TRUE(close(tensor_of(c.at("logits")), logits, rtol, atol, name + " logits"));
      loss = softmax_cross_entropy(logits, tokens_of(c.at("targets")), Reduction::Mean);
    }
    EXPECT_NEAR(loss.item<double>(), c.at("loss").get<double>(), rtol * c.at("loss").get<double>()) << name;
    backward(loss);
    const auto params = m->named_parameters();
    ASSERT_EQ(params.size(), c.at("grads").size());
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& g = c.at("grads")[i];
      ASSERT_EQ(params[i].first, g.at("name").get<std::string>());
      EXPECT_TRUE(close(tensor_of(g), params[i].second.grad(), rtol, atol, name + " gradient of " + params[i].first));
    }
  }
}

std::vector<float> floats(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

// Loss and every gradient as PyTorch's for the same weights and tokens (the tied token table's gradient sums
// its use as the embedding and as the output layer): f32 to 1e-5 relative (1e-6 absolute for elements near
// zero), f64 to 1e-10.
TEST(Gpt, LossAndEveryGradientMatchPyTorchInF32) {
  check_against_pytorch(false, 1e-5, 1e-6, false);
  check_against_pytorch(false, 1e-5, 1e-6, true);
}
TEST(Gpt, LossAndEveryGradientMatchPyTorchInF64) {
  check_against_pytorch(true, 1e-10, 1e-12, false);
  check_against_pytorch(true, 1e-10, 1e-12, true);
}

// The same with the blocks' norms writing padded rows, so that the products after them take their bias
// gradients from the weight gradients' products (TANDEM_BIAS_FROM_PRODUCT=1).
TEST(Gpt, BiasGradientsFromTheWeightProductsMatchPyTorch) {
  ops::set_bias_from_product(1);
  check_against_pytorch(false, 1e-5, 1e-6, false);
  check_against_pytorch(true, 1e-10, 1e-12, true);
  ops::set_bias_from_product(-1);
}

TEST(Gpt, ParameterNamesAreGpt2sAndTheOutputLayerIsTheTokenTable) {
  nn::GPT m(tiny(), 1);
  const auto params = m.named_parameters();
  std::vector<std::string> names;
  for (const auto& [n, t] : params) names.push_back(n);
  const std::vector<std::string> first = {"wte.weight",           "wpe.weight",          "h.0.ln_1.weight",
                                          "h.0.ln_1.bias",        "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
                                          "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight",
                                          "h.0.ln_2.bias",        "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias",
                                          "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"};
  ASSERT_EQ(names.size(), 2 + 2 * 12 + 2u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + first.size()), first);
  EXPECT_EQ(names[26], "ln_f.weight");
  EXPECT_EQ(names[27], "ln_f.bias");
  for (const auto& n : names) EXPECT_EQ(n.find("lm_head"), std::string::npos);
  EXPECT_EQ(params[4].second.shape(), (Shape{48, 16}));  // [out, in]
  // The logits are ln_f(x) wte^T: changing the table changes the output layer too.
  Tensor tok = Tensor::from_vector(std::vector<int32_t>{1, 2, 3}, {1, 3});
  NoGradGuard ng;
  Tensor a = m.forward(tok);
  Tensor ln = m.ln_f->forward(m.h[1]->forward(m.h[0]->forward(
      add(embedding(m.wte->weight, tok), slice(m.wpe->weight, 0, 0, 3)))));
  const auto want = floats(matmul(ln, transpose(m.wte->weight, 0, 1))), got = floats(a);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;
}

TEST(Gpt, ParameterCountsAndFlopsPerToken) {
  for (bool bias : {true, false}) {
    nn::GPT m(tiny(bias), 0);
    EXPECT_EQ(m.num_parameters(), nn::gpt_num_parameters(tiny(bias))) << bias;
    EXPECT_EQ(nn::gpt_num_parameters(tiny(bias), false), m.num_parameters() - 8 * 16);
  }
  nn::GptConfig c = tiny();
  c.layers = 3, c.width = 24, c.heads = 3, c.vocab = 50, c.context = 10;
  EXPECT_EQ(nn::GPT(c).num_parameters(), nn::gpt_num_parameters(c));
  // GPT-2 124M with the padded vocabulary: nanoGPT's 124.47M (123.69M without the position table).
  EXPECT_EQ(nn::gpt_num_parameters(nn::gpt_config("gpt2")), 124475904);
  EXPECT_EQ(nn::gpt_num_parameters(nn::gpt_config("gpt2"), false), 124475904 - 1024 * 768);
  EXPECT_DOUBLE_EQ(nn::gpt_flops_per_token(nn::gpt_config("gpt2")), 6.0 * 123689472 + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(nn::gpt_flops_per_token(nn::gpt_config("gpt2"), 512), 6.0 * 123689472 + 12.0 * 12 * 768 * 512);
}

TEST(Gpt, Gpt2InitialisationFromTheSeed) {
  nn::GptConfig c;
  c.layers = 4, c.heads = 4, c.width = 64, c.context = 64, c.vocab = 512, c.dropout = 0.0;
  nn::GPT m(c, 7);
  auto stddev = [](const Tensor& t) {
    const auto v = t.to_vector<double>();
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double mean = s / v.size();
    return std::sqrt(s2 / v.size() - mean * mean);
  };
  const double proj = 0.02 / std::sqrt(2.0 * 4);
  for (const auto& [name, t] : m.named_parameters()) {
    const bool is_proj = name.find("c_proj.weight") != std::string::npos;
    if (name.find(".bias") != std::string::npos) {
      for (float v : t.to_vector<float>()) ASSERT_EQ(v, 0.0f) << name;
    } else if (name.find("ln_") != std::string::npos) {
      for (float v : t.to_vector<float>()) ASSERT_EQ(v, 1.0f) << name;
    } else {
      const double want = is_proj ? proj : 0.02;
      EXPECT_NEAR(stddev(t), want, 0.1 * want) << name;
    }
  }
  // The same seed gives the same weights; another seed others.
  nn::GPT same(c, 7), other(c, 8);
  EXPECT_EQ(floats(same.h[2]->mlp->c_fc->weight), floats(m.h[2]->mlp->c_fc->weight));
  EXPECT_NE(floats(other.h[2]->mlp->c_fc->weight), floats(m.h[2]->mlp->c_fc->weight));
  EXPECT_EQ(floats(same.wte->weight), floats(m.wte->weight));
}

TEST(Gpt, ClearErrors) {
  auto expect_error = [](const std::function<void()>& f, const std::vector<std::string>& parts) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  nn::GptConfig bad = tiny();
  bad.width = 18, bad.heads = 4;
  expect_error([&] { nn::GPT m(bad); }, {"width 18", "multiple of heads 4"});
  bad = tiny();
  bad.dropout = 1.0;
  expect_error([&] { nn::GPT m(bad); }, {"dropout 1"});
  bad = tiny();
  bad.vocab = 0;
  expect_error([&] { nn::gpt_num_parameters(bad); }, {"vocab 0"});
  nn::GPT m(tiny(), 0);
  expect_error([&] { m.forward(Tensor::zeros({2, 9}, DType::i32)); }, {"GPT", "9 tokens", "context of 8"});
  expect_error([&] { m.forward(Tensor::zeros({2, 4}, DType::f32)); }, {"GPT", "i32 or i64 [B, T]", "f32[2, 4]"});
  expect_error([&] { m.forward(Tensor::zeros({8}, DType::i64)); }, {"[B, T]"});
  expect_error([&] { m.forward(Tensor::from_vector(std::vector<int32_t>{1, 2, 32, 3}, {2, 2})); },
               {"token 32 at [1, 0]", "vocabulary [0, 32)"});
  expect_error([&] { m.forward(Tensor::from_vector(std::vector<int64_t>{1, -1}, {1, 2})); }, {"token -1 at [0, 1]"});
  nn::GptCache cache;
  m.forward_cached(Tensor::zeros({1, 6}, DType::i32), cache);
  expect_error([&] { m.forward_cached(Tensor::zeros({1, 3}, DType::i32), cache); },
               {"GPT.forward_cached", "3 tokens after 6", "context of 8"});
  expect_error([&] { m.generate({}, 3); }, {"at least one token"});
  expect_error([&] { m.generate(std::vector<int64_t>(9, 1), 3); }, {"prompt's 9 tokens", "context of 8"});
  expect_error([&] { m.generate({1, 40}, 3); }, {"prompt token 40 at 1", "vocabulary [0, 32)"});
  expect_error([&] { m.generate({1}, 3, nn::SampleOptions{-1.0, 0, 0}); }, {"temperature -1"});
  expect_error([&] { nn::TransformerBlock(10, 3, *std::make_unique<Generator>(0)); }, {"width 10", "heads 3"});
  expect_error([&] { nn::sample_logits({0.0f, NAN}, {}, *std::make_unique<Generator>(0)); }, {"token 1", "NaN"});
}

// The cached forward, a prompt then one token at a time (and a chunk of two after cached positions), gives the
// full forward's logits.
TEST(Gpt, CachedStepsGiveTheFullForwardsLogits) {
  nn::GptConfig c = tiny();
  c.context = 12;
  nn::GPT m(c, 3);
  Generator gen(5);
  std::vector<int32_t> tok;
  for (int i = 0; i < 2 * 12; ++i) tok.push_back(static_cast<int32_t>(gen.next_below(32)));
  Tensor all = Tensor::from_vector(tok, {2, 12});
  NoGradGuard ng;
  const auto full = floats(m.forward(all));
  nn::GptCache cache;
  std::vector<Tensor> parts;
  parts.push_back(m.forward_cached(all.narrow(1, 0, 4).contiguous(), cache));  // the prompt
  for (int64_t t = 4; t < 8; ++t) parts.push_back(m.forward_cached(all.narrow(1, t, 1).contiguous(), cache));
  parts.push_back(m.forward_cached(all.narrow(1, 8, 2).contiguous(), cache));  // two after cached ones
  for (int64_t t = 10; t < 12; ++t) parts.push_back(m.forward_cached(all.narrow(1, t, 1).contiguous(), cache));
  EXPECT_EQ(cache.length, 12);
  ASSERT_EQ(cache.layers.size(), 2u);
  EXPECT_EQ(cache.layers[0].length, 12);
  const auto cached = floats(concat(parts, 1));
  ASSERT_EQ(cached.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) ASSERT_NEAR(cached[i], full[i], 1e-5f * (1 + std::fabs(full[i]))) << i;
  // After clear() the cache starts a new sequence in the same memory.
  cache.clear();
  const auto again = floats(m.forward_cached(all, cache));
  for (size_t i = 0; i < full.size(); ++i) ASSERT_NEAR(again[i], full[i], 1e-5f * (1 + std::fabs(full[i]))) << i;
  EXPECT_FALSE(m.forward_cached(all.narrow(1, 0, 1).contiguous(), (cache.clear(), cache)).requires_grad());
}

TEST(Gpt, SamplingFollowsTemperatureAndTopK) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  Generator g(1);
  EXPECT_EQ(nn::sample_logits(logits, {0.0, 0, 0}, g), 1);  // greedy: the first largest
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 4000; ++i) ++counts[nn::sample_logits(logits, {1.0, 2, 0}, g)];
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);  // top-2: the two tied largest only
  EXPECT_NEAR(counts[1] / 4000.0, 0.5, 0.05);
  std::fill(counts.begin(), counts.end(), 0);
  for (int i = 0; i < 4000; ++i) ++counts[nn::sample_logits(logits, {1.0, 0, 0}, g)];
  const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0) + std::exp(-1.0);
  EXPECT_NEAR(counts[2] / 4000.0, std::exp(2.0) / z, 0.03);
  // A low temperature concentrates the draws on the largest logits.
  std::fill(counts.begin(), counts.end(), 0);
  for (int i = 0; i < 1000; ++i) ++counts[nn::sample_logits(logits, {0.05, 0, 0}, g)];
  EXPECT_EQ(counts[1] + counts[3], 1000);
}

// generate: the same tokens as drawing from the full forward of the (cropped) sequence at each step, the
// same seed the same tokens, another seed others; the model's mode is restored.
TEST(Gpt, GenerateMatchesStepwiseFullForwardsAndCropsAtTheContext) {
  nn::GptConfig c = tiny(true, 0.1);
  nn::GPT m(c, 9);
  const std::vector<int64_t> prompt = {3, 1, 4};
  const int64_t n = 14;  // the sequence passes the context of 8
  for (const nn::SampleOptions opt : {nn::SampleOptions{1.0, 0, 42}, nn::SampleOptions{0.8, 5, 7},
                                      nn::SampleOptions{0.0, 0, 0}}) {
    std::vector<int64_t> streamed;
    const auto out = m.generate(prompt, n, opt, [&](int64_t t) { streamed.push_back(t); });
    EXPECT_TRUE(m.is_training());
    ASSERT_EQ(out.size(), static_cast<size_t>(n));
    EXPECT_EQ(streamed, out);
    // The reference: every step a full forward of the last `context` tokens, in evaluation mode.
    m.eval();
    Generator gen(opt.seed);
    std::vector<int64_t> seq = prompt, want;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - c.context);
      std::vector<int32_t> w(seq.begin() + start, seq.end());
      NoGradGuard ng;
      Tensor logits = m.forward(Tensor::from_vector(w, {1, static_cast<int64_t>(w.size())}));
      const int64_t next = nn::sample_logits(logits.narrow(1, logits.size(1) - 1, 1).to_vector<float>(), opt, gen);
      seq.push_back(next);
      want.push_back(next);
    }
    m.train();
    EXPECT_EQ(out, want) << "temperature " << opt.temperature << ", top_k " << opt.top_k;
    EXPECT_EQ(m.generate(prompt, n, opt), out);
  }
  EXPECT_NE(m.generate(prompt, n, {1.0, 0, 1}), m.generate(prompt, n, {1.0, 0, 2}));
  EXPECT_TRUE(m.generate(prompt, 0).empty());
}

TEST(Gpt, DropoutOnlyInTraining) {
  nn::GPT m(tiny(true, 0.3), 2);
  Tensor tok = Tensor::from_vector(std::vector<int32_t>{1, 5, 7, 2}, {1, 4});
  NoGradGuard ng;
  EXPECT_NE(floats(m.forward(tok)), floats(m.forward(tok)));
  m.eval();
  EXPECT_EQ(floats(m.forward(tok)), floats(m.forward(tok)));
}

TEST(Gpt, ConfigurationJsonRoundTripAndErrors) {
  nn::GptConfig c = nn::gpt_config("char");
  const nn::GptConfig back = nn::gpt_config_from_json(nn::gpt_config_to_json(c));
  EXPECT_EQ(back.layers, 6);
  EXPECT_EQ(back.heads, 6);
  EXPECT_EQ(back.width, 384);
  EXPECT_EQ(back.context, 256);
  EXPECT_EQ(back.vocab, 256);
  EXPECT_DOUBLE_EQ(back.dropout, 0.2);
  EXPECT_TRUE(back.bias);
  const auto meta = nlohmann::json::parse(nn::gpt_checkpoint_meta(c));
  EXPECT_EQ(meta["model"], "gpt");
  EXPECT_EQ(meta["gpt"]["width"], 384);
  EXPECT_EQ(nn::gpt_config_from_meta(meta.dump()).width, 384);
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Input);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto j = nlohmann::json::parse(nn::gpt_config_to_json(c));
  j.erase("heads");
  EXPECT_NE(error_of([&] { nn::gpt_config_from_json(j.dump()); }).find("no 'heads'"), std::string::npos);
  j = nlohmann::json::parse(nn::gpt_config_to_json(c));
  j["rope"] = true;
  EXPECT_NE(error_of([&] { nn::gpt_config_from_json(j.dump()); }).find("unknown key 'rope'"), std::string::npos);
  j = nlohmann::json::parse(nn::gpt_config_to_json(c));
  j["width"] = "wide";
  EXPECT_NE(error_of([&] { nn::gpt_config_from_json(j.dump()); }).find("'width' is \"wide\", not an integer"),
            std::string::npos);
  j["width"] = 100;
  EXPECT_NE(error_of([&] { nn::gpt_config_from_json(j.dump()); }).find("multiple of heads 6"), std::string::npos);
  EXPECT_NE(error_of([&] { nn::gpt_config_from_meta("{\"model\":\"cnn\"}", "run.ckpt"); })
                .find("run.ckpt is not a GPT checkpoint: it holds the model \"cnn\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { nn::gpt_config_from_meta("{}", "x"); }).find("names no model"), std::string::npos);
  EXPECT_NE(error_of([&] { nn::gpt_config_from_meta("{\"model\":\"gpt\"}", "x"); }).find("no \"gpt\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { nn::gpt_config_from_json("{"); }).find("not valid JSON"), std::string::npos);
  // A padded table's logical vocabulary: written only when set below vocab, read back, checked.
  EXPECT_FALSE(nlohmann::json::parse(nn::gpt_config_to_json(c)).contains("logical_vocab"));
  EXPECT_EQ(back.logical_vocab, 0);
  EXPECT_EQ(back.used_vocab(), 256);
  nn::GptConfig padded = c;
  padded.vocab = 128, padded.logical_vocab = 97;
  const auto pj = nlohmann::json::parse(nn::gpt_checkpoint_meta(padded));
  EXPECT_EQ(pj["gpt"]["logical_vocab"], 97);
  const nn::GptConfig pb = nn::gpt_config_from_meta(pj.dump());
  EXPECT_EQ(pb.vocab, 128);
  EXPECT_EQ(pb.logical_vocab, 97);
  EXPECT_EQ(pb.used_vocab(), 97);
  j = nlohmann::json::parse(nn::gpt_config_to_json(padded));
  j["logical_vocab"] = 129;
  EXPECT_NE(error_of([&] { nn::gpt_config_from_json(j.dump()); }).find("logical_vocab 129 must be in [1, vocab 128]"),
            std::string::npos);
}

TEST(Gpt, MakeModelBuildsAGpt) {
  nn::ModelConfig mc;
  mc.gpt = tiny();
  mc.seed = 4;
  auto m = nn::make_model("gpt", mc);
  EXPECT_EQ(m->num_parameters(), nn::gpt_num_parameters(tiny()));
  auto* g = dynamic_cast<nn::GPT*>(m.get());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(floats(g->wte->weight), floats(nn::GPT(tiny(), 4).wte->weight));
  EXPECT_EQ(m->forward(Tensor::zeros({2, 5}, DType::i32)).shape(), (Shape{2, 5, 32}));
  const auto names = nn::model_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "gpt"), names.end());
}
