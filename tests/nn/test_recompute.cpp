// Activation recompute: autograd's recompute gives the gradients of the op recorded plainly (an op alone, with
// gradients flowing into its input and its parameters, a frozen parameter left out), and a Llama's and a GPT's
// blocks recomputed give the same loss and every parameter's gradient bit for bit on the CPU (the inner pass adds
// where the plain pass adds and hands on the column sums the bias gradients read), while the step's peak memory
// falls (under selective by less than under full: it frees the norms' and SwiGLU's outputs alone); with dropout the second run replays the first's masks (the same gradients again), and a region that
// draws a different count the second time is an error.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "tandem/autograd.h"
#include "tandem/device.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"
#include "ops/padded_rows.h"

using namespace tandem;

namespace {

Tensor leaf(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = Tensor::normal(shape, 0.0, 1.0, gen);
  t.requires_grad_();
  return t;
}

std::map<std::string, std::vector<float>> grads_of(nn::Module& m) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, p] : m.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    if (p.grad().defined()) out[name] = p.grad().to_vector<float>();
  }
  return out;
}

}  // namespace

TEST(Recompute, GivesThePlainGradientsOfInputAndParameters) {
  Tensor w = leaf({6, 5}, 1), b = leaf({6}, 2), frozen = leaf({6}, 3);
  frozen.requires_grad_(false);
  auto fn = [&](const Tensor& x) { return add(tanh(linear(x, w, b)), frozen); };
  auto run = [&](bool again) {
    Tensor x = leaf({4, 5}, 4);
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    Tensor y = again ? recompute(fn, x, {w, b, frozen}) : fn(x);
    backward(sum(mul(y, y)));
    return std::vector<std::vector<float>>{x.grad().to_vector<float>(), w.grad().to_vector<float>(),
                                           b.grad().to_vector<float>()};
  };
  const auto plain = run(false), again = run(true);
  EXPECT_EQ(again, plain);
  EXPECT_FALSE(frozen.grad().defined());
  // Outside grad mode it is fn itself.
  NoGradGuard no_grad;
  Tensor x = leaf({4, 5}, 4);
  EXPECT_FALSE(recompute(fn, x, {w, b}).requires_grad());
}

TEST(Recompute, LlamaAndGptBlocksGiveTheSameLossAndGradients) {
  nn::LlamaConfig lc;
  lc.layers = 3, lc.width = 32, lc.heads = 4, lc.kv_heads = 2, lc.mlp_hidden = 48, lc.vocab = 50, lc.context = 64;
  lc.rope_theta = 10000.0, lc.rope_scaling = {};
  nn::GptConfig gc;
  gc.layers = 3, gc.width = 32, gc.heads = 4, gc.vocab = 50, gc.context = 64;
  Generator gen(9);
  Tensor tokens = Tensor::uniform({4, 64}, 0.0, 49.99, gen).to(DType::i64);
  Tensor targets = Tensor::uniform({4, 64}, 0.0, 49.99, gen).to(DType::i64);
  auto step = [&](nn::Module& m, nn::CausalLm& lm, nn::RecomputePolicy policy) {
    lm.set_recompute(policy);
    for (Tensor& p : m.parameters()) p.set_grad(Tensor());
    const size_t start = memory_stats(Device::cpu()).in_use;
    reset_peak_memory(Device::cpu());
    Tensor loss = lm.loss(tokens, targets);
    backward(loss);
    const size_t peak = memory_stats(Device::cpu()).peak_in_use - start;
    return std::make_tuple(loss.item<float>(), grads_of(m), peak);
  };
  nn::Llama llama(lc, 5);
  nn::GPT gpt(gc, 5);
  for (auto [m, lm] : {std::pair<nn::Module*, nn::CausalLm*>{&llama, &llama}, {&gpt, &gpt}}) {
    m->train();
    auto [loss_plain, grads_plain, peak_plain] = step(*m, *lm, nn::RecomputePolicy::none);
    size_t peak_selective = 0;
    for (auto policy : {nn::RecomputePolicy::selective, nn::RecomputePolicy::full}) {
      auto [loss_again, grads_again, peak_again] = step(*m, *lm, policy);
      const char* name = nn::recompute_name(policy);
      EXPECT_EQ(loss_again, loss_plain) << name;
      EXPECT_EQ(grads_again.size(), grads_plain.size());
      for (auto& [pname, g] : grads_plain) EXPECT_EQ(grads_again[pname], g) << pname << " " << name;
      EXPECT_LT(peak_again, peak_plain) << name << " should hold fewer activations at once";
      if (policy == nn::RecomputePolicy::selective) peak_selective = peak_again;
      else EXPECT_LT(peak_again, peak_selective) << "full keeps less than selective";
    }
  }
}

// The norms' outputs in rows padded for the products' bias gradients (the GPU's default layout): selective
// recompute makes them again in that layout.
TEST(Recompute, SelectiveRemakesRowsPaddedForTheBiasGradient) {
  ops::set_bias_from_product(1);
  struct Reset {
    ~Reset() { ops::set_bias_from_product(-1); }
  } reset;
  nn::GptConfig gc;
  gc.layers = 2, gc.width = 24, gc.heads = 4, gc.vocab = 30, gc.context = 16;
  Generator gen(4);
  Tensor tokens = Tensor::uniform({3, 16}, 0.0, 29.99, gen).to(DType::i64);
  Tensor targets = Tensor::uniform({3, 16}, 0.0, 29.99, gen).to(DType::i64);
  nn::GPT gpt(gc, 2);
  gpt.train();
  auto step = [&](nn::RecomputePolicy policy) {
    gpt.set_recompute(policy);
    for (Tensor& p : gpt.parameters()) p.set_grad(Tensor());
    Tensor loss = gpt.loss(tokens, targets);
    backward(loss);
    return std::make_pair(loss.item<float>(), grads_of(gpt));
  };
  auto [loss_plain, grads_plain] = step(nn::RecomputePolicy::none);
  auto [loss_again, grads_again] = step(nn::RecomputePolicy::selective);
  EXPECT_EQ(loss_again, loss_plain);
  for (auto& [name, g] : grads_plain) EXPECT_EQ(grads_again[name], g) << name;
}

TEST(Recompute, DropoutMasksAreReplayedInTheSecondRun) {
  nn::LlamaConfig lc;
  lc.layers = 2, lc.width = 32, lc.heads = 4, lc.kv_heads = 2, lc.mlp_hidden = 48, lc.vocab = 50, lc.context = 32;
  lc.rope_theta = 10000.0, lc.rope_scaling = {}, lc.dropout = 0.2;
  nn::GptConfig gc;
  gc.layers = 2, gc.width = 32, gc.heads = 4, gc.vocab = 50, gc.context = 32, gc.dropout = 0.2;
  Generator gen(3);
  Tensor tokens = Tensor::uniform({3, 32}, 0.0, 49.99, gen).to(DType::i64);
  Tensor targets = Tensor::uniform({3, 32}, 0.0, 49.99, gen).to(DType::i64);
  nn::Llama llama(lc, 5);
  nn::GPT gpt(gc, 5);
  for (auto [m, lm] : {std::pair<nn::Module*, nn::CausalLm*>{&llama, &llama}, {&gpt, &gpt}}) {
    m->train();
    std::vector<uint64_t> start;
    for (auto& [name, g] : m->named_generators()) start.push_back(g->offset());
    auto step = [&](nn::RecomputePolicy policy) {
      size_t i = 0;
      for (auto& [name, g] : m->named_generators()) g->set_offset(start[i++]);
      lm->set_recompute(policy);
      for (Tensor& p : m->parameters()) p.set_grad(Tensor());
      Tensor loss = lm->loss(tokens, targets);
      backward(loss);
      std::vector<uint64_t> after;
      for (auto& [name, g] : m->named_generators()) after.push_back(g->offset());
      return std::make_tuple(loss.item<float>(), grads_of(*m), after);
    };
    auto [loss_plain, grads_plain, after_plain] = step(nn::RecomputePolicy::none);
    for (auto policy : {nn::RecomputePolicy::full, nn::RecomputePolicy::selective}) {
      auto [loss_again, grads_again, after_again] = step(policy);
      EXPECT_EQ(loss_again, loss_plain);
      EXPECT_EQ(after_again, after_plain) << "the generators end where the plain step leaves them";
      EXPECT_EQ(grads_again.size(), grads_plain.size());
      for (auto& [name, g] : grads_plain) EXPECT_EQ(grads_again[name], g) << name << " " << nn::recompute_name(policy);
    }
    // The masks matter: another start draws other masks and another loss.
    start.back() += 1000;
    auto [loss_other, grads_other, after_other] = step(nn::RecomputePolicy::none);
    EXPECT_NE(loss_other, loss_plain);
  }
}

TEST(Recompute, ARegionThatDrawsADifferentCountIsAnError) {
  Generator g(7);
  Tensor w = leaf({4, 4}, 1);
  int runs = 0;
  auto fn = [&](const Tensor& x) {
    ++runs;
    return sum(dropout(linear(x, w, Tensor()), 0.1, true, g));  // the same count each run...
  };
  Tensor x = leaf({2, 4}, 2);
  Tensor y = recompute(fn, x, {w}, {&g});
  backward(y);  // ...replays without complaint
  EXPECT_EQ(runs, 2);
  auto uneven = [&](const Tensor& in) {
    ++runs;
    Tensor h = linear(in, w, Tensor());
    if (runs % 2 == 1) (void)dropout(h, 0.1, true, g);  // an extra draw on the first run only
    return sum(dropout(h, 0.1, true, g));
  };
  runs = 0;
  Tensor y2 = recompute(uneven, x, {w}, {&g});
  try {
    backward(y2);
    ADD_FAILURE() << "a second run drawing fewer numbers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("drew"), std::string::npos) << e.what();
  }
}

// A ResNet's residual blocks recomputed: the same loss, gradients and batch-norm running statistics bit for bit
// (the second run normalises with the batch's statistics again and leaves the running ones where the first run
// left them), over two steps' worth of forwards; selective is refused, naming what a ResNet takes.
TEST(Recompute, ResNetBlocksGiveTheSameLossGradientsAndRunningStatistics) {
  nn::ModelConfig cfg;
  cfg.in_channels = 3, cfg.height = 12, cfg.width = 12, cfg.num_classes = 5, cfg.seed = 3;
  auto run = [&](nn::RecomputePolicy policy) {
    nn::ModulePtr m = nn::make_model("resnet18", cfg);
    auto* blocks = dynamic_cast<nn::BlockRecompute*>(m.get());
    EXPECT_NE(blocks, nullptr);
    blocks->set_recompute(policy);
    m->train(true);
    std::vector<float> losses;
    for (uint64_t step = 0; step < 2; ++step) {
      for (auto& [name, p] : m->named_parameters()) Tensor(p).set_grad(Tensor());
      Generator gen(10 + step);
      const Tensor x = Tensor::normal({4, 3, 12, 12}, 0.0, 1.0, gen);
      const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 3, 1, 4}, {4});
      Tensor loss = softmax_cross_entropy(m->forward(x), y);
      backward(loss);
      losses.push_back(loss.item<float>());
    }
    std::map<std::string, std::vector<float>> state = grads_of(*m);
    for (auto& [name, t] : m->named_buffers()) state["buffer " + name] = t.to_vector<float>();
    state["losses"] = losses;
    return state;
  };
  const auto plain = run(nn::RecomputePolicy::none), again = run(nn::RecomputePolicy::full);
  ASSERT_EQ(plain.size(), again.size());
  for (const auto& [name, v] : plain) EXPECT_EQ(again.at(name), v) << name;
  nn::ModulePtr m = nn::make_model("resnet18", cfg);
  try {
    dynamic_cast<nn::BlockRecompute&>(*m).set_recompute(nn::RecomputePolicy::selective);
    FAIL() << "selective was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a ResNet takes none or full"), std::string::npos) << e.what();
  }
}
