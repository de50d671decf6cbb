// Hugging Face models in and out (tests/fixtures/hf, made by tests/fixtures/make_hf.py with transformers on
// random-initialised models built from configs): the logits of from_pretrained equal transformers' in f32, so do
// the loss and every gradient, one AdamW step gives the same next logits, greedy generation the same tokens;
// export then import is bit-exact and the exported tensors equal the originals by name, shape and value; and what
// cannot be read is refused, named.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tandem/autograd.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/pretrained.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"
#include "tandem/safetensors.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(TANDEM_SOURCE_DIR) / "tests" / "fixtures" / "hf";
const char* kCases[] = {"llama_tied_gqa", "llama_untied_mha", "llama_theta_mqa", "gpt2_tiny"};

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_hf_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The largest |a - b| over the largest |b|.
double relative_difference(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.detach().contiguous().cpu().to(DType::f32).to_vector<float>(),
                           y = b.detach().contiguous().cpu().to(DType::f32).to_vector<float>();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    diff = std::max(diff, std::fabs(double(x[i]) - y[i]));
    scale = std::max(scale, std::fabs(double(y[i])));
  }
  return diff / std::max(scale, 1e-30);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor x = a.detach().contiguous().cpu(), y = b.detach().contiguous().cpu();
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// What the tests call on either family.
struct Lm {
  nn::Pretrained p;
  nn::CausalLm* lm = nullptr;
  std::function<std::vector<int64_t>(const std::vector<int64_t>&, int64_t)> greedy;
};

Lm load(const fs::path& dir) {
  Lm m;
  m.p = nn::from_pretrained(dir.string());
  m.lm = dynamic_cast<nn::CausalLm*>(m.p.model.get());
  nn::SampleOptions g;
  g.temperature = 0.0;
  if (auto* l = dynamic_cast<nn::Llama*>(m.p.model.get()))
    m.greedy = [l, g](const std::vector<int64_t>& p, int64_t n) { return l->generate(p, n, g); };
  else if (auto* gpt = dynamic_cast<nn::GPT*>(m.p.model.get()))
    m.greedy = [gpt, g](const std::vector<int64_t>& p, int64_t n) { return gpt->generate(p, n, g); };
  return m;
}

std::vector<int64_t> ints(const Tensor& t) { return t.to(DType::i64).to_vector<int64_t>(); }

}  // namespace

TEST(Pretrained, LogitsLossGradientsStepAndGenerationMatchTransformers) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const fs::path dir = kFixtures / name;
    SafetensorsFile ref((dir / "reference.safetensors").string());
    auto tensor = [&](const std::string& n) { return ref.tensor(*ref.find(n), ref.find(n)->dtype == "I64" ? DType::i64 : DType::f32); };
    Lm m = load(dir);
    ASSERT_NE(m.lm, nullptr);
    nn::Module& model = *m.p.model;
    model.eval();
    const Tensor tokens = tensor("tokens"), targets = tensor("targets");
    // Logits.
    Tensor logits = model.forward(tokens);
    EXPECT_LT(relative_difference(logits, tensor("logits")), 1e-5);
    // Greedy generation, before any step.
    std::vector<int64_t> prompt = ints(tensor("prompt"));
    EXPECT_EQ(m.greedy(prompt, 32), ints(tensor("generated")));
    // The loss and every gradient: the gradients written into a copy of the model and exported under
    // transformers' names.
    model.train();
    Tensor loss = m.lm->loss(tokens, targets);
    EXPECT_NEAR(loss.item<float>(), tensor("loss").item<float>(), 1e-5 * std::fabs(tensor("loss").item<float>()));
    backward(loss);
    const fs::path grads = temp_dir(std::string(name) + "_grads");
    {
      std::vector<Tensor> keep;
      NoGradGuard no_grad;
      for (const Tensor& p : model.parameters()) {
        keep.push_back(p.detach().clone());
        Tensor(p).detach().copy_(p.grad());
      }
      nn::save_pretrained(model, grads.string(), m.p.config_json);
      size_t i = 0;
      for (const Tensor& p : model.parameters()) Tensor(p).detach().copy_(keep[i++]);
    }
    SafetensorsFile exported((grads / "model.safetensors").string());
    int compared = 0;
    for (const SafetensorsEntry& e : ref.entries()) {
      if (e.name.rfind("grad/", 0) != 0) continue;
      std::string hf = e.name.substr(5);
      const SafetensorsEntry* got = exported.find(hf);
      ASSERT_NE(got, nullptr) << hf;
      EXPECT_LT(relative_difference(exported.tensor(*got, DType::f32), ref.tensor(e, DType::f32)), 1e-4) << hf;
      ++compared;
    }
    EXPECT_GE(compared, 10);
    // One AdamW step, transformers' settings (every parameter decayed).
    optim::AdamOptions ao;
    ao.lr = 1e-3, ao.beta1 = 0.9, ao.beta2 = 0.95, ao.eps = 1e-8, ao.weight_decay = 0.1, ao.decoupled = true;
    optim::Adam adam(model.parameters(), ao);
    adam.step();
    model.eval();
    EXPECT_LT(relative_difference(model.forward(tokens), tensor("next_logits")), 1e-5);
    fs::remove_all(grads);
  }
}

TEST(Pretrained, ExportThenImportIsBitExact) {
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const fs::path dir = kFixtures / name, out = temp_dir(std::string(name) + "_out");
    Lm m = load(dir);
    nn::save_pretrained(*m.p.model, out.string(), m.p.config_json);
    // The exported tensors are the originals, by name, shape and value.
    SafetensorsFile original((dir / "model.safetensors").string()), exported((out / "model.safetensors").string());
    for (const SafetensorsEntry& e : original.entries()) {
      if (e.name.find(".attn.bias") != std::string::npos || e.name.find(".attn.masked_bias") != std::string::npos)
        continue;  // GPT-2's causal masks: buffers transformers makes again
      if (e.name == "lm_head.weight" && !exported.find(e.name)) continue;  // tied: the token table
      const SafetensorsEntry* x = exported.find(e.name);
      ASSERT_NE(x, nullptr) << e.name;
      EXPECT_EQ(x->shape, e.shape) << e.name;
      EXPECT_TRUE(same_bits(exported.tensor(*x, DType::f32), original.tensor(e, DType::f32))) << e.name;
    }
    // And read back, the same model bit for bit.
    Lm back = load(out);
    auto a = m.p.model->named_parameters(), b = back.p.model->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(same_bits(a[i].second, b[i].second)) << a[i].first;
    }
    auto cfg = nlohmann::json::parse(std::ifstream(out / "config.json"));
    EXPECT_EQ(cfg.value("model_type", ""), std::string(name).rfind("llama", 0) == 0 ? "llama" : "gpt2");
    // The file's vocabulary, whatever the table's rows inside tandem (gpt2_tiny's 97 are 128 there).
    EXPECT_EQ(cfg["vocab_size"], nlohmann::json::parse(std::ifstream(dir / "config.json"))["vocab_size"]);
    fs::remove_all(out);
  }
}

namespace {

// Every element zero (either sign).
bool all_zero(const Tensor& t) {
  for (float v : t.detach().contiguous().cpu().to(DType::f32).to_vector<float>())
    if (v != 0.0f) return false;
  return true;
}

}  // namespace

// GPT-2's vocabulary is padded inside tandem to a multiple of 64 (gpt2_tiny's 97 to 128; GPT-2's 50257 to 50304)
// and the padding never counts: against a model of the file's 97 tokens with the same weights, the logits (97
// columns), the loss and every gradient are the same, the padding rows' gradient is zero, one AdamW step with
// weight decay leaves them zero and gives the same next logits, and greedy and sampled generation draw the same
// tokens, none of them padding. Targets and tokens in the padding are refused.
TEST(Pretrained, Gpt2TablePaddedToAMultipleOf64WhosePaddingNeverCounts) {
  const fs::path dir = kFixtures / "gpt2_tiny";
  nn::Pretrained p = nn::from_pretrained(dir.string());
  auto& padded = dynamic_cast<nn::GPT&>(*p.model);
  const nn::GptConfig pc = padded.config();
  ASSERT_EQ(pc.vocab, 128);
  ASSERT_EQ(pc.logical_vocab, 97);
  ASSERT_EQ(padded.wte->weight.size(0), 128);
  EXPECT_TRUE(all_zero(padded.wte->weight.narrow(0, 97, 31)));
  EXPECT_FALSE(all_zero(padded.wte->weight.narrow(0, 96, 1)));
  EXPECT_NE(padded.describe().find("vocabulary 97 (a table of 128 rows)"), std::string::npos) << padded.describe();
  // The same weights in a model of the file's vocabulary.
  nn::GptConfig uc = pc;
  uc.vocab = 97, uc.logical_vocab = 0;
  nn::GPT plain(uc, 5);
  {
    NoGradGuard no_grad;
    auto a = padded.named_parameters(), b = plain.named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      const Tensor from = a[i].first == "wte.weight" ? a[i].second.narrow(0, 0, 97) : a[i].second;
      Tensor(b[i].second).detach().copy_(from);
    }
  }
  SafetensorsFile ref((dir / "reference.safetensors").string());
  const Tensor tokens = ref.tensor(*ref.find("tokens"), DType::i64), targets = ref.tensor(*ref.find("targets"), DType::i64);
  // The logits handed out: the vocabulary's 97 columns.
  padded.eval(), plain.eval();
  const Tensor la = padded.forward(tokens), lb = plain.forward(tokens);
  ASSERT_EQ(la.shape(), (Shape{2, 12, 97}));
  EXPECT_LT(relative_difference(la, lb), 1e-6);
  // The loss (the head over all 128 rows, the padding masked in the loss kernel) and every gradient.
  padded.train(), plain.train();
  const Tensor lpa = padded.loss(tokens, targets), lpb = plain.loss(tokens, targets);
  EXPECT_NEAR(lpa.item<float>(), lpb.item<float>(), 1e-6 * std::fabs(lpb.item<float>()));
  backward(lpa);
  backward(lpb);
  {
    auto a = padded.named_parameters(), b = plain.named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      Tensor ga = a[i].second.grad();
      if (a[i].first == "wte.weight") {
        EXPECT_TRUE(all_zero(ga.narrow(0, 97, 31))) << "the padding rows' gradient";
        ga = ga.narrow(0, 0, 97);
      }
      EXPECT_LT(relative_difference(ga, b[i].second.grad()), 1e-5) << a[i].first;
    }
  }
  // One AdamW step with weight decay: the padding stays zero, the next logits are the same.
  optim::AdamOptions ao;
  ao.lr = 1e-3, ao.beta1 = 0.9, ao.beta2 = 0.95, ao.eps = 1e-8, ao.weight_decay = 0.1, ao.decoupled = true;
  optim::Adam adam_a(padded.parameters(), ao), adam_b(plain.parameters(), ao);
  adam_a.step();
  adam_b.step();
  EXPECT_TRUE(all_zero(padded.wte->weight.narrow(0, 97, 31)));
  padded.eval(), plain.eval();
  EXPECT_LT(relative_difference(padded.forward(tokens), plain.forward(tokens)), 1e-5);
  // Generation: greedy, and drawn at a high temperature (where 31 padding columns would be drawn often).
  const std::vector<int64_t> prompt = ints(ref.tensor(*ref.find("prompt"), DType::i64));
  nn::SampleOptions greedy;
  greedy.temperature = 0.0;
  EXPECT_EQ(padded.generate(prompt, 32, greedy), plain.generate(prompt, 32, greedy));
  nn::SampleOptions hot;
  hot.temperature = 3.0, hot.seed = 11;
  const std::vector<int64_t> drawn = padded.generate(prompt, 60, hot);
  EXPECT_EQ(drawn, plain.generate(prompt, 60, hot));
  for (int64_t t : drawn) EXPECT_LT(t, 97);
  // The padding ids are no tokens: as inputs and as targets they are refused, naming the vocabulary.
  Tensor bad = targets.clone();
  bad.data<int64_t>()[3] = 100;
  padded.train();
  try {
    padded.loss(tokens, bad);
    ADD_FAILURE() << "a target in the padding was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 100 at position 3 is outside [0, 97)"), std::string::npos) << e.what();
  }
  try {
    padded.forward(bad);
    ADD_FAILURE() << "a token in the padding was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary [0, 97)"), std::string::npos) << e.what();
  }
}

namespace {

void expect_refused(const fs::path& dir, const std::string& mention) {
  try {
    nn::from_pretrained(dir.string());
    ADD_FAILURE() << "no error for " << dir << " (expected one mentioning '" << mention << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

// A copy of a fixture whose config.json `edit` changes.
fs::path edited(const std::string& from, const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path out = temp_dir(from + "_" + tag);
  fs::copy(kFixtures / from, out, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  auto cfg = nlohmann::json::parse(std::ifstream(out / "config.json"));
  edit(cfg);
  std::ofstream(out / "config.json") << cfg.dump();
  return out;
}

}  // namespace

TEST(Pretrained, WhatCannotBeReadIsRefusedByName) {
  const std::string llama = "llama_tied_gqa";
  expect_refused(edited(llama, "act", [](auto& c) { c["hidden_act"] = "gelu"; }), "hidden_act is 'gelu'");
  expect_refused(edited(llama, "rope", [](auto& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }),
                 "rope_scaling type is 'yarn'");
  expect_refused(edited(llama, "window", [](auto& c) { c["sliding_window"] = 4096; }), "sliding_window");
  expect_refused(edited(llama, "type", [](auto& c) { c["model_type"] = "mamba"; }), "model_type is 'mamba'");
  expect_refused(edited(llama, "shape", [](auto& c) { c["intermediate_size"] = 64; }), "where the configuration makes it");
  expect_refused(edited(llama, "heads", [](auto& c) { c["num_key_value_heads"] = 3; }), "kv_heads 3 must divide heads 4");
  expect_refused(edited("gpt2_tiny", "gelu", [](auto& c) { c["activation_function"] = "relu"; }),
                 "activation_function is 'relu'");
  // No config, no weights, a truncated file, an index naming a missing shard, a tensor the model has no place for.
  fs::path none = temp_dir("none");
  expect_refused(none, "no config.json");
  fs::path noweights = edited(llama, "noweights", [](auto&) {});
  fs::remove(noweights / "model.safetensors");
  expect_refused(noweights, "neither model.safetensors nor model.safetensors.index.json");
  fs::path cut = edited(llama, "cut", [](auto&) {});
  fs::resize_file(cut / "model.safetensors", fs::file_size(cut / "model.safetensors") - 100);
  expect_refused(cut, "(a truncated file?)");
  fs::path sharded = edited(llama, "sharded", [](auto&) {});
  {
    SafetensorsFile f((sharded / "model.safetensors").string());
    nlohmann::json map;
    for (const SafetensorsEntry& e : f.entries()) map[e.name] = e.name.find("layers.1.") != std::string::npos ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    std::ofstream(sharded / "model.safetensors.index.json") << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", map}}.dump();
  }
  fs::rename(sharded / "model.safetensors", sharded / "model-00001-of-00002.safetensors");
  expect_refused(sharded, "'model-00002-of-00002.safetensors', which is not in");
  fs::path extra = edited(llama, "extra", [](auto&) {});
  {
    SafetensorsFile f((extra / "model.safetensors").string());
    std::vector<std::pair<std::string, Tensor>> all;
    for (const SafetensorsEntry& e : f.entries()) all.emplace_back(e.name, f.tensor(e, DType::f32));
    all.emplace_back("model.layers.7.mlp.up_proj.weight", Tensor::zeros({2, 2}));
    write_safetensors((extra / "model.safetensors").string(), all);
  }
  expect_refused(extra, "'model.layers.7.mlp.up_proj.weight', which the configuration's model has no place for");
  for (const char* tag : {"act", "rope", "window", "type", "shape", "heads", "gelu", "none", "noweights", "cut",
                          "sharded", "extra"})
    for (const std::string& base : {llama, std::string("gpt2_tiny")}) fs::remove_all(temp_dir(base + "_" + tag));
}

// A model kept in several files with an index reads as the one file does; bf16 files read as their values.
TEST(Pretrained, ShardedAndSixteenBitFilesRead) {
  const fs::path dir = kFixtures / "llama_tied_gqa", out = temp_dir("shards");
  fs::copy_file(dir / "config.json", out / "config.json");
  SafetensorsFile f((dir / "model.safetensors").string());
  std::vector<std::pair<std::string, Tensor>> a, b;
  nlohmann::json map;
  for (const SafetensorsEntry& e : f.entries()) {
    const bool second = e.name.find("layers.1.") != std::string::npos;
    (second ? b : a).emplace_back(e.name, f.tensor(e, DType::f32));
    map[e.name] = second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  }
  write_safetensors((out / "model-00001-of-00002.safetensors").string(), a);
  write_safetensors((out / "model-00002-of-00002.safetensors").string(), b);
  std::ofstream(out / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  nn::Pretrained whole = nn::from_pretrained(dir.string()), parts = nn::from_pretrained(out.string());
  auto x = whole.model->parameters(), y = parts.model->parameters();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(same_bits(x[i], y[i]));
  // bf16: save_pretrained in bf16, read back: the parameters are the bf16 roundings.
  const fs::path half = temp_dir("bf16");
  nn::save_pretrained(*whole.model, half.string(), whole.config_json, DType::bf16);
  nn::Pretrained h = nn::from_pretrained(half.string());
  auto z = h.model->parameters();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(same_bits(z[i], x[i].to(DType::bf16).to(DType::f32)));
  auto cfg = nlohmann::json::parse(std::ifstream(half / "config.json"));
  EXPECT_EQ(cfg.value("torch_dtype", ""), "bfloat16");
  fs::remove_all(out);
  fs::remove_all(half);
}
