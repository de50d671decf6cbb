#pragma once
// Llama-family language models (Llama 3, and the Qwen, Mistral, SmolLM shapes of the same design): token
// embeddings, pre-norm blocks of RMSNorm, grouped-query attention with rotary position embeddings and a SwiGLU
// MLP (TransformerBlock with Llama's options), a final RMSNorm and an output layer that is the token table
// (tied) or a matrix of its own.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/nn/gpt.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

/// The shape of a Llama. Named configurations: llama_config.
struct LlamaConfig {
  int64_t layers = 16;
  int64_t width = 2048;       // hidden_size
  int64_t heads = 32;         // num_attention_heads; width is a multiple of it
  int64_t kv_heads = 8;       // num_key_value_heads; divides heads
  int64_t mlp_hidden = 8192;  // intermediate_size
  int64_t vocab = 128256;
  int64_t context = 2048;     // the longest sequence trained or generated (rotary tables cover it)
  double rope_theta = 500000.0;
  RopeScaling rope_scaling{};  // Llama 3's "llama3" rescaling when factor > 0
  double rms_eps = 1e-5;
  bool tied = true;            // the output layer is the token table
  bool attention_bias = false, mlp_bias = false;
  double init_std = 0.02;      // initializer_range
  double dropout = 0.0;        // on attention probabilities and after each residual branch, in training (none on the embeddings)
};

/// "llama-1b" (Llama 3.2 1B: 16 layers, 2048 wide, 32 heads, 8 key-value heads, MLP 8192, vocabulary 128256,
/// tied, theta 500000, llama3 rope scaling factor 32), "llama-3b" (3.2 3B: 28 layers, 3072 wide, 24 heads, 8
/// key-value heads, MLP 8192, tied), "llama-8b" (3.1 8B: 32 layers, 4096 wide, 32 heads, 8 key-value heads, MLP
/// 14336, untied, factor 8); all at context 2048. Throws tandem::Error (Input) naming the valid names otherwise.
LlamaConfig llama_config(const std::string& name);
std::vector<std::string> llama_config_names();
/// Throws tandem::Error (Input) naming the field when the configuration describes no model.
void check_llama_config(const LlamaConfig& cfg);
/// The configuration as a JSON object (every field), and back (every key required, no other accepted).
std::string llama_config_to_json(const LlamaConfig& cfg);
LlamaConfig llama_config_from_json(const std::string& json);
/// Trainable scalars of a Llama of this configuration (the token table once when tied); without the token
/// table when include_token_table is false (the count 6N takes for a tied model, as nanoGPT's).
int64_t llama_num_parameters(const LlamaConfig& cfg, bool include_token_table = true);
/// Training FLOPs per token for sequences of seq_len: 6 N (N without the token table when tied) + 12 layers width
/// seq_len (llama_peer.py's count).
double llama_flops_per_token(const LlamaConfig& cfg, int64_t seq_len = 0);

/// A Llama language model. forward maps tokens [B, T] (i32 or i64, T <= context) to logits [B, T, vocab].
/// Parameters: wte.weight (the token table), h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight (the queries', keys'
/// and values' projections stacked: [width + 2 kv_heads head_size, width]), h.{i}.attn.c_proj.weight,
/// h.{i}.ln_2.weight, h.{i}.mlp.c_fc.weight (the gate's then the up projection's rows: [2 mlp_hidden, width]),
/// h.{i}.mlp.c_proj.weight, ln_f.weight, and lm_head.weight when untied (Linear weights [out, in]; biases where
/// the flags ask). Initialisation (transformers'): weights and the table from N(0, init_std^2), norms one.
class Llama : public Module, public LayerGroups, public CausalLm {
 public:
  explicit Llama(const LlamaConfig& cfg, uint64_t seed = 0);
  Tensor forward(const Tensor& tokens) override;
  /// The mean cross-entropy of targets [B, T] (ignore_index positions left out), the head taken with the loss.
  Tensor loss(const Tensor& tokens, const Tensor& targets, int64_t ignore_index = -100) override;
  /// Logits for the next tokens [B, Tn] after those `cache` holds (GPT::forward_cached).
  Tensor forward_cached(const Tensor& tokens, GptCache& cache);
  /// Continues `prompt` by up to n tokens (GPT::generate; opt.stop_token ends it early).
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t n, const SampleOptions& opt = {},
                                const std::function<void(int64_t)>& on_token = {});
  const LlamaConfig& config() const { return cfg_; }
  /// The output layer's weight [vocab, width]: the token table when tied.
  const Tensor& head_weight() const { return cfg_.tied ? wte->weight : lm_head->weight; }
  std::string describe() const override;
  double flops_per_token(int64_t context) const override { return llama_flops_per_token(cfg_, context); }
  /// The embeddings, each block, and the head (ln_f and the output weight: the token table again when tied).
  std::vector<LayerGroup*> layer_groups() override;

  std::shared_ptr<Embedding> wte;
  std::vector<std::shared_ptr<TransformerBlock>> h;
  std::shared_ptr<RMSNorm> ln_f;
  std::shared_ptr<Linear> lm_head;  // null when tied

 private:
  void check_tokens(const Tensor& tokens, int64_t start, const char* what) const;
  Tensor hidden(const Tensor& tokens, GptCache* cache);  // the last block's output
  LlamaConfig cfg_;
  std::shared_ptr<RotaryCache> rotary_;
  std::shared_ptr<Sequential> blocks_;
  LayerGroup embed_group_, head_group_;
  std::vector<LayerGroup> block_groups_;
};

}  // namespace tandem::nn
