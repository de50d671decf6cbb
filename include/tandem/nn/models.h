#pragma once
// Ready-made models for the trainer.
#include <string>
#include <vector>

#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/module.h"

namespace tandem::nn {

/// What a model is built for.
struct ModelConfig {
  int64_t in_channels = 1, height = 28, width = 28;
  int64_t num_classes = 10;
  std::vector<int64_t> hidden = {};  // mlp hidden sizes (default 512, 512)
  uint64_t seed = 0;                  // initialisation
  /// Language models: the GPT's shape (model "gpt"); the bigram model reads its vocab alone. The image
  /// fields above do not apply to them.
  GptConfig gpt;
  LlamaConfig llama;  // model "llama"
};

/// A model of residual blocks whose activations can be recomputed (activation checkpointing): the ResNets. Under
/// full recompute each block (a layer group) keeps only its input for backward and runs again there (autograd's
/// recompute); batch normalisation normalises with the batch's statistics both times and moves its running
/// statistics once. The same gradients as without (bit for bit on the CPU). Selective recompute is the
/// transformer blocks' (norm and SwiGLU outputs) and is refused here.
class BlockRecompute {
 public:
  virtual ~BlockRecompute() = default;
  virtual void set_recompute(RecomputePolicy policy) = 0;
};

/// Builds "cnn" (the guide's: conv 20 5x5, pool, conv 50 5x5, pool, linear 500, linear 10),
/// "mlp" (flatten, hidden linear+relu layers, linear), or "resnet18" / "resnet34" / "resnet50" /
/// "resnet101" / "resnet152" (ImageNet stem for inputs of 64 pixels and more, a 3x3 stem below), or a
/// language model: "gpt" (a GPT of cfg.gpt, initialised from cfg.seed: forward takes tokens [B, T], see
/// nn::GPT), "llama" (a Llama of cfg.llama, nn::Llama) or "bigram", the smallest there is, one Embedding(vocab, vocab) table (cfg.gpt.vocab) whose row
/// for a token holds the logits of the next one, so that tokens i32 [B, T] give logits [B, T, vocab] (for
/// tests and smoke runs of language-model training).
/// Throws tandem::Error naming the valid models otherwise.
ModulePtr make_model(const std::string& name, const ModelConfig& cfg);
/// Names make_model accepts.
std::vector<std::string> model_names();
/// The models of model_names() that are language models: they read tokens i32 [B, T] and give the
/// next token's logits [B, T, vocab].
std::vector<std::string> language_model_names();
/// Whether make_model builds `name` as a language model.
bool is_language_model(const std::string& name);

}  // namespace tandem::nn
