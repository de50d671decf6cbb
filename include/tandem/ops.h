#pragma once
// Differentiable operations. Each runs on the device of its inputs and records itself for autograd.
#include <array>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
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
enum class Comparison { Greater, GreaterEqual, Less, LessEqual, Equal, NotEqual };
/// 1 where `a op b` holds and 0 elsewhere (NaN compares false, except under NotEqual), in the operands'
/// dtype (floating or i32 / i64); records no gradient (a mask is data).
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


// Every op below takes operands of any strides (read in place) and any shape, empty ones included; the
// two- and three-operand ones broadcast as add does. Their gradients flow to floating operands; masks
// (comparisons, logical ops) and integer results record none.
/// a^b elementwise (floating operands, broadcast). Gradients as PyTorch's: 0 for a where b is 0, and for
/// b where a is 0 and b >= 0.
Tensor pow(const Tensor& a, const Tensor& b);
/// x^p
Tensor pow(const Tensor& x, double p);
/// s^x
Tensor pow(double s, const Tensor& x);
/// sqrt(x)
Tensor sqrt(const Tensor& x);
/// 1 / x
Tensor reciprocal(const Tensor& x);
/// |x|; its gradient is sign(x) (0 at 0)
Tensor abs(const Tensor& x);
/// -x
Tensor neg(const Tensor& x);
/// 1, 0 or -1 by the sign of x (0 for NaN); zero gradient
Tensor sign(const Tensor& x);
/// x limited to [lo, hi] (hi everywhere when lo > hi, as min(max(x, lo), hi)); the gradient passes where
/// lo <= x <= hi. An infinite bound is no bound.
Tensor clip(const Tensor& x, double lo, double hi);
/// The larger of a and b elementwise (NaN wins); a tie sends half the gradient to each, as PyTorch does.
Tensor maximum(const Tensor& a, const Tensor& b);
/// The smaller of a and b elementwise (NaN wins); a tie sends half the gradient to each.
Tensor minimum(const Tensor& a, const Tensor& b);
/// a where cond is nonzero, else b; cond (a mask of any dtype, no gradient), a and b broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// Masks of comparisons (see compare); the double overloads compare with a number.
Tensor less(const Tensor& a, const Tensor& b);
Tensor less_equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor greater_equal(const Tensor& a, const Tensor& b);
Tensor equal(const Tensor& a, const Tensor& b);
Tensor not_equal(const Tensor& a, const Tensor& b);
Tensor less(const Tensor& a, double b);
Tensor less_equal(const Tensor& a, double b);
Tensor greater(const Tensor& a, double b);
Tensor greater_equal(const Tensor& a, double b);
Tensor equal(const Tensor& a, double b);
Tensor not_equal(const Tensor& a, double b);
/// Logical ops on operands read as true where nonzero: 1 or 0 in the operands' dtype, no gradient.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& x);
/// The error function
Tensor erf(const Tensor& x);
/// Trigonometric and hyperbolic functions and their inverses
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor asinh(const Tensor& x);
Tensor acosh(const Tensor& x);
Tensor atanh(const Tensor& x);
/// Rounding, of zero gradient: up, down, to the nearest integer with halves away from zero (C's round,
/// SINGA's Round), and with halves to the even neighbour (NumPy's and PyTorch's round, SINGA's Rounde).
Tensor ceil(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor round(const Tensor& x);
Tensor rounde(const Tensor& x);
/// x for x > 0, alpha * x below
Tensor leaky_relu(const Tensor& x, double alpha = 0.01);
/// x for x > 0, alpha * (e^x - 1) below
Tensor elu(const Tensor& x, double alpha = 1.0);
/// scale * elu(x, alpha), with the self-normalising constants by default
Tensor selu(const Tensor& x, double alpha = 1.6732632423543772, double scale = 1.0507009873554805);
/// log(1 + e^x), computed without overflow
Tensor softplus(const Tensor& x);
/// x / (1 + |x|)
Tensor softsign(const Tensor& x);
/// max(0, min(1, alpha * x + beta)) (SINGA's defaults)
Tensor hard_sigmoid(const Tensor& x, double alpha = 0.2, double beta = 0.5);
/// x * Phi(x) with Phi the Gaussian CDF (erf form), or its tanh approximation
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
/// x * sigmoid(x)
Tensor silu(const Tensor& x);
/// SwiGLU's gating, the middle of a gated MLP: silu(gate) * up for x [..., 2H] holding the gate [..., :H] then the
/// up projection [..., H:] (one product's output): [..., H]. Where the backend takes x's type (CPU f32, f64; CUDA
/// f32, f16, bf16: arithmetic in f32, rounded once) one kernel computes it and one its [..., 2H] gradient, and
/// only x is kept for the backward; otherwise it is mul(silu(gate), up).
Tensor swiglu(const Tensor& x);
/// x for x > 0, slope * x below; slope broadcasts with x (one value, one per channel, ...)
Tensor prelu(const Tensor& x, const Tensor& slope);
/// x converted to dtype (a new handle sharing x's data when already of it); the gradient is converted
/// back to x's dtype. Conversions to or from integers record no gradient.
Tensor cast(const Tensor& x, DType dtype);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator*(const Tensor& a, double s) { return scale(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return scale(a, s); }
inline Tensor operator+(const Tensor& a, double s) { return add_scalar(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add_scalar(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add_scalar(a, -s); }
inline Tensor operator-(double s, const Tensor& a) { return add_scalar(neg(a), s); }
inline Tensor operator/(const Tensor& a, double s) { return scale(a, 1.0 / s); }
inline Tensor operator/(double s, const Tensor& a) { return scale(reciprocal(a), s); }

// ---- shape (views share x's storage where its strides allow; dimensions given negative count from the end)
/// Same elements with another shape (one extent may be -1): a view when x's strides allow it, else a copy.
Tensor reshape(const Tensor& x, const Shape& shape);
/// Collapses dimensions start_dim.. into one: [N, C, H, W] -> [N, C*H*W] for start_dim 1.
Tensor flatten(const Tensor& x, int64_t start_dim = 1);
/// x stretched to shape by broadcasting (a copy); its gradient sums over the stretched dimensions.
Tensor expand(const Tensor& x, const Shape& shape);
/// Dimensions reordered: dimension i of the result is dimension perm[i] of x (a view).
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
/// Dimensions d0 and d1 swapped (a view).
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
/// x without the listed dimensions, each of extent 1; with none listed, without every extent of 1 (a view).
Tensor squeeze(const Tensor& x, const std::vector<int64_t>& dims = {});
/// x with extents of 1 inserted at the listed positions of the result (negative: from the result's end; a
/// view).
Tensor unsqueeze(const Tensor& x, const std::vector<int64_t>& dims);
/// The tensors joined along dim; they agree in every other extent, dtype and device.
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
/// concat under SINGA's name (`autograd.cat`, `layer.Cat`).
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
/// x cut along dim into consecutive pieces of the given lengths, which sum to the extent (views).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& lengths, int64_t dim = 0);
/// x cut along dim into `parts` pieces of ceil(extent / parts) elements, the last one shorter when the extent
/// does not divide (fewer pieces when fewer suffice, as PyTorch's chunk; views).
std::vector<Tensor> chunk(const Tensor& x, int64_t parts, int64_t dim = 0);
/// Elements [start, start + length) of dimension dim (a view; the other dimensions whole).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// NumPy's x[start:end:step] along dim: start and end negative count from the end, both are clipped to the
/// extent, kOpen leaves one open (from the first, or to the last, element in the step's direction); step
/// != 0. A view for a positive step, a copy for a negative one.
Tensor strided_slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
/// An open end of strided_slice.
inline constexpr int64_t kOpen = INT64_MIN;
/// ONNX's Slice (SINGA's `slice`): strided_slice along axes[i] (default: dimension i) from starts[i] to ends[i]
/// by steps[i] (default 1), for every i.
Tensor slice_ranges(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                    const std::vector<int64_t>& axes = {}, const std::vector<int64_t>& steps = {});

// ---- indexing (indices are i32 or i64 tensors on x's device; negative ones count from the end of the
// extent indexed, others outside it are an error: at once on the CPU, at the next synchronisation on CUDA)
/// ONNX's Gather (SINGA's `gather`): the slices of x at the indices along dim; the result has shape
/// x.shape[:dim] + index.shape + x.shape[dim+1:]. Its gradient sums the slices of repeated indices
/// (deterministically).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// PyTorch's gather (ONNX's GatherElements): out[.., j, ..] = x[.., index[.., j, ..], ..] along dim; index has
/// x's rank and extents no larger than x's outside dim, and gives the result its shape.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// PyTorch's scatter_add: x with each src element added at its index along dim (index and src of one shape,
/// no larger than x outside dim); repeated positions sum in order (deterministic).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// ONNX's ScatterElements (SINGA's `scatter_elements`): x with updates written at index along dim (index and
/// updates of one shape); a position given twice takes the later value. x's gradient is zero where it was
/// overwritten; updates' is the gradient at their positions (as PyTorch's scatter).
Tensor scatter_elements(const Tensor& x, const Tensor& index, const Tensor& updates, int64_t dim = 0);
/// NumPy's tile: x repeated repeats[d] times along each dimension (the shorter of x's shape and repeats is
/// padded with leading 1s).
Tensor tile(const Tensor& x, const std::vector<int64_t>& repeats);
/// Padding values: a constant, x mirrored about its edge (the edge not repeated, NumPy's reflect), or the
/// edge element repeated.
enum class PadMode { Constant, Reflect, Edge };
/// ONNX's Pad (SINGA's `pad`): pads holds the elements added before dimensions 0.. then after them
/// (2 * x.dim() non-negative entries); Reflect needs pads smaller than the extent, Edge a non-empty one.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode = PadMode::Constant, double value = 0.0);
/// One-hot rows: the result has index's shape with a dimension of `depth` inserted at axis (of the result),
/// `on` where the position equals the index (negative: + depth) and `off` elsewhere; an index outside
/// [-depth, depth) gives only `off`. No gradient.
Tensor one_hot(const Tensor& index, int64_t depth, int64_t axis = -1, double off = 0.0, double on = 1.0,
               DType dtype = DType::f32);
/// ONNX's NonZero: the positions of x's nonzero elements as i64 [x.dim(), count], row-major. Its shape
/// depends on the data, so the host waits for the device (not usable inside a recorded step). No gradient.
Tensor nonzero(const Tensor& x);
/// ONNX's ConstantOfShape: a tensor of the shape filled with value.
Tensor constant_of_shape(const Shape& shape, double value = 0.0, DType dtype = DType::f32, Device device = Device::cpu());
/// Nearest-neighbour upsampling (ONNX's Upsample, SINGA's `upsample`): each element repeated scales[d] times
/// along dimension d (one positive integer per dimension).
Tensor upsample_nearest(const Tensor& x, const std::vector<int64_t>& scales);
/// ONNX's DepthToSpace of x [N, C, H, W] into [N, C / b^2, H b, W b]: depth-column-row order, or
/// column-row-depth with crd.
Tensor depth_to_space(const Tensor& x, int64_t blocksize, bool crd = false);
/// The inverse of depth_to_space: x [N, C, H, W] into [N, C b^2, H / b, W / b].
Tensor space_to_depth(const Tensor& x, int64_t blocksize, bool crd = false);

// ---- reductions (over the listed dimensions, which keepdim keeps as extents of 1; an empty list reduces
// nothing; CPU: f32, f64; CUDA: f32, f16, bf16, accumulated in f32)
/// Sum of all elements, as a 0-d tensor.
Tensor sum(const Tensor& x);
/// Sum over the given dimensions.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Mean of all elements, as a 0-d tensor.
Tensor mean(const Tensor& x);
/// Mean over the given dimensions (NaN over an empty one).
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// The largest element over the dimensions (PyTorch's amax); the gradient is shared evenly by the elements
/// equal to it. NaN propagates.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// The smallest element over the dimensions (PyTorch's amin), gradient as amax's.
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Position of the largest element along dim, as i64 (the first one; NaN counts as the largest). No gradient.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// Position of the smallest element along dim, as i64 (the first one; NaN counts as the smallest).
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
/// Variance over the dimensions: squared deviations from the mean divided by count - 1 (unbiased) or count.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased = true, bool keepdim = false);
/// log(sum(exp(x))) over the dimensions, the maximum subtracted first (-inf over an empty one).
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Product over the dimensions; its gradient is exact where x holds zeros.
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Cosine similarity along dim: sum((a / max(|a|, eps)) (b / max(|b|, eps))), PyTorch 1.13's; a and b of one
/// shape.
Tensor cosine_similarity(const Tensor& a, const Tensor& b, int64_t dim = 1, double eps = 1e-8);
/// SINGA's ranking loss: sum(max(0, margin - pos + neg)) / pos.size(0), pos and neg of one shape.
Tensor ranking_loss(const Tensor& pos, const Tensor& neg, double margin = 0.2);

// ---- linear algebra (CPU: f32, f64 through OpenBLAS; CUDA: f32, f16, bf16 through cuBLAS)
/// NumPy's matmul: a [..., M, K] x b [..., K, N], the leading dimensions broadcast, as batched GEMMs; a 1-D a
/// is a row [1, K] and a 1-D b a column [K, 1], their extent of 1 removed from the result.
Tensor matmul(const Tensor& a, const Tensor& b);
/// SINGA's / ONNX's Gemm: alpha op(a) op(b) + beta c for 2-D a and b (op: transposed when trans_*), c (may be
/// undefined) broadcast to the product's [M, N].
Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& c, double alpha = 1.0, double beta = 1.0,
            bool trans_a = false, bool trans_b = false);
/// x [..., in] x w [out, in]^T + b [out], over the last dimension of x (any number of leading ones, or none);
/// b may be undefined; relu fuses max(., 0). Mixed precision as conv2d.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu = false);
/// residual + linear(x, w, b): a residual connection's sum taken by the product itself (its C operand), so that
/// no pass of its own reads and writes the output; residual has the output's shape. Where the residual's type
/// is not the product's, the product is converted to it and added (the composition).
Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual);
/// GPT-2's MLP in one op: linear(gelu(linear(x, w1, b1), tanh form), w2, b2) for x [..., C], w1 [H, C],
/// w2 [C2, H], biases [H] and [C2] (both or neither). On CUDA in 16 bits the products carry the biases, the GELU
/// and its derivative, and the bias gradients in their epilogues (cuBLASLt), so that no activation of the MLP
/// is read or written outside a product; elsewhere the same steps run as separate kernels. Without biases it is
/// that composition. With residual defined (the output's shape): residual + the MLP, the sum taken by the second
/// product as linear_residual takes it.
Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                const Tensor& residual = Tensor());

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
  /// Padding before the input (top, left), and after it (bottom, right) unless padding_end says otherwise;
  /// at most half the kernel.
  std::array<int, 2> padding{0, 0};
  /// Padding after the input (bottom, right) where it differs from `padding` (ONNX's asymmetric pads);
  /// negative: the same as `padding`. At most half the kernel.
  std::array<int, 2> padding_end{-1, -1};
  /// The output size rounded up instead of down (ONNX's and PyTorch's ceil_mode): a last, partial window is
  /// taken, but only where it starts inside the input or its leading padding.
  bool ceil_mode = false;
  /// avg_pool2d's divisor: the window's positions inside the padded input (true), or only those inside the
  /// input (false: the mean of the input elements the window covers). Positions past the padded input (a
  /// ceil_mode window's overhang) never count.
  bool count_include_pad = true;
};
/// Max over each window; padded positions never win.
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opt = {});
/// Mean over each window, padded positions counted as zeros (see count_include_pad).
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
/// A classifier and its loss in one: softmax_cross_entropy(linear(x, weight), targets, reduction, ignore_index)
/// for x [..., C], weight [V, C] (a language model's head: V the vocabulary) and targets [...]. When a gradient
/// is taken and the loss is reduced, the logits [..., V] never outlive the op: they are made chunk_rows
/// positions at a time (0: as many as fill 1 GiB of logits), each chunk overwritten by the gradient of its
/// positions' losses as the loss is taken and multiplied at once by the two operands into the gradients of x
/// and weight, which the backward then scales by the reduction's weight (one chunk of logits in memory at a
/// time, one pass over them fewer). Otherwise it is that composition. `classes` > 0 takes only the first
/// `classes` rows of weight as classes (a token table padded to a multiple of 64 rows): the logits of the others
/// are masked out of the softmax inside the loss kernel and their rows of the weight's gradient are zero, so
/// that the loss and gradients are those of weight's first `classes` rows alone; targets must be below it.
/// 0: every row.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                            Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                            int64_t chunk_rows = 0, int64_t classes = 0);
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
/// Scaled dot-product attention: softmax(scale q k^T) v for q [B, H, Tq, d], k [B, Hkv, Tk, d], v [B, Hkv, Tk, dv]
/// (any strides), giving [B, H, Tq, dv] in q's type. Hkv divides H (grouped-query attention: query head h reads
/// key and value head h / (H / Hkv); Hkv = H is multi-head attention). causal masks key j out of query i's row where j > i (the
/// top-left diagonal, as PyTorch's is_causal). scale <= 0 takes 1 / sqrt(d). With dropout_p > 0 (needs gen)
/// the probabilities are dropped with that probability and the rest scaled by 1 / (1 - dropout_p). On CUDA,
/// f16 and bf16 run cuDNN's fused flash attention where tandem was built with the cuDNN frontend and cuDNN
/// takes the geometry; f32, the CPU and other cases compute softmax and products (scores in f32 or better).
/// doc_positions (causal self-attention only; undefined: none), i32 [B, T]: several documents packed into each
/// row, doc_positions[b, i] the position of token i in its document (0 at each document's first token): query
/// i then sees keys i - doc_positions[b, i] .. i only, those of its own document, as if each document were
/// alone in its row.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, double scale = 0.0, Generator* gen = nullptr,
                                    const Tensor& doc_positions = Tensor());
/// Multi-head self-attention over a packed projection: qkv [B, T, 3C] holds the query, key and value side by
/// side along its last axis (as GPT-2's c_attn gives them), each C = heads x d; the result is [B, T, C], the
/// heads side by side. The same as splitting qkv in three, viewing each part as [B, heads, T, d], calling
/// scaled_dot_product_attention and merging the heads back, but where the fused path runs (CUDA, 16-bit)
/// nothing is copied: cuDNN reads the heads from qkv in place, writes the output in [B, T, C] and the gradient
/// of qkv as one tensor. Other cases compute exactly that composition.
/// doc_positions as scaled_dot_product_attention's.
Tensor packed_self_attention(const Tensor& qkv, int64_t heads, bool causal = true, double dropout_p = 0.0,
                             double scale = 0.0, Generator* gen = nullptr, const Tensor& doc_positions = Tensor());
/// Grouped-query packed self-attention: qkv [B, T, (heads + 2 kv_heads) d] holds heads query heads, then kv_heads
/// key heads, then kv_heads value heads (kv_heads dividing heads; query head h reads key-value head
/// h / (heads / kv_heads)); the result is [B, T, heads d]. The same as splitting qkv in three, viewing the parts
/// by head and calling scaled_dot_product_attention, with the fused paths reading the heads in place as above.
/// kv_heads = heads is the overload above.
Tensor packed_self_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal, double dropout_p = 0.0,
                             double scale = 0.0, Generator* gen = nullptr, const Tensor& doc_positions = Tensor());

/// Rotary position embeddings' tables for heads of head_dim values (even) at positions 0 .. positions - 1: cos
/// and sin [positions, head_dim], frequency i (of head_dim / 2) in columns i and i + head_dim / 2 (Hugging Face's
/// rotate-half layout). inv_freq[i] = theta^(-2i / head_dim), computed in f32 as transformers does, then
/// rescaled per Llama 3's rope_scaling when scaling.factor > 0 (low_freq_factor, high_freq_factor and
/// original_context the model's config gives). Angles position x inv_freq in f32; their cos and sin rounded to
/// dtype from double.
struct RopeScaling {
  double factor = 0.0;  // 0: none
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_context = 8192;
};
std::pair<Tensor, Tensor> rotary_tables(int64_t head_dim, int64_t positions, double theta, const RopeScaling& scaling,
                                        DType dtype, Device device);
/// x * cos + rotate_half(x) * sin for x [..., T, d] and cos, sin [T, d] (broadcast over the leading dimensions):
/// each vector's halves (x1, x2) rotate to (x1 cos - x2 sin, x2 cos + x1 sin) per frequency. Differentiable in x.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);
/// rotary_embedding on the query and key heads of a packed projection: qkv [B, T, (heads + 2 kv_heads) d] holds
/// heads query heads, then kv_heads key heads, then kv_heads value heads, d values each (as SelfAttention's c_attn
/// gives them); the result has qkv's shape, the query and key heads rotated with rows start .. start + T - 1 of
/// cos and sin [P, d] (P >= start + T, qkv's type) and the value heads as they are. Where the backend takes the
/// type (CPU f32, f64; CUDA f32, f16, bf16: arithmetic in f32, rounded once) one pass over qkv computes it and
/// one its gradient, which keeps nothing but the tables; otherwise (and when the tables take a gradient) it is the
/// composition: split, view by head, rotary_embedding, merge, concat.
/// positions, where defined (i32 [B, T], each below P): row (b, t) takes table row positions[b, t] instead of
/// start + t (packed documents, each counted from 0; start must be 0).
Tensor rotary_packed(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t heads, int64_t kv_heads,
                     int64_t start = 0, const Tensor& positions = Tensor());

// ---- embedding and recurrent networks
/// The rows of weight [V, D] that indices (i32 or i64, any shape [...], values in [0, V)) pick:
/// out [..., D]. The gradient of weight adds up the output gradient's rows of equal indices; on CUDA
/// in f32 atomics (any order), or, under set_deterministic_algorithms(true), in the order of the indices
/// (the same bits on every run, and the CPU's). An index outside [0, V) is an error: the CPU throws at
/// once; CUDA checks on the device without waiting for it, writes zeros for that row and throws at the
/// next synchronisation (Tensor::item, to_vector, a copy to the host). CPU: f32, f64; CUDA: f32, f16, bf16.
Tensor embedding(const Tensor& weight, const Tensor& indices);

/// The cell of a recurrent network: PyTorch's nn.RNN (nonlinearity tanh or relu), nn.LSTM, nn.GRU.
enum class RnnMode { RnnTanh, RnnRelu, Lstm, Gru };

/// A recurrent network's shape and behaviour (the input size is x's last extent).
struct RnnOptions {
  RnnMode mode = RnnMode::Lstm;
  int64_t hidden_size = 0;
  int64_t num_layers = 1;
  bool bidirectional = false;
  bool batch_first = false;  // x and y are [N, T, F] instead of [T, N, F]
  bool bias = true;
  double dropout = 0.0;  // dropped from each layer's output but the last's, in training
  bool training = true;
  /// false: CUDA too composes the network of per-time-step ops (the CPU's way) instead of cuDNN.
  bool allow_fused = true;
};

/// What rnn returns: the outputs of the last layer at every step and the final states of every layer.
struct RnnResult {
  Tensor y, hy, cy;  // cy: LSTM only
};

/// Gate blocks per hidden unit: 1 (RNN), 4 (LSTM), 3 (GRU).
int64_t rnn_gate_count(RnnMode mode);
/// Elements of the flat weight of such a network (see rnn).
int64_t rnn_weight_size(RnnMode mode, int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bidirectional,
                        bool bias = true);

/// A multi-layer, optionally bidirectional RNN / LSTM / GRU over x [T, N, I] ([N, T, I] with batch_first),
/// as PyTorch's nn.RNN, nn.LSTM and nn.GRU compute it.
///
/// weight is one flat tensor holding PyTorch's parameters in their order: for each layer l and each
/// direction (forward, then reverse), weight_ih [G H, I_l], weight_hh [G H, H], bias_ih [G H], bias_hh
/// [G H] (no biases without opt.bias), each row-major, with G = rnn_gate_count(mode), I_0 = I and
/// I_l = D H above (D = 2 when bidirectional); the gate blocks are in PyTorch's order (LSTM: input,
/// forget, cell, output; GRU: reset, update, new). The layout is the same on every device, so a model
/// moves between them as it is.
///
/// hx and cx (LSTM only) are the initial states [L D, N, H] (undefined: zeros). Returns y [T, N, D H]
/// ([N, T, D H] with batch_first), hy [L D, N, H] and, for an LSTM, cy. With opt.dropout in training,
/// each layer's output but the last's goes through dropout(p, gen) (gen required then), masks drawn in
/// x's layout. On CUDA, f32 and f16 run through cuDNN's RNN kernels (exact f32 math under
/// Precision::f32, TF32 allowed under tf32), bf16 as per-time-step ops; under a bf16 / f16
/// PrecisionScope f32 tensors are computed in 16-bit (outputs 16-bit, gradients in the inputs' types).
/// The CPU composes the network of per-step products and activations (f32, f64). T = 0 passes the
/// initial states through.
RnnResult rnn(const Tensor& x, const Tensor& weight, const Tensor& hx, const Tensor& cx, const RnnOptions& opt,
              Generator* gen = nullptr);

}  // namespace tandem
