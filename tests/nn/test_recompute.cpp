// Activation recompute: autograd's recompute gives the gradients of the op recorded plainly (an op alone, with
// gradients flowing into its input and its parameters, a frozen parameter left out), and a Llama's and a GPT's
// blocks recomputed give the same loss and every parameter's gradient bit for bit on the CPU (the inner pass adds
// where the plain pass adds and hands on the column sums the bias gradients read), while the step's peak memory
// falls; dropout is refused.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "tandem/autograd.h"
#include "tandem/device.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/ops.h"

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
  auto step = [&](nn::Module& m, nn::CausalLm& lm, bool on) {
    lm.set_recompute(on);
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
    auto [loss_plain, grads_plain, peak_plain] = step(*m, *lm, false);
    auto [loss_again, grads_again, peak_again] = step(*m, *lm, true);
    EXPECT_EQ(loss_again, loss_plain);
    EXPECT_EQ(grads_again.size(), grads_plain.size());
    for (auto& [name, g] : grads_plain) EXPECT_EQ(grads_again[name], g) << name;
    EXPECT_LT(peak_again, peak_plain) << "recompute should hold fewer activations at once";
  }
}

TEST(Recompute, DropoutIsRefused) {
  nn::GptConfig gc;
  gc.layers = 1, gc.width = 16, gc.heads = 2, gc.vocab = 20, gc.context = 8, gc.dropout = 0.1;
  nn::GPT gpt(gc, 1);
  try {
    gpt.set_recompute(true);
    ADD_FAILURE() << "recompute with dropout accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(gpt.recomputes());
}
