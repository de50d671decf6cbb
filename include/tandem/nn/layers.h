#pragma once
// Standard layers.
#include <array>
#include <functional>
#include <initializer_list>
#include <optional>

#include "tandem/nn/layer_group.h"
#include "tandem/nn/module.h"
#include "tandem/ops.h"
#include "tandem/random.h"

namespace tandem::nn {

/// 2-D convolution; weight [out, in / groups, k, k] drawn from N(0, 2/(fan_in+fan_out)) (fans of one
/// group), bias zero. With relu, a ReLU is fused into the output; groups > 1 convolves each of that many
/// slices of the channels with its own filters (groups == in_channels: depthwise).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int kernel, Generator& gen, int stride = 1, int padding = 0,
         bool bias = true, bool relu = false, int groups = 1);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  Tensor weight, bias;

 private:
  Conv2dOptions opt_;
};

/// Fully connected layer; weight [out, in] drawn from N(0, 2/(in+out)), bias zero. With relu, a ReLU is
/// fused into the output.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias = true, bool relu = false);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  Tensor weight, bias;

 private:
  bool relu_;
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(int kernel, int stride = -1, int padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  Pool2dOptions opt_;
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(int kernel, int stride = -1, int padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  Pool2dOptions opt_;
};

/// Batch normalisation; running statistics are buffers, so ranks can synchronise them.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double momentum = 0.1, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  /// max(bn(x) + residual, 0) with relu, bn(x) + residual without, in one pass (residual may be undefined).
  Tensor forward_act(const Tensor& x, const Tensor& residual, bool relu);
  std::string describe() const override;
  Tensor gamma, beta, running_mean, running_var;
  double momentum() const { return momentum_; }
  double eps() const { return eps_; }

  /// Computes the layer in training mode instead of the local batch statistics (sync batch norm
  /// takes them over every rank), in forward and forward_act; an empty function restores the local
  /// computation.
  using TrainForward = std::function<Tensor(BatchNorm2d& self, const Tensor& x)>;
  void set_train_forward(TrainForward f) { train_forward_ = std::move(f); }

 private:
  double momentum_, eps_;
  TrainForward train_forward_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string describe() const override { return "ReLU"; }
};

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override { return flatten(x, 1); }
  std::string describe() const override { return "Flatten"; }
};

/// Drops activations with probability p in training; its generator is seeded per layer.
class Dropout : public Module {
 public:
  explicit Dropout(double p, uint64_t seed = 0);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 protected:
  NamedGenerators own_generators() override { return {{"rng", &gen_}}; }

 private:
  double p_;
  Generator gen_;
};

/// Runs its children in order.
class Sequential : public Module, public LayerGroups {
 public:
  Sequential() = default;
  /// Appends a layer; its parameters are named by position ("3.weight").
  template <class M>
  std::shared_ptr<M> add(std::shared_ptr<M> m) {
    layers_.push_back(m);
    return register_module(std::to_string(layers_.size() - 1), m);
  }
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  size_t size() const { return layers_.size(); }
  const std::vector<ModulePtr>& layers() const { return layers_; }
  /// From now on each layer with parameters (those added so far) is a layer group of its own, which
  /// layer_groups() lists (DistOpt's --shard parameters gathers each just for its forward and backward);
  /// without it, the Sequential declares none.
  void group_layers();
  std::vector<LayerGroup*> layer_groups() override;

 private:
  std::vector<ModulePtr> layers_;
  std::vector<LayerGroup> groups_;  // group_layers: per layer, its group (no parameters: none)
};

// ---- elementwise layers (activations)

// ---- shape layers and products (Gemm, Reshape, 1-D pooling)
/// SINGA's Gemm layer: alpha op(x) op(weight) + beta bias for 2-D x (op transposes with trans_a / trans_b);
/// weight [out, in] with trans_b, else [in, out], drawn from N(0, 2/(in+out)); bias [1, out] zero.
class Gemm : public Module {
 public:
  Gemm(int64_t in_features, int64_t out_features, Generator& gen, double alpha = 1.0, double beta = 1.0,
       bool trans_a = false, bool trans_b = true, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  Tensor weight, bias;

 private:
  double alpha_, beta_;
  bool trans_a_, trans_b_;
};

/// The same elements in another shape (one extent may be -1); a view where the strides allow.
class Reshape : public Module {
 public:
  explicit Reshape(Shape shape) : shape_(std::move(shape)) {}
  Tensor forward(const Tensor& x) override { return reshape(x, shape_); }
  std::string describe() const override;

 private:
  Shape shape_;
};

/// Max over windows of the last dimension of [N, C, W] (or [N, C, 1, W]).
class MaxPool1d : public Module {
 public:
  MaxPool1d(int kernel, int stride = -1, int padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  Pool2dOptions opt_;
};

/// Mean over windows of the last dimension of [N, C, W] (or [N, C, 1, W]), padding counted as zeros.
class AvgPool1d : public Module {
 public:
  AvgPool1d(int kernel, int stride = -1, int padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  Pool2dOptions opt_;
};


// ---- normalisation, softmax, losses, attention
/// Layer normalisation over the trailing dimensions normalized_shape (layer_norm); with affine, a weight
/// (ones) and, with bias, a bias (zeros) of that shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true, bool bias = true);
  Tensor forward(const Tensor& x) override;
  /// forward for a product with a bias after it: the same values; where TANDEM_BIAS_FROM_PRODUCT=1 and
  /// gradients are recorded, the output's rows are padded in memory so that the product's weight gradient
  /// takes its bias gradient too.
  Tensor forward_padded(const Tensor& x);
  std::string describe() const override;
  const Shape& normalized_shape() const { return shape_; }
  double eps() const { return eps_; }
  Tensor weight, bias;  // undefined without affine (bias also without bias)

 private:
  Shape shape_;
  double eps_;
};

/// Root-mean-square normalisation over the trailing dimensions normalized_shape (rms_norm); with affine, a
/// weight of ones.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, double eps = 1e-6, bool affine = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  const Shape& normalized_shape() const { return shape_; }
  double eps() const { return eps_; }
  Tensor weight;  // undefined without affine

 private:
  Shape shape_;
  double eps_;
};

/// Multi-head attention over [B, T, embed_dim]: query, key and value projections (Linear layers, named
/// q_proj, k_proj, v_proj), num_heads heads of embed_dim / num_heads features each through
/// scaled_dot_product_attention (causal: each position attends to itself and earlier ones), and an output
/// projection (out_proj). In training the attention probabilities are dropped with probability dropout.
class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t embed_dim, int64_t num_heads, Generator& gen, bool causal = false, bool bias = true,
                     double dropout = 0.0, uint64_t seed = 0);
  /// Self-attention: query, key and value are all x [B, T, embed_dim].
  Tensor forward(const Tensor& x) override;
  /// Attention of query [B, Tq, embed_dim] over key and value [B, Tk, embed_dim], giving [B, Tq, embed_dim].
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value);
  std::string describe() const override;
  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return heads_; }
  bool causal() const { return causal_; }
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;

 protected:
  NamedGenerators own_generators() override { return {{"rng", &gen_}}; }

 private:
  int64_t embed_dim_, heads_;
  bool causal_;
  double dropout_;
  Generator gen_;
};

/// The keys and values a SelfAttention layer computed for the positions it has seen, kept between calls of
/// forward_cached so that decoding one token at a time does not recompute them: keys and values are
/// [capacity, B, heads, head_dim] (position-major, so that appending positions writes one contiguous block),
/// positions [0, length) filled.
struct KVCache {
  Tensor keys, values;
  int64_t length = 0;
  int64_t capacity() const { return keys.defined() ? keys.size(0) : 0; }
  /// Forgets the positions (the memory is kept for the next sequence).
  void clear() { length = 0; }
};

/// GPT-2's self-attention over x [B, T, width]: one projection c_attn (width -> 3 width: the query, key and
/// value side by side, one matrix product), `heads` heads of width / heads features through
/// scaled_dot_product_attention (causal: each position attends to itself and earlier ones), and the output
/// projection c_proj. Weights drawn from N(0, init_std^2), c_proj's from N(0, proj_std^2), biases zero. In
/// training the attention probabilities are dropped with probability dropout.
/// Rotary position embeddings' tables (rotary_tables) shared by a model's attention layers, made on first use
/// for the device and dtype asked (positions 0 .. positions - 1) and kept.
class RotaryCache {
 public:
  RotaryCache(int64_t head_dim, int64_t positions, double theta, RopeScaling scaling = {})
      : head_dim_(head_dim), positions_(positions), theta_(theta), scaling_(scaling) {}
  /// cos and sin [length, head_dim] for positions start .. start + length - 1.
  std::pair<Tensor, Tensor> at(int64_t start, int64_t length, DType dtype, Device device);
  int64_t positions() const { return positions_; }
  double theta() const { return theta_; }
  const RopeScaling& scaling() const { return scaling_; }

 private:
  int64_t head_dim_, positions_;
  double theta_;
  RopeScaling scaling_;
  Tensor cos_, sin_;
};

class SelfAttention : public Module {
 public:
  SelfAttention(int64_t width, int64_t heads, Generator& gen, bool causal = true, bool bias = true,
                double dropout = 0.0, double init_std = 0.02, double proj_std = 0.02);
  /// Grouped-query attention (Llama's): kv_heads heads of keys and values (a divisor of heads; each serves
  /// heads / kv_heads query heads), c_attn giving the queries, keys and values side by side ([width + 2 kv_heads
  /// x head size] outputs), and, with `rotary`, rotary position embeddings on the queries and keys from its
  /// tables (Hugging Face's rotate-half layout). c_proj has `proj_bias` biases.
  SelfAttention(int64_t width, int64_t heads, int64_t kv_heads, std::shared_ptr<RotaryCache> rotary, Generator& gen,
                bool causal, bool bias, bool proj_bias, double dropout, double init_std, double proj_std);
  Tensor forward(const Tensor& x) override;
  /// residual + forward(x), the sum taken by the output projection (linear_residual).
  Tensor forward_residual(const Tensor& x, const Tensor& residual);
  /// Attention for x [B, Tn, width], the next Tn positions of the sequences whose earlier positions `cache`
  /// holds: their keys and values are appended to the cache (made for `capacity` positions on first use, or
  /// when it is empty and the batch, dtype or device changed), and each position attends to the cached ones
  /// and, under causal, the new ones up to itself (all of them without). The same values as forward over the
  /// whole sequence; no dropout, no gradient recorded. Throws when the cache cannot take Tn more positions.
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t capacity);
  std::string describe() const override;
  NamedGenerators own_generators() override { return {{"rng", &gen_}}; }
  int64_t width() const { return width_; }
  int64_t num_heads() const { return heads_; }
  int64_t num_kv_heads() const { return kv_heads_; }
  bool causal() const { return causal_; }
  /// Packed documents for the forwards that follow (not forward_cached): i32 [B, T], each token's position in
  /// its document (scaled_dot_product_attention's doc_positions; the rotary rows too). Undefined: none.
  void set_document_positions(const Tensor& positions) { doc_pos_ = positions; }
  std::shared_ptr<Linear> c_attn, c_proj;

 private:
  void check_input(const Tensor& x, const char* what) const;
  // The heads' outputs [B, T, width] of the projection qkv [B, T, (heads + 2 kv_heads) d] at positions start ...
  Tensor attend(const Tensor& qkv, int64_t start);
  int64_t width_, heads_, kv_heads_;
  bool causal_;
  double dropout_;
  std::shared_ptr<RotaryCache> rotary_;
  Generator gen_;
  Tensor doc_pos_;
};

/// GPT-2's MLP: c_fc (width -> hidden), the tanh form of GELU, c_proj (hidden -> width). Weights drawn from
/// N(0, init_std^2), c_proj's from N(0, proj_std^2), biases zero.
class FeedForward : public Module {
 public:
  FeedForward(int64_t width, int64_t hidden, Generator& gen, bool bias = true, double init_std = 0.02,
              double proj_std = 0.02);
  /// Llama's SwiGLU MLP with `gated`: c_fc (width -> 2 hidden: the gate's rows, then the up projection's),
  /// silu(gate) * up, c_proj (hidden -> width).
  FeedForward(int64_t width, int64_t hidden, Generator& gen, bool bias, double init_std, double proj_std, bool gated);
  bool gated() const { return gated_; }
  Tensor forward(const Tensor& x) override;
  /// residual + forward(x), the sum taken by c_proj's product (gelu_mlp's residual).
  Tensor forward_residual(const Tensor& x, const Tensor& residual);
  std::string describe() const override;
  std::shared_ptr<Linear> c_fc, c_proj;

 private:
  Tensor hidden_of(const Tensor& x);  // the activation c_proj takes
  bool gated_ = false;
};

/// How a TransformerBlock is made.
struct TransformerBlockOptions {
  bool causal = true;
  /// Dropped in training: the attention probabilities, and each residual branch's output before it is added.
  double dropout = 0.0;
  bool bias = true;           // biases in the linear layers and the LayerNorms
  int64_t mlp_ratio = 4;      // the MLP's hidden width, in multiples of the width
  double init_std = 0.02;     // the weights' standard deviation
  /// The output projections of the branches (attn.c_proj, mlp.c_proj) are drawn with init_std /
  /// sqrt(2 residual_layers): GPT-2's scaling for a stack of that many blocks.
  int64_t residual_layers = 1;
  double eps = 1e-5;  // the norms'
  // ---- Llama's choices (the defaults are GPT-2's)
  bool rms_norm = false;        // RMSNorm (weights only) instead of LayerNorm
  bool gated_mlp = false;       // SwiGLU instead of GELU
  int64_t mlp_hidden = 0;       // the MLP's hidden width (0: mlp_ratio * width)
  int64_t kv_heads = 0;         // grouped-query attention's key and value heads (0: heads)
  std::shared_ptr<RotaryCache> rotary;  // rotary position embeddings in the attention (null: none)
  std::optional<bool> attention_bias, mlp_bias;  // the linear layers' biases where they differ from `bias`
  bool scale_residual_init = true;  // false: the output projections drawn with init_std as well
};

/// A pre-norm transformer block over x [B, T, width] (GPT-2's): x + drop(attn(ln_1(x))), then
/// x + drop(mlp(ln_2(x))), with attn a SelfAttention of `heads` heads and mlp a FeedForward of
/// mlp_ratio * width hidden units. Parameters ln_1.*, attn.c_attn.*, attn.c_proj.*, ln_2.*, mlp.c_fc.*,
/// mlp.c_proj.* (Linear weights [out, in]).
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t width, int64_t heads, Generator& gen, const TransformerBlockOptions& opt = {});
  Tensor forward(const Tensor& x) override;
  /// The block over the next positions x [B, Tn, width] with the attention's keys and values of the earlier
  /// ones in cache (SelfAttention::forward_cached): no dropout, no gradient recorded.
  Tensor forward_cached(const Tensor& x, KVCache& cache, int64_t capacity);
  std::string describe() const override;
  NamedGenerators own_generators() override { return {{"rng", &gen_}}; }
  const TransformerBlockOptions& options() const { return opt_; }
  int64_t width() const { return width_; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;     // LayerNorms (GPT); null under rms_norm
  std::shared_ptr<RMSNorm> rms_1, rms_2;     // RMSNorms (Llama), also named ln_1 and ln_2; null otherwise
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<FeedForward> mlp;

 private:
  Tensor norm_1(const Tensor& x, bool padded);
  Tensor norm_2(const Tensor& x, bool padded);
  int64_t width_;
  TransformerBlockOptions opt_;
  Generator gen_;  // the residual branches' dropout
};


// ---- embedding and recurrent layers

/// A table of num_embeddings rows of dim values, looked up by integer indices (tandem::embedding);
/// weight drawn from N(0, 1) (PyTorch's nn.Embedding), or from U(-1, 1) with uniform (SINGA's choice).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, bool uniform = false);
  /// The rows indices (i32 or i64, any shape [...]) pick: [..., dim].
  Tensor forward(const Tensor& indices) override;
  std::string describe() const override;
  Tensor weight;  // [num_embeddings, dim]
};

/// A multi-layer recurrent network (tandem::rnn) with PyTorch's parameters: for layer l,
/// weight_ih_l{l} [G H, I_l], weight_hh_l{l} [G H, H], bias_ih_l{l}, bias_hh_l{l} [G H] (with bias),
/// and the same with the suffix _reverse for the second direction, all drawn from U(-1/sqrt(H),
/// 1/sqrt(H)). Their values joined in registration order are rnn's flat weight, so PyTorch's state
/// dict loads by name. The base of RNN, LSTM and GRU.
class RecurrentNet : public Module {
 public:
  /// opt.mode, hidden_size, num_layers, bidirectional, batch_first, bias and dropout describe the
  /// network (opt.training follows the module's mode); the input size is that of x's last extent.
  RecurrentNet(int64_t input_size, const RnnOptions& opt, Generator& gen);
  /// y for x with zero initial states.
  Tensor forward(const Tensor& x) override;
  /// y, hy and (LSTM) cy from x and initial states hx, cx [layers * directions, N, hidden] (undefined: zeros).
  RnnResult forward_states(const Tensor& x, const Tensor& hx, const Tensor& cx = Tensor());
  /// The flat weight rnn takes, recorded so that each parameter gets its gradient.
  Tensor flat_weight() const;
  std::string describe() const override;
  const RnnOptions& options() const { return opt_; }
  int64_t input_size() const { return input_size_; }

 protected:
  NamedGenerators own_generators() override { return {{"rng", &dropout_gen_}}; }

 private:
  RnnOptions opt_;
  int64_t input_size_;
  std::vector<Tensor> weights_;  // registration order
  Generator dropout_gen_;
};

/// Elman RNN: h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (relu with relu = true).
class RNN : public RecurrentNet {
 public:
  RNN(int64_t input_size, int64_t hidden_size, Generator& gen, int64_t num_layers = 1, bool relu = false,
      bool bias = true, bool batch_first = false, double dropout = 0.0, bool bidirectional = false);
};

/// LSTM (gates input, forget, cell, output, as PyTorch's).
class LSTM : public RecurrentNet {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, Generator& gen, int64_t num_layers = 1, bool bias = true,
       bool batch_first = false, double dropout = 0.0, bool bidirectional = false);
};

/// GRU (gates reset, update, new, as PyTorch's: n = tanh(W_in x + b_in + r (W_hn h + b_hn))).
class GRU : public RecurrentNet {
 public:
  GRU(int64_t input_size, int64_t hidden_size, Generator& gen, int64_t num_layers = 1, bool bias = true,
      bool batch_first = false, double dropout = 0.0, bool bidirectional = false);
};

}  // namespace tandem::nn
