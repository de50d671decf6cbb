// Llama on the GPU against the CPU: a model read from a Hugging Face directory (tests/fixtures/hf) gives the
// CPU's logits, loss and gradients in f32 (exact products), and in bf16 within bf16's rounding; the cached
// forward on the GPU gives the whole sequence's logits.
#include <cmath>
#include <filesystem>

#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/pretrained.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

const std::filesystem::path kFixtures = std::filesystem::path(TANDEM_SOURCE_DIR) / "tests" / "fixtures" / "hf";

struct LlamaRun {
  Tensor logits, loss;
  std::vector<Tensor> grads;
};

LlamaRun run_model(const std::string& name, Device device, Precision p) {
  nn::Pretrained m = nn::from_pretrained((kFixtures / name).string(), device);
  auto* lm = dynamic_cast<nn::Llama*>(m.model.get());
  Tensor tokens = Tensor::from_vector<int64_t>({3, 17, 5, 60, 2, 9, 44, 1, 30, 12, 8, 50, 7, 3, 3, 21}, {2, 8}).to(device);
  Tensor targets = Tensor::from_vector<int64_t>({17, 5, 60, 2, 9, 44, 1, 30, 12, 8, 50, 7, 3, 3, 21, 4}, {2, 8}).to(device);
  LlamaRun r;
  PrecisionScope scope(p);
  {
    NoGradGuard no_grad;
    r.logits = lm->forward(tokens).to(DType::f32).cpu();
  }
  Tensor loss = lm->loss(tokens, targets);
  backward(loss);
  r.loss = loss.detach().to(DType::f32).cpu();
  for (const Tensor& t : lm->parameters()) r.grads.push_back(t.grad().to(DType::f32).cpu());
  return r;
}

}  // namespace

TEST(CudaLlama, TheGpuGivesTheCpusLogitsLossAndGradients) {
  REQUIRE_GPU();
  for (const char* name : {"llama_tied_gqa", "llama_untied_mha", "llama_theta_mqa"}) {
    const LlamaRun cpu = run_model(name, Device::cpu(), Precision::f32);
    const LlamaRun f32 = run_model(name, gpu(), Precision::f32);
    expect_norm_close(cpu.logits, f32.logits, 1e-5, std::string(name) + " f32 logits");
    EXPECT_NEAR(cpu.loss.item<float>(), f32.loss.item<float>(), 1e-5) << name;
    for (size_t i = 0; i < cpu.grads.size(); ++i)
      expect_norm_close(cpu.grads[i], f32.grads[i], 1e-4, std::string(name) + " f32 gradient " + std::to_string(i));
    const LlamaRun bf16 = run_model(name, gpu(), Precision::bf16);
    expect_norm_close(cpu.logits, bf16.logits, 3e-2, std::string(name) + " bf16 logits");
    EXPECT_NEAR(cpu.loss.item<float>(), bf16.loss.item<float>(), 3e-2 * std::fabs(cpu.loss.item<float>())) << name;
    for (size_t i = 0; i < cpu.grads.size(); ++i)
      expect_norm_close(cpu.grads[i], bf16.grads[i], 6e-2, std::string(name) + " bf16 gradient " + std::to_string(i));
  }
}

TEST(CudaLlama, CachedForwardOnTheGpuEqualsTheWholeSequence) {
  REQUIRE_GPU();
  nn::LlamaConfig c;
  c.layers = 2, c.width = 128, c.heads = 4, c.kv_heads = 2, c.mlp_hidden = 96, c.vocab = 50, c.context = 32;
  c.rope_scaling = {};
  nn::Llama m(c, 4);
  m.to(gpu());
  m.eval();
  NoGradGuard no_grad;
  PrecisionScope scope(Precision::f32);
  Tensor tokens = Tensor::from_vector<int64_t>({3, 7, 1, 39, 0, 12, 5, 8, 20, 2}, {1, 10}).to(gpu());
  Tensor whole = m.forward(tokens);
  nn::GptCache cache;
  Tensor head = m.forward_cached(tokens.narrow(1, 0, 7), cache);
  Tensor tail = m.forward_cached(tokens.narrow(1, 7, 3), cache);
  expect_norm_close(whole.narrow(1, 0, 7), head, 1e-5, "cached prefix");
  expect_norm_close(whole.narrow(1, 7, 3), tail, 1e-5, "cached continuation");
}

}  // namespace tandem
