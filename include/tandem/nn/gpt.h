#pragma once
// A GPT language model: token and learned position embeddings, pre-norm transformer blocks (LayerNorm,
// causal multi-head attention, MLP with tanh-GELU), a final LayerNorm and logits through the token
// embedding's weights (tied).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

/// The shape of a GPT. Named configurations: gpt_config.
struct GptConfig {
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t width = 768;     // the embedding (residual stream) width; a multiple of heads
  int64_t context = 1024;  // the longest sequence (the position table's rows)
  int64_t vocab = 50304;   // the token table's rows; GPT-2's 50257, padded to a multiple of 128
  double dropout = 0.0;    // after the embeddings, on attention weights, after each residual branch
  bool bias = true;        // biases in the linear layers and LayerNorms
  /// The token ids in use when fewer than vocab (0: all of vocab). A Hugging Face GPT-2 of 50257 tokens is built
  /// with vocab 50304 and logical_vocab 50257: the table's rows from logical_vocab on are padding, zero from
  /// import, never an input or a prediction (masked out of the loss, so their gradient is zero) and cut off
  /// again on export.
  int64_t logical_vocab = 0;
  /// The vocabulary the model speaks: logical_vocab, or vocab when that is 0.
  int64_t used_vocab() const { return logical_vocab > 0 ? logical_vocab : vocab; }
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

/// Throws tandem::Error (Input) naming the field when the configuration describes no model: layers, heads,
/// context and vocab must be positive, width a positive multiple of heads, dropout in [0, 1), logical_vocab
/// 0 or in [1, vocab].
void check_gpt_config(const GptConfig& cfg);

/// The configuration as a JSON object: {"layers":12,"heads":12,"width":768,"context":1024,"vocab":50304,
/// "dropout":0.0,"bias":true}, with "logical_vocab" after them when it is set below vocab.
std::string gpt_config_to_json(const GptConfig& cfg);
/// Reads such an object back; every key but logical_vocab is required and no other is accepted. Throws
/// tandem::Error (Input) naming the key that is missing, unknown or of the wrong type, or the field
/// check_gpt_config refuses.
GptConfig gpt_config_from_json(const std::string& json);
/// A checkpoint's meta JSON for a GPT: {"model":"gpt","gpt":{...gpt_config_to_json...}}. tandem generate
/// reads exactly these two keys; a writer may add others beside them.
std::string gpt_checkpoint_meta(const GptConfig& cfg);
/// The GPT configuration in a checkpoint's meta JSON (written as gpt_checkpoint_meta writes it). Throws
/// tandem::Error (Input) saying what is wrong: not JSON, no "model" or one other than "gpt" (not a GPT
/// checkpoint), or a bad "gpt" object. `what` names the source in the messages (the file's path).
GptConfig gpt_config_from_meta(const std::string& meta_json, const std::string& what = "checkpoint");

/// Trainable scalars of a GPT of this configuration (the token table counted once: it is also the output
/// layer). Without the position table when include_position_table is false (nanoGPT's "non-embedding" count).
int64_t gpt_num_parameters(const GptConfig& cfg, bool include_position_table = true);
/// Floating-point operations of one training step (forward and backward) per token for sequences of
/// seq_len tokens, as nanoGPT and the PaLM paper (appendix B) estimate them: 6 N for the matrix products
/// of the N = gpt_num_parameters(cfg, false) weights, plus 12 layers width seq_len for the attention
/// scores and their weighted sums. seq_len <= 0 takes the context. For model FLOPs utilisation: tokens per
/// second times this, over the hardware's peak.
double gpt_flops_per_token(const GptConfig& cfg, int64_t seq_len = 0);

/// The incremental-decoding state of a GPT: one key-value cache per block and the positions they hold.
struct GptCache {
  std::vector<KVCache> layers;
  int64_t length = 0;
  /// Forgets the positions (the memory is kept).
  void clear() {
    for (KVCache& c : layers) c.clear();
    length = 0;
  }
};

/// How GPT::generate draws each token.
struct SampleOptions {
  /// The logits are divided by it before the softmax (below 1: more likely tokens favoured); 0 takes the
  /// most likely token at every step (greedy decoding; top_k and seed do not matter then).
  double temperature = 1.0;
  /// Only the top_k most likely tokens can be drawn (ties with the k-th kept); 0: every token.
  int64_t top_k = 0;
  /// The draws' generator: the same seed, weights and device give the same tokens.
  uint64_t seed = 0;
  /// Only the most likely tokens whose probabilities (after temperature and top_k) add up to top_p can be drawn
  /// (nucleus sampling; the token that reaches it included); 1: every token.
  double top_p = 1.0;
  /// Generation ends after this token is drawn (the end-of-text token; it is returned); negative: none.
  int64_t stop_token = -1;
};

/// Draws a token from one position's logits (a vocabulary's worth) as GPT::generate does: temperature,
/// top_k, top_p, then a draw from the softmax with one gen.next_double(). Throws on NaN logits.
int64_t sample_logits(const std::vector<float>& logits, const SampleOptions& opt, Generator& gen);

/// The sampling loop of a decoder's generate (GPT, Llama): `step` runs tokens [1, Tn] after the positions the
/// cache holds and gives their logits [1, Tn, vocab]. The prompt runs once, then each drawn token alone against
/// the cached keys and values; past `context` tokens the sequence is cropped to its last `context` (their cache
/// rebuilt). Runs `model` in evaluation mode without gradients (its mode restored after); `who` names the model
/// in errors.
std::vector<int64_t> generate_tokens(Module& model, const std::function<Tensor(const Tensor&, GptCache&)>& step,
                                     int64_t context, int64_t vocab, Device device, const std::vector<int64_t>& prompt,
                                     int64_t n, const SampleOptions& opt, const std::function<void(int64_t)>& on_token,
                                     const char* who);

/// A language model that takes its loss together with its output layer (GPT, Llama): trainers call loss()
/// instead of computing the cross-entropy of forward's logits, which are then never kept whole.
/// What a transformer block keeps for backward (CausalLm::set_recompute).
enum class RecomputePolicy { none, selective, full };
/// "none", "selective" or "full".
RecomputePolicy parse_recompute(const std::string& name);
const char* recompute_name(RecomputePolicy p);

class CausalLm {
 public:
  virtual ~CausalLm() = default;
  /// The mean cross-entropy of targets [B, T] (the next tokens; ignore_index positions left out).
  virtual Tensor loss(const Tensor& tokens, const Tensor& targets, int64_t ignore_index = -100) = 0;
  /// Activation recompute. full: each transformer block keeps only its input for backward and runs again there
  /// (autograd's recompute), so that a step holds one block's activations at a time instead of every block's;
  /// about a third more compute. selective: each block keeps its products' outputs and frees its norms' (and
  /// the SwiGLU activation's) outputs, made again in backward before they are read (autograd's RecomputeRegion):
  /// a fraction of the memory for a few elementwise passes. The same gradients (bit for bit on the CPU),
  /// dropout included (the second run replays the first's masks).
  void set_recompute(RecomputePolicy policy) { recompute_ = policy; }
  void set_recompute(bool on) { recompute_ = on ? RecomputePolicy::full : RecomputePolicy::none; }
  RecomputePolicy recompute_policy() const { return recompute_; }
  bool recomputes() const { return recompute_ != RecomputePolicy::none; }
  /// Packed documents: positions i32 [B, T] on the model's device, each token's position in its document (0 at
  /// each document's first token, counting up to the next). The forwards and losses of tokens [B, T] that
  /// follow see each document alone: attention does not cross documents, and positions (GPT's table, Llama's
  /// rotation) count from each document's start, as if each document had a row of its own. The tensor is read
  /// when a forward runs (a buffer refilled before each step serves every step). Undefined (the default): one
  /// sequence per row. Generation (forward_cached) ignores it.
  void set_document_positions(const Tensor& positions) { doc_pos_ = positions; }

 protected:
  /// A block's forward under the policy.
  Tensor run_block(TransformerBlock& block, const Tensor& in);
  /// The document positions for tokens (checked against their shape and device; undefined when none are set),
  /// handed to each block's attention.
  Tensor documents_for(const Tensor& tokens, const std::vector<std::shared_ptr<TransformerBlock>>& blocks,
                       const char* what);
  RecomputePolicy recompute_ = RecomputePolicy::none;
  Tensor doc_pos_;
};

/// GPT-2's language model. forward maps tokens [B, T] (i32 or i64, T <= context) to logits [B, T, V], V the
/// used vocabulary (config().used_vocab(): the table's rows less any padding, whose logits are never formed):
/// x = wte[tokens] + wpe[0..T) (then dropout), the blocks h.0 ... h.{layers-1} (TransformerBlock, causal),
/// ln_f, and logits = ln_f(x) wte^T: the output layer is the token table itself (one parameter, whose
/// gradient sums both uses). Parameters are named as GPT-2's: wte.weight, wpe.weight, h.0.ln_1.weight,
/// h.0.attn.c_attn.weight, ..., ln_f.weight (Linear weights are [out, in], the transpose of GPT-2's
/// Conv1D files). Initialisation (GPT-2's, from seed): weights and both tables from N(0, 0.02^2), the
/// branches' output projections from N(0, (0.02 / sqrt(2 layers))^2), biases zero, LayerNorm weights one.
///
/// Tokens outside [0, V) are an error: on the CPU forward checks them at once (naming the position);
/// on a GPU the embedding checks them against the table's rows (vocab) on the device without making the host
/// wait, and the error is raised at the next synchronisation (the loss's item(), a copy to the host).
class GPT : public Module, public LayerGroups, public CausalLm {
 public:
  explicit GPT(const GptConfig& cfg, uint64_t seed = 0);
  Tensor forward(const Tensor& tokens) override;
  /// The mean cross-entropy of targets [B, T] (the next tokens; ignore_index positions left out) under the
  /// logits forward(tokens) gives, the head taken with the loss (linear_cross_entropy over the whole table, its
  /// padding columns masked inside the loss kernel): in training the [B, T, vocab] logits are never kept beside
  /// their gradient. Targets must be below V.
  Tensor loss(const Tensor& tokens, const Tensor& targets, int64_t ignore_index = -100) override;
  /// Logits [B, Tn, V] for the next Tn tokens [B, Tn] of sequences whose earlier tokens `cache` holds
  /// (empty: Tn is the start of the sequences), their keys and values appended to it: the rows forward gives
  /// for those positions of the whole sequences, without recomputing the earlier ones. No dropout, no
  /// gradient recorded. Throws when the sequences would pass the context.
  Tensor forward_cached(const Tensor& tokens, GptCache& cache);
  /// Continues `prompt` (1 to context tokens) by n tokens, drawn one at a time with opt; returns them (the
  /// prompt not included) and passes each to on_token as soon as it is drawn. The prompt runs once, then
  /// each step runs the one new token against the cached keys and values. When the sequence fills the
  /// context, it is cropped: each further token is drawn from the logits of the last `context` tokens
  /// (their cache rebuilt, since their positions shift), as nanoGPT's sampling does. Runs in evaluation
  /// mode without recording gradients, on the model's device; the model's mode is restored afterwards.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t n, const SampleOptions& opt = {},
                                const std::function<void(int64_t)>& on_token = {});
  const GptConfig& config() const { return cfg_; }
  std::string describe() const override;
  /// gpt_flops_per_token at this context (0: the configuration's).
  double flops_per_token(int64_t context) const override { return gpt_flops_per_token(cfg_, context); }
  NamedGenerators own_generators() override { return {{"rng", &gen_}}; }
  /// The embeddings (wte, wpe), each block, and the head (ln_f and the token table again: the table is a
  /// parameter of two groups).
  std::vector<LayerGroup*> layer_groups() override;

  std::shared_ptr<Embedding> wte, wpe;
  std::vector<std::shared_ptr<TransformerBlock>> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  void check_tokens(const Tensor& tokens, int64_t start, const char* what) const;
  Tensor hidden(const Tensor& tokens, GptCache* cache);  // the last block's output [B, T, width]
  Tensor logits(const Tensor& x);                       // [B, T, used_vocab()] of the last block's output
  GptConfig cfg_;
  LayerGroup embed_group_, head_group_;
  std::vector<LayerGroup> block_groups_;
  std::shared_ptr<Sequential> blocks_;
  Generator gen_;  // the embeddings' dropout
};

}  // namespace tandem::nn
