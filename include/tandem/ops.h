#pragma once
// Differentiable operations. Each runs on the device of its inputs and records itself for autograd.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/autograd.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

namespace tandem {

// ---- elementwise (operands of one dtype and device; shapes broadcast as NumPy's do: aligned at the
// right, an extent of 1 or a missing one stretched to the other's)
/// a + b
Tensor add(const Tensor& a, const Tensor& b);
/// a - b
Tensor sub(const Tensor& a, const Tensor& b);
/// a * b, elementwise
Tensor mul(const Tensor& a, const Tensor& b);
/// a / b, elementwise
Tensor div(const Tensor& a, const Tensor& b);
/// e^x
Tensor exp(const Tensor& x);
/// natural logarithm
Tensor log(const Tensor& x);
enum class Comparison { Greater, GreaterEqual, Less, LessEqual, Equal };
/// 1 where `a op b` holds and 0 elsewhere (NaN compares false), in the operands' dtype; records no
/// gradient (a mask is data).
Tensor compare(const Tensor& a, const Tensor& b, Comparison op);
/// a * s
Tensor scale(const Tensor& a, double s);
/// a + s
Tensor add_scalar(const Tensor& a, double s);
/// max(x, 0)
Tensor relu(const Tensor& x);
/// 1 / (1 + exp(-x))
Tensor sigmoid(const Tensor& x);
/// hyperbolic tangent
Tensor tanh(const Tensor& x);
/// x [N, C, ...] + b [C], b broadcast over every dimension but the second
Tensor bias_add(const Tensor& x, const Tensor& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator*(const Tensor& a, double s) { return scale(a, s); }

// ---- shape
/// Same elements with another shape (one extent may be -1); a view when possible.
Tensor reshape(const Tensor& x, const Shape& shape);
/// Collapses dimensions start_dim.. into one: [N, C, H, W] -> [N, C*H*W] for start_dim 1.
Tensor flatten(const Tensor& x, int64_t start_dim = 1);
/// x stretched to shape by broadcasting (a copy); its gradient sums over the stretched dimensions.
Tensor expand(const Tensor& x, const Shape& shape);
/// Dimensions reordered: dimension i of the result is dimension perm[i] of x (a copy; negative
/// entries count from the end).
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
/// The tensors joined along dim (negative: from the end); they agree in every other extent, dtype
/// and device.
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
/// Elements [start, start + length) of dimension dim (a copy; the other dimensions whole).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// concat under SINGA's name (`autograd.cat`, `layer.Cat`).
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);

// ---- reductions
/// Sum of all elements, as a one-element tensor.
Tensor sum(const Tensor& x);
/// Sum over the given dimensions (negative: from the end), which keepdim keeps as extents of 1.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Mean of all elements, as a one-element tensor.
Tensor mean(const Tensor& x);

// ---- linear algebra
/// a [M, K] x b [K, N]
Tensor matmul(const Tensor& a, const Tensor& b);
/// x [N, in] x w[out, in]^T + b [out]; b may be undefined; relu fuses max(., 0). Mixed precision as
/// conv2d.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu = false);

// ---- convolution and pooling (NCHW)
struct Conv2dOptions {
  std::array<int, 2> stride{1, 1};
  std::array<int, 2> padding{0, 0};
  bool relu = false;  // max(., 0) fused into the convolution's output
  /// The channels split into this many groups, each convolved with its own K/groups filters (C and K
  /// divisible by it); groups == C is a depthwise convolution.
  int groups = 1;
};
/// x [N, C, H, W] * w [K, C/groups, R, S] + b [K] (b may be undefined). Under a PrecisionScope of bf16 /
/// f16 on CUDA, x and w are taken in 16-bit (the output is 16-bit; gradients return in x's and w's types).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& opt = {});

struct Pool2dOptions {
  std::array<int, 2> kernel{2, 2};
  std::array<int, 2> stride{2, 2};
  std::array<int, 2> padding{0, 0};
};
/// Max over each window; padded positions never win.
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opt = {});
/// Mean over each window, padded positions counted as zeros.
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opt = {});

// ---- normalisation and regularisation
/// Batch normalisation over N, H, W per channel. In training, batch statistics are used and the
/// running statistics updated in place (running = (1-momentum)*running + momentum*batch, unbiased
/// variance); in evaluation, the running statistics are used.
Tensor batch_norm2d(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                    Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
/// Batch normalisation fused with a residual and a ReLU: max(batch_norm2d(x) + residual, 0) with relu,
/// batch_norm2d(x) + residual without (residual may be undefined). x may be 16-bit with f32 parameters
/// on CUDA (statistics in f32 or better).
Tensor batch_norm2d_act(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                        Tensor& running_mean, Tensor& running_var, bool training, bool relu, double momentum = 0.1,
                        double eps = 1e-5);
/// Zeroes each element with probability p and scales the rest by 1/(1-p); identity when !training.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);

/// exp(x) / sum(exp(x)) along dim (negative: from the end), the maximum subtracted first. CUDA: f32, f16,
/// bf16 (the output in x's type, arithmetic in f32).
Tensor softmax(const Tensor& x, int64_t dim = -1);

// ---- softmax, normalisation, losses, attention
/// log(softmax(x)) along dim (negative: from the end), computed as x - max - log(sum(exp(x - max))). Types
/// as softmax.
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
/// Layer normalisation over the trailing dimensions normalized_shape of x: (x - mean) / sqrt(var + eps) *
/// weight + bias, mean and (biased) variance over those dimensions. weight and bias (of normalized_shape)
/// may be undefined. On CUDA, 16-bit x takes weight and bias in f32 or its own type; statistics in f32.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
/// Root-mean-square normalisation over the trailing dimensions normalized_shape: x / sqrt(mean(x^2) + eps) *
/// weight (weight may be undefined). Types as layer_norm.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(), double eps = 1e-6);

/// How a loss combines the losses of its elements: each kept (None, the targets' shape), summed, or averaged.
enum class Reduction { None, Mean, Sum };
/// The name of a reduction: "none", "mean", "sum".
const char* reduction_name(Reduction r);
/// Parses "none", "mean" or "sum"; throws tandem::Error naming the op otherwise.
Reduction parse_reduction(const std::string& name, const char* op = "loss");
/// Softmax cross-entropy over the last axis of logits [..., C] against class indices targets [...] (i32 or i64):
/// -log softmax(logits)[target] per position; positions whose target is ignore_index add nothing, and Mean
/// averages over the others (a language model's loss). 16-bit logits on CUDA are read as they are; the loss
/// is f32 for them (f64 for f64 logits).
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction,
                             int64_t ignore_index = -100);
/// Negative log-likelihood over the last axis of log-probabilities logp [..., C]: -logp[target] per position,
/// with ignore_index and reductions as softmax_cross_entropy.
Tensor nll_loss(const Tensor& logp, const Tensor& targets, Reduction reduction = Reduction::Mean,
                int64_t ignore_index = -100);
/// (x - target)^2 per element (shapes equal), reduced. Both take a gradient.
Tensor mse_loss(const Tensor& x, const Tensor& target, Reduction reduction = Reduction::Mean);
/// -(t log p + (1 - t) log(1 - p)) per element for probabilities p and targets t of p's shape, each log
/// clamped at -100 as PyTorch does; reduced. The targets take no gradient.
Tensor binary_cross_entropy(const Tensor& p, const Tensor& target, Reduction reduction = Reduction::Mean);
/// binary_cross_entropy(sigmoid(x), t) computed stably from the logits x: max(x, 0) - x t + log(1 + e^-|x|).
Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& target, Reduction reduction = Reduction::Mean);

// ---- losses and metrics
/// Mean over the batch of -log softmax(logits)[label]; logits [N, C], labels [N] of i32 or i64. Labels
/// [N, C] are targets (one-hot rows, or a distribution per row): the mean of -sum_j t_j log softmax_j.
/// Other shapes are refused.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels);
/// Index of the largest element of each row of x [N, C], as i64 [N].
Tensor argmax(const Tensor& x);
/// Number of rows whose argmax equals the label, as a one-element i64 tensor on the same device.
Tensor count_correct(const Tensor& logits, const Tensor& labels);
/// count += count_correct(logits, labels), in place on the device (count: one i64 element there).
void add_correct(const Tensor& logits, const Tensor& labels, Tensor& count);
/// A training batch's running sums, in place on the device: loss_sum += loss (one f32 element each,
/// as add_into adds them) and count += count_correct(logits, labels) (one i64), in one launch where
/// the device can.
void add_loss_and_correct(const Tensor& loss, const Tensor& logits, const Tensor& labels, Tensor& loss_sum,
                          Tensor& count);
/// acc += x in place, outside autograd (same shape, dtype and device): running sums kept on the
/// device, such as a recorded step's loss total.
void add_into(Tensor& acc, const Tensor& x);

// ---- attention
/// Scaled dot-product attention: softmax(scale q k^T) v for q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv]
/// (any strides), giving [B, H, Tq, dv] in q's type. causal masks key j out of query i's row where j > i (the
/// top-left diagonal, as PyTorch's is_causal). scale <= 0 takes 1 / sqrt(d). With dropout_p > 0 (needs gen)
/// the probabilities are dropped with that probability and the rest scaled by 1 / (1 - dropout_p). On CUDA,
/// f16 and bf16 run cuDNN's fused flash attention where tandem was built with the cuDNN frontend and cuDNN
/// takes the geometry; f32, the CPU and other cases compute softmax and products (scores in f32 or better).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, double scale = 0.0, Generator* gen = nullptr);

// ---- embedding and recurrent networks

}  // namespace tandem
