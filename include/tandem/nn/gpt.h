#pragma once
// A GPT language model: token and learned position embeddings, pre-norm transformer blocks (LayerNorm,
// causal multi-head attention, MLP with tanh-GELU), a final LayerNorm and logits through the token
// embedding's weights (tied).
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/error.h"

namespace tandem::nn {

/// The shape of a GPT. Named configurations: gpt_config.
struct GptConfig {
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t width = 768;     // the embedding (residual stream) width; a multiple of heads
  int64_t context = 1024;  // the longest sequence (the position table's rows)
  int64_t vocab = 50304;   // token ids below this; GPT-2's 50257, padded to a multiple of 128
  double dropout = 0.0;    // after the embeddings, on attention weights, after each residual branch
  bool bias = true;        // biases in the linear layers and LayerNorms
};

/// "gpt2" (124M: 12 layers, 12 heads, 768 wide, context 1024, vocabulary 50304), "gpt2-medium" (350M: 24, 16,
/// 1024), "char" (6 layers, 6 heads, 384 wide, context 256, dropout 0.2, a byte vocabulary of 256).
/// Throws tandem::Error (Input) naming the valid names otherwise.
inline GptConfig gpt_config(const std::string& name) {
  GptConfig c;
  if (name == "gpt2") return c;
  if (name == "gpt2-medium") {
    c.layers = 24, c.heads = 16, c.width = 1024;
    return c;
  }
  if (name == "char") {
    c.layers = 6, c.heads = 6, c.width = 384, c.context = 256, c.vocab = 256, c.dropout = 0.2;
    return c;
  }
  throw Error(Error::Kind::Input, "unknown GPT configuration '" + name + "' (use gpt2, gpt2-medium or char)");
}

/// Names gpt_config accepts.
inline std::vector<std::string> gpt_config_names() { return {"gpt2", "gpt2-medium", "char"}; }

}  // namespace tandem::nn
