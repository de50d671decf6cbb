#pragma once
// Internal: the compute interface every device backend implements.
//
// Contract for every kernel below: tensors are contiguous and on the backend's device, outputs are
// allocated by the caller with the right shape and dtype, and shapes were checked by the op layer
// (src/ops). Floating kernels take f32 and f64 on the CPU; the CUDA backend takes f32, and f16 / bf16
// where a comment says so (arithmetic in f32), and rejects others with a clear error. 4-D activations
// are NCHW, or NHWC (channels last) where a geometry's `nhwc` says so; the CPU takes NCHW only.
// Kernels run asynchronously on the device's compute stream. Whether f32 convolutions and products may
// use TF32 tensor cores follows current_precision() (tandem/precision.h) at the call.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/elementwise.h"
#include "core/allocator.h"
#include "tandem/fp8.h"
#include "tandem/tensor.h"

namespace tandem {
enum class RnnMode;  // tandem/ops.h
}  // namespace tandem

namespace tandem::backend {

/// Geometry of a 2-D convolution: x [n, c, h, w], w [k, c / groups, r, s], y [n, k, oh, ow]; output
/// channels [j k/groups, (j+1) k/groups) see input channels [j c/groups, (j+1) c/groups) only. With nhwc,
/// x, y (and their gradients) are stored n, h, w, c and w is stored k, r, s, c / groups.
struct ConvGeom {
  int64_t n, c, h, w, k, r, s;
  int64_t stride_h, stride_w, pad_h, pad_w;
  int64_t oh, ow;
  bool nhwc = false;
  int64_t groups = 1;
  /// Input channels each filter sees.
  int64_t group_c() const { return c / groups; }
};

/// Geometry of a 2-D pooling: x [n, c, h, w] -> y [n, c, oh, ow]; with nhwc both are stored n, h, w, c.
/// Output row o's window starts at o * stride_h - pad_h; oh may take a last window that overhangs the
/// padded input (ceil mode): kernels clip every window to the input.
struct PoolGeom {
  int64_t n, c, h, w;
  int64_t kh, kw, stride_h, stride_w, pad_h, pad_w;  // pad_h, pad_w: before the input (top, left)
  int64_t oh, ow;
  bool nhwc = false;
  /// Padding after the input (bottom, right); negative: pad_h / pad_w.
  int64_t pad_bottom = -1, pad_right = -1;
  /// Average pooling's divisor: the window's positions inside the padded input (true) or inside the input.
  bool count_pad = true;
  int64_t pad_h_end() const { return pad_bottom < 0 ? pad_h : pad_bottom; }
  int64_t pad_w_end() const { return pad_right < 0 ? pad_w : pad_right; }
};

/// A batch normalisation over N, H, W per channel, fused with an optional residual z and ReLU:
/// y = bn(x) + z, then max(y, 0) with relu.
struct BnArgs {
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch (unbiased variance)
  double eps = 1e-5;
  bool relu = false;
  bool nhwc = false;  // x, z, y and their gradients stored n, h, w, c
};

/// One tensor's share of a multi-tensor optimizer step.
struct ParamSlot {
  Tensor param, grad, buf0, buf1;  // buf0: momentum / Adam m; buf1: Adam v
  /// SGD and Adam, when defined: a bf16 or f16 copy of the parameter (same size, contiguous), written with
  /// the updated parameter, rounded to nearest as Tensor::to rounds (Optimizer::set_parameter_copies).
  Tensor copy;
};

struct SgdArgs {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  // momentum buffers hold no history yet: initialise them with the gradient
  /// When set: one f32 value on the slots' device; the step changes nothing when it is not finite
  /// (the skip of an overflowing f16 step, decided on the device so that the step can be recorded).
  const float* guard = nullptr;
};

struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
  bool decoupled;  // AdamW-style weight decay
  /// When set (CUDA): three f32 values on the slots' device, read when the step runs instead of the
  /// factors lr, step and weight_decay make: lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step) and the
  /// decoupled shrink 1 - lr weight_decay (1 when not decoupled). A recorded step then follows a
  /// learning-rate schedule and the bias correction: the host writes the values before each replay.
  const float* step_scalars = nullptr;
  /// When set: one f32 value on the slots' device by which every gradient is multiplied as the step reads
  /// it (a clipping factor computed on the device), exactly as if the gradients had been scaled first. The
  /// gradients are left as they are.
  const float* grad_factor = nullptr;
};

/// RMSProp: g += weight_decay * p; v = alpha * v + (1 - alpha) * g^2 (v in buf0);
/// p -= lr * g / (sqrt(v) + eps), or / sqrt(v + eps) with eps_inside_sqrt (SINGA's form).
struct RmsPropArgs {
  double lr, alpha, eps, weight_decay;
  bool eps_inside_sqrt;
  /// As SgdArgs::guard: the step changes nothing when this value on the device is not finite.
  const float* guard = nullptr;
};

/// AdaGrad: g += weight_decay * p; s += g^2 (s in buf0); p -= lr * g / (sqrt(s) + eps), or / sqrt(s + eps)
/// with eps_inside_sqrt (SINGA's form). lr is the step's own (any decay applied by the caller).
struct AdagradArgs {
  double lr, eps, weight_decay;
  bool eps_inside_sqrt;
  /// As SgdArgs::guard.
  const float* guard = nullptr;
};

/// One recurrent network as the fused kernels see it (see tandem::rnn for the weight layout):
/// x [seq, batch, input] ([batch, seq, input] with batch_first), y likewise with directions * hidden
/// features, states [layers * directions, batch, hidden]. math: 0 exact f32 products, 1 TF32 allowed,
/// 2 16-bit data on tensor cores.
struct RnnGeom {
  RnnMode mode{};
  int64_t input = 0, hidden = 0, layers = 1, seq = 0, batch = 0;
  bool bidirectional = false, bias = true, batch_first = false;
  DType dtype = DType::f32;
  int math = 0;
  int64_t directions() const { return bidirectional ? 2 : 1; }
};

/// The elementwise losses of pointwise_loss_forward.
/// What a fused product adds to the plain one, row-major C[m, n] = alpha op(A) op(B) + beta C (see gemm_fused).
enum class GemmEpilogue {
  None,
  Bias,      // C += bias[j] on every row
  BiasGelu,  // aux = product + bias[j]; C = gelu(aux), GELU's tanh form; aux [m, n] of C's type, contiguous
  DGelu,     // C = product * gelu'(aux): the gradient through the GELU of a BiasGelu whose input was aux
};

struct GemmFusion {
  GemmEpilogue epilogue = GemmEpilogue::None;
  Tensor bias;         // [n] of C's type: Bias, BiasGelu
  Tensor aux;          // [m, n]: written by BiasGelu, read by DGelu
  Tensor a_row_sums;   // when defined: [m] = the sums over k of op(A) (trans_a only: A the output gradient
                       // [k, m] of a layer whose bias gradient this is); f32 or C's type
  Tensor addend;       // when defined: [m, n] of C's type, contiguous, not C: added to the product before the
                       // epilogue's bias (C = alpha op(A) op(B) + addend + bias: a residual connection); beta 0
  Tensor c_col_sums;   // DGelu only, when defined: [n] = the sums over the m rows of the result (the bias
                       // gradient of the layer whose pre-activation gradient C is); f32 or C's type
};

enum class PointLoss { SquaredError, BinaryCrossEntropy, BinaryCrossEntropyWithLogits };

/// Scaled dot-product attention of q [batch, heads, tq, d] with k [batch, heads, tk, d] and v [batch, heads, tk,
/// dv]: softmax(scale q k^T, masked above the diagonal when causal) v, the probabilities dropped with
/// probability dropout_p.
struct AttentionGeom {
  int64_t batch, heads, tq, tk, d, dv;
  /// The key's and value's heads (grouped-query attention: a divisor of heads, query head i reading key head
  /// i / (heads / kv_heads)); 0: heads.
  int64_t kv_heads = 0;
  bool causal = false;
  double scale = 1.0;
  double dropout_p = 0.0;
  /// The fused path's element strides of the query, key and value as [b, h, t, d] (the last one 1; all
  /// zero: contiguous [b, h, t, d]). Its output, output gradient and input gradients are [b, t, h, d] in
  /// memory (the layout a projection of [b, t, h d] gives), viewed as [b, h, t, d].
  std::array<int64_t, 4> q_strides{}, k_strides{}, v_strides{};
  /// The input gradients in the inputs' own layout (the strides above) instead of [b, t, h, d]: the gradients
  /// of a packed projection's query, key and value written side by side into one gradient of that projection.
  bool grads_like_inputs = false;
  /// Packed documents (self-attention, tq = tk, causal): i32 [batch, tq], contiguous on the operands' device,
  /// query i's position in its document, p_i <= i; query i sees keys i - p_i .. i only (keys of the earlier
  /// documents of its row are masked as the causal mask masks later keys). Undefined: one sequence per row.
  Tensor doc_pos;
};

/// Rotary position embeddings on the heads of a packed projection: each of the batch x t rows holds
/// `rotated` heads to rotate (a layer's query heads, then its key heads), then `copied` heads to copy (its value
/// heads), d values each (d even); row r's position is start + r % t (its row of the tables).
struct RotaryGeom {
  int64_t batch = 0, t = 0, rotated = 0, copied = 0, d = 0, start = 0;
  /// The rotation's transpose instead (the backward: the gradient of the rows from theirs).
  bool transpose = false;
  /// Where defined, i32 [batch, t] (contiguous, on x's device): row r's position is positions[r] instead (each
  /// below the tables' P): packed documents, each counted from 0.
  Tensor positions;
  int64_t width() const { return (rotated + copied) * d; }
};

/// Device work recorded once (a CUDA graph) and replayed as a whole.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  /// Queues the recorded work again on the device's compute stream (returns at once).
  virtual void replay() = 0;
  /// Bytes held by the memory pool private to the recording.
  virtual size_t pool_bytes() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  /// Devices of this kind usable by this process.
  virtual int device_count() = 0;
  /// The product name of a device ("NVIDIA H200"); empty where the backend has none (the CPU).
  virtual std::string device_name(int device) { return ""; }

  // ---- memory
  virtual Allocator& allocator(int device) = 0;
  /// Page-locked host memory allocator, or null when the backend has none.
  virtual Allocator* pinned_allocator() { return nullptr; }
  /// The device's free and total memory as its driver reports them (false where the backend cannot say).
  virtual bool memory_info(int device, size_t& free, size_t& total) { return false; }
  /// dst (this backend's device) <- src bytes from host memory.
  virtual void copy_from_host(const void* src, void* dst, size_t nbytes, int device) = 0;
  /// Host memory dst <- src bytes on this backend's device; returns once the bytes are there.
  virtual void copy_to_host(const void* src, void* dst, size_t nbytes, int device) = 0;
  /// Same-device bytes copy.
  virtual void copy_bytes(const void* src, void* dst, size_t nbytes, int device) = 0;
  virtual void synchronize(int device) = 0;
  /// Starts or stops the range an external profiler (Nsight Compute's --profile-from-start off) records.
  virtual void profile_range(bool on) {}

  // ---- whole-step capture
  /// Records, without running it, the device work `body` queues on `device`; memory allocated
  /// meanwhile on that device comes from a pool private to the recording and stays reserved for it.
  /// Throws, naming the call that cannot be recorded (a wait for the device, a copy to the host),
  /// when body does what a recording cannot hold; nothing is recorded then.
  virtual std::unique_ptr<CapturedWork> capture(int device, const std::function<void()>& body);
  /// Bytes held by the private pools of every live recording on the device.
  virtual size_t captured_pool_bytes(int device) { return 0; }
  /// The most the recordings' tensors held at once (per recording, summed), in bytes.
  virtual size_t captured_pool_peak_bytes(int device) { return 0; }
  /// Whether this thread is recording device work on `device` (inside capture's body).
  virtual bool recording(int device) { return false; }

  // ---- layout, conversion, fills
  /// dst (contiguous) <- src (any strides, same device), converting between any two dtypes.
  virtual void copy_strided(const Tensor& src, Tensor& dst) = 0;
  virtual void fill(Tensor& t, double value) = 0;
  /// A batch gathered from a data set held on the device: for each i < x.size(0), with
  /// s = order[begin + i], x[i] = images[s] / divisor (u8 samples to f32, divided as f32) and
  /// y[i] = labels[s]. images u8 [N, ...], labels i32 [N], order i32 (values in [0, N)), x f32, y i32.
  /// begin is read on the device from cursor (i64 [2], on the device: [0] the position in order,
  /// which the call advances by x.size(0); [1] scratch, zero between calls), so that a recorded step
  /// that gathers its own batch reads the next one at every replay.
  virtual void gather_samples(const Tensor& images, const Tensor& labels, const Tensor& order, Tensor& cursor,
                              float divisor, Tensor& x, Tensor& y) = 0;
  /// A language model's batch of token windows: for each b < B (x and y i32 [B, T]), window
  /// j = cursor[0] + b starts at s_j, and x[b, t] = tokens[s_j + t], y[b, t] = tokens[s_j + t + 1].
  /// tokens: u8 [n, 2], n little-endian uint16 tokens, n >= T + 1. With random,
  /// s_j = rng::mix(seed, j) % (n - T) (any window of T + 1 tokens); without, s_j = (j % W) * T with
  /// W = (n - 1) / T (consecutive windows, overlapping by the one token each window's last target
  /// shares with the next one's first input). cursor: i64 [2] on the device, [0] the windows drawn
  /// so far, which the call advances by B (so that a recorded step draws new windows at every
  /// replay), [1] scratch, zero between calls. The same windows on every backend.
  /// frame > 0: the stream is cut into frames of `frame` >= T + 1 tokens (one padded example, or whole
  /// examples packed, each), and windows start at frames only: s_j = k * frame, k = rng::mix(seed, j)
  /// % F with random, j % F without, F = n / frame. mask, when defined: u8 [n], a byte per token, 1 where
  /// the token is a target the loss is taken on; y[b, t] is -100 (the losses' ignore_index) where
  /// mask[s_j + t + 1] is 0.
  /// With pos defined (i32 [B, T], like x; mask defined): pos[b, t] = the position of x[b, t] in its document,
  /// counted from the last token at or before it whose mask byte has bit 1 (2) set, or from the window's
  /// first token (frames start at documents). mask's bit 0 is the loss mask.
  virtual void token_windows(const Tensor& tokens, const Tensor& mask, Tensor& cursor, uint64_t seed, bool random,
                             int64_t frame, Tensor& x, Tensor& y, Tensor& pos) = 0;
  /// Without document positions.
  void token_windows(const Tensor& tokens, const Tensor& mask, Tensor& cursor, uint64_t seed, bool random,
                     int64_t frame, Tensor& x, Tensor& y) {
    Tensor none;
    token_windows(tokens, mask, cursor, seed, random, frame, x, y, none);
  }
  /// Counter-based uniform [lo, hi) and Gaussian fills; element i uses counter offset + i.
  virtual void random_uniform(Tensor& t, uint64_t seed, uint64_t offset, double lo, double hi) = 0;
  virtual void random_normal(Tensor& t, uint64_t seed, uint64_t offset, double mean, double std) = 0;

  // ---- elementwise (backend/elementwise.h: the ops and their parameters). Unlike the contract above,
  // operands may have any strides and are read in place: out is dense (contiguous or channels-last), an
  // operand has out's shape or one that broadcasts to it (NumPy's rules), and an operand of out's element
  // count but another shape is read flat when both are contiguous. Operands share out's dtype (CPU: f32,
  // f64, and i32 / i64 where the op takes integers; CUDA: f32, f16, bf16 in f32 arithmetic, and i32 /
  // i64). out may alias an operand of its own shape and strides.
  /// out = op(a, b)
  virtual void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  /// out = op(a), with the op's parameters in args
  virtual void unary(Unary op, const Tensor& a, Tensor& out, const EwArgs& args = {}) = 0;
  /// out = op(a, b, c)
  virtual void ternary(Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) = 0;
  /// out = alpha * a + beta
  virtual void affine(const Tensor& a, double alpha, double beta, Tensor& out) = 0;
  /// y = alpha * x + y
  virtual void axpy(double alpha, const Tensor& x, Tensor& y) = 0;
  /// out = grad * op'(x): the gradient of unary op given its output y where grad_from_output(op) (Relu:
  /// y > 0, Sigmoid: y(1-y), Tanh: 1-y^2, ...), else its input x; args as the forward's. Ops of zero
  /// derivative (grad_is_zero) are refused.
  virtual void unary_backward(Unary op, const Tensor& grad, const Tensor& saved, Tensor& out,
                              const EwArgs& args = {}) = 0;
  /// out[n, c, s] = x[n, c, s] + b[c]; x viewed as [n, c, s]. CUDA: x, out f32/f16/bf16, b f32 or x's type.
  virtual void bias_add(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) = 0;
  /// out[c] = sum over n, s of g[n, c, s]. CUDA: g f32/f16/bf16, out f32 or g's type.
  virtual void bias_grad(const Tensor& g, int64_t n, int64_t c, int64_t s, Tensor& out) = 0;
  /// out = max(x + b[c], 0) over x viewed as [n, c, s]; b may be undefined (ReLU only). Types as bias_add.
  virtual void bias_relu(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) = 0;
  /// dx = dy where y > 0, else 0; and, when db is defined, db[c] = sum over n, s of dx. Types as bias_grad.
  virtual void relu_bias_grad(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, int64_t s, Tensor& dx,
                              Tensor& db) = 0;
  /// out (one element) = sum of all elements of x (integers summed into i64 or their own type).
  virtual void sum(const Tensor& x, Tensor& out) = 0;
  /// y = softmax of each row of x viewed as [n, c] (the row's maximum subtracted first). CPU: f32, f64;
  /// CUDA: f32.
  virtual void softmax_rows(const Tensor& x, int64_t n, int64_t c, Tensor& y) = 0;
  /// dx = y * (dy - sum over the row of dy * y), rows of [n, c]: softmax's gradient from its output y.
  virtual void softmax_rows_backward(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, Tensor& dx) = 0;

  // ---- dense linear algebra, row-major: C = alpha * op(A) op(B) + beta * C (CUDA: f32, f16, bf16; 16-bit
  // operands accumulate in f32)
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                    const Tensor& b, double beta, Tensor& c) = 0;

  /// gemm with an epilogue (GemmFusion) and C of A's type or, for 16-bit A and B, f32 (beta 0 then). CUDA fuses
  /// it into the product through cuBLASLt where cuBLASLt takes the case; the default composes gemm with the
  /// bias, GELU and reduction kernels (same values up to rounding). A untransposed may be an [m, k] view of
  /// rows a.stride(0) apart (padded rows); the default packs it first.
  virtual void gemm_fused(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                          const Tensor& b, double beta, Tensor& c, const GemmFusion& f);

  // ---- convolution (b / db may be undefined; b and db f32 or the data's type). CUDA: f32, f16, bf16.
  /// y = conv(x, w) + b, then max(y, 0) when relu.
  virtual void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g, Tensor& y,
                              bool relu = false) = 0;
  /// dx = the input gradient; with accumulate, dx += it (dx holds a gradient already).
  virtual void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx,
                                    bool accumulate = false) = 0;
  virtual void conv2d_backward_weight(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw,
                                      Tensor& db) = 0;

  // ---- pooling; indices (i32, shape of y) is written by the CPU max-pool and may be ignored by others.
  // CUDA: f32, f16, bf16, NCHW or NHWC.
  virtual void max_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y, Tensor& indices) = 0;
  virtual void max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& indices,
                                   const PoolGeom& g, Tensor& dx) = 0;
  virtual void avg_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y) = 0;
  virtual void avg_pool2d_backward(const Tensor& dy, const PoolGeom& g, Tensor& dx) = 0;

  // ---- batch normalisation over N, H, W of x [n, c, h, w], see BnArgs; z (the residual) may be undefined.
  // save_* are [c] (batch mean, 1/sqrt(var+eps)). gamma, beta, running statistics and save_* have x's dtype
  // on the CPU; on CUDA they are f32 and x, z, y f32, f16 or bf16.
  virtual void batch_norm_forward_train(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                        Tensor& running_mean, Tensor& running_var, const BnArgs& a, Tensor& y,
                                        Tensor& save_mean, Tensor& save_invstd) = 0;
  virtual void batch_norm_forward_eval(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var, const BnArgs& a,
                                       Tensor& y) = 0;
  /// y is the forward output (its sign masks dy under relu; may be undefined without relu); dz (defined only
  /// when a residual was added) receives the gradient of z, which is dy after the mask.
  virtual void batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                                   const Tensor& save_mean, const Tensor& save_invstd, const BnArgs& a, Tensor& dx,
                                   Tensor& dz, Tensor& dgamma, Tensor& dbeta) = 0;

  // ---- losses and metrics; labels are i32 or i64 [n]; a label outside [0, c) is an Input error
  /// loss (one element) = mean_i -log softmax(logits_i)[label_i]; probs [n, c] = softmax(logits).
  virtual void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) = 0;
  /// dlogits = (probs - onehot(labels)) * dloss / n, dloss a one-element tensor.
  virtual void softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                     Tensor& dlogits) = 0;
  /// With targets [n, c] (logits' dtype: one-hot rows or a distribution per row) for labels:
  /// loss = mean_i sum_j -targets_ij log softmax(logits_i)_j, a zero target adding nothing.
  virtual void softmax_xent_targets_forward(const Tensor& logits, const Tensor& targets, Tensor& loss,
                                            Tensor& probs) = 0;
  /// dlogits = (probs * rowsum(targets) - targets) * dloss / n.
  virtual void softmax_xent_targets_backward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                                             Tensor& dlogits) = 0;
  /// out (i64 [n]) = argmax of each row of x [n, c] (the first maximum).
  virtual void argmax_rows(const Tensor& x, Tensor& out) = 0;
  /// out (i64, one element) = number of rows of logits whose argmax equals the label.
  /// out (one i64) = the count, or out += the count with accumulate.
  virtual void count_correct(const Tensor& logits, const Tensor& labels, Tensor& out, bool accumulate = false) = 0;
  /// A batch's running sums: loss_sum (one f32) += loss (one f32), as binary Add computes it, and
  /// correct (one i64) += count_correct(logits, labels); in one launch where the backend can.
  virtual void tally_batch(const Tensor& loss, const Tensor& logits, const Tensor& labels, Tensor& loss_sum,
                           Tensor& correct) {
    binary(Binary::Add, loss_sum, loss, loss_sum);
    count_correct(logits, labels, correct, true);
  }
  /// mask = (uniform(counter) >= p) / (1 - p), element i using counter offset + i.
  virtual void dropout_mask(Tensor& mask, uint64_t seed, uint64_t offset, double p) = 0;

  // ---- gradient compression for the distributed optimizer (f32 gradients)
  /// dst = src * scale, clipped into [-clip, clip] when clip > 0, converted to dst's dtype (f32, f16, bf16).
  virtual void scale_cast(const Tensor& src, Tensor& dst, double scale, double clip) = 0;
  /// pairs (i32 [2k]) = k (index, value bits) pairs of the k largest |g| (ties: any; all distinct indices).
  virtual void sparse_topk(const Tensor& g, int64_t k, Tensor& pairs) = 0;
  /// pairs (i32, capacity 2 * g.numel()) = (index, value bits) of every g with |g| >= threshold, in
  /// any order; count (i64, one element, on the device) = how many.
  virtual void sparse_threshold(const Tensor& g, double threshold, Tensor& pairs, Tensor& count) = 0;
  /// dense[index] += scale * value for the first n pairs (indices within one call are distinct).
  virtual void sparse_accumulate(Tensor& dense, const Tensor& pairs, int64_t n, double scale) = 0;
  /// dense[index] = 0 for the first n pairs.
  virtual void sparse_zero(Tensor& dense, const Tensor& pairs, int64_t n) = 0;

  // ---- a step's verdict kept on the device (the skip of a non-finite step, recorded steps). A verdict
  // is one f32 value on the device, finite exactly when the step's gradients were.
  /// out = x * factor[0], factor one f32 value on the device (x, out f32; out may alias x).
  virtual void scale_by(const Tensor& x, const Tensor& factor, Tensor& out) = 0;
  /// dst = saved when the verdict is not finite; otherwise dst is left as it is (same size and dtype).
  virtual void restore_if_nonfinite(const Tensor& verdict, const Tensor& saved, Tensor& dst) = 0;
  /// counter (one i64) += 1 when the verdict is not finite.
  virtual void count_nonfinite(const Tensor& verdict, Tensor& counter) = 0;
  /// Dynamic loss scaling after a step: scale (f32 [2]: the scale and its inverse) and counts (i64 [2]:
  /// clean steps in a row, steps skipped). Not finite: the scale times backoff, clean = 0, skipped + 1;
  /// finite: clean + 1, and at `interval` the scale times growth (unless that overflows f32), clean = 0.
  virtual void loss_scale_update(const Tensor& verdict, Tensor& scale, Tensor& counts, double growth, double backoff,
                                 int64_t interval) = 0;
  /// With chunks of dst.numel() elements (src.numel() a multiple of it): dst = src's chunk index[0]
  /// (one i64 on the device, in [0, chunks)); with into_chunk, chunk index[0] of dst = src instead
  /// (src.numel() then the chunk size). f32. With a verdict (defined), nothing happens unless it is finite.
  virtual void copy_chunk(const Tensor& src, Tensor& dst, const Tensor& index, bool into_chunk,
                          const Tensor& verdict) = 0;
  /// counter (one i64 on the device) = (counter + 1) % modulo; with a verdict, only when it is finite.
  virtual void advance_counter(Tensor& counter, int64_t modulo, const Tensor& verdict) = 0;

  // ---- FP8 (tandem/fp8.h): codes stored as u8, encoded and decoded as core/fp8.h does (the same bytes on every
  // backend). x: f32, bf16 or f16. scale, scale_inv, amax: one f32 value each on the device (read and written
  // there, so that a step using them can be recorded). Every cast saturates and rounds to nearest even.
  /// q (u8, x's element count) = the codes of x * scale[0] in fmt; with amax defined, amax[0] = max(amax[0],
  /// max |x|) as fp8_amax computes it.
  virtual void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format fmt, Tensor& q, Tensor& amax) = 0;
  /// For x [rows, cols]: qt [cols, rows] = the codes of x^T * scale[0] (the transposed cast), and, when defined,
  /// q [rows, cols] = fp8_quantize's codes, both from one pass over x; amax as fp8_quantize.
  virtual void fp8_quantize_transposed(const Tensor& x, const Tensor& scale, Fp8Format fmt, int64_t rows,
                                       int64_t cols, Tensor& q, Tensor& qt, Tensor& amax) = 0;
  /// y (f32, bf16, f16; q's element count) = decode(q) * scale_inv[0], computed in f32.
  virtual void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format fmt, Tensor& y) = 0;
  /// amax[0] = max(amax[0], max |x|), compared as the bits of |x| (core/fp8.h's abs_bits): a NaN in x (or in
  /// amax) gives NaN, else an infinity +inf. The result does not depend on the order of the elements.
  virtual void fp8_amax(const Tensor& x, Tensor& amax) = 0;
  /// Fp8ScaleState::update's kernel: history f32 [rows, count], scale and scale_inv f32 [count]; fp8_max the
  /// format's largest value, margin_factor = 2^margin, use_history_max: the amax is the history's maximum (else
  /// row 0's entry). verdict, when defined (one f32), becomes NaN when a row-0 entry is not finite.
  virtual void fp8_scale_update(Tensor& history, Tensor& scale, Tensor& scale_inv, float fp8_max, float margin_factor,
                                bool use_history_max, Tensor& verdict) = 0;
  /// c [m, n] (f32 or bf16) = (decode(a) * a_scale_inv[0]) (decode(b) * b_scale_inv[0])^T for a [m, k] and b [n, k]
  /// (u8 codes, rows of k: the "TN" layout Hopper's FP8 products take), products and sums in f32. The default
  /// decodes both operands to f32 and multiplies them with gemm (the CPU's emulation); CUDA takes cuBLASLt's
  /// FP8 product where the device and the case allow (not e5m2 by e5m2), else the default.
  virtual void fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                        const Tensor& b_scale_inv, int64_t m, int64_t n, int64_t k, Tensor& c);

  // ---- reductions along axes and indexing
  // Tensors are contiguous (but dst of copy_into_strided) and seen as [outer, n, inner], n the extent
  // reduced or indexed. Floating data: f32, f64 on the CPU; f32, f16, bf16 on CUDA (arithmetic in f32);
  // the index kernels that only move data take every dtype. Indices are i32 or i64; a negative one
  // counts from the end (+ n); one outside [-n, n) is an Input error: at once on the CPU, at the next
  // synchronisation on CUDA (the element then reads as 0, or is not written).
  /// What reduce computes over n.
  enum class ReduceOp { Sum, Max, Min, Prod, ArgMax, ArgMin, Var, LogSumExp };
  /// out [outer, inner] = op over n of x. Sum multiplies by arg (1/n: the mean); Var divides the squared
  /// deviations by max(n - arg, 0) (arg 1: unbiased); ArgMax / ArgMin write i64, the first extreme. NaN
  /// propagates (as the largest and smallest element for the arg ops). Empty n: 0 (Sum), 1 (Prod), -inf
  /// (LogSumExp), NaN (Var); the others need n > 0.
  virtual void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double arg,
                      Tensor& out) = 0;
  /// dx [outer, n, inner] = g[o, i] * the product of x[o, k, i] over k != j: Prod's gradient, exact where x
  /// holds zeros. g [outer, inner].
  virtual void prod_backward(const Tensor& x, const Tensor& g, int64_t outer, int64_t n, int64_t inner,
                             Tensor& dx) = 0;
  /// out [outer, m, inner] = x [outer, n, inner] at index[j] along n (index: m elements).
  virtual void index_select(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                            Tensor& out) = 0;
  /// dx [outer, n, inner] = the sum over j with index[j] = d of g [outer, m, inner] at j, every element
  /// written, summed in the order of j (deterministic). Floating.
  virtual void index_add(const Tensor& g, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                         Tensor& dx) = 0;
  /// out [outer, m, inner] = x [outer, n, inner] at index[o, j, i] along n (index [outer, m, inner]).
  virtual void gather_elements(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                               Tensor& out) = 0;
  /// dst [outer, n, inner] in place: src [outer, m, inner] goes to index[o, j, i] along n, added there with
  /// accumulate (floating, summed in the order of j), else written (a position given twice keeps the value of
  /// the largest j). Deterministic.
  virtual void scatter_elements(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                                bool accumulate, Tensor& dst) = 0;
  /// The elements of dst, a view of any strides (negative too) on this device, = src (contiguous, of dst's
  /// shape and dtype): copy_strided's inverse.
  virtual void copy_into_strided(const Tensor& src, Tensor& dst) = 0;
  /// out [outer, before + n + after, inner] = x [outer, n, inner] padded along n with its edge element
  /// repeated, or with reflect, mirrored about the edge (the edge not repeated; before, after < n).
  virtual void pad_axis(const Tensor& x, int64_t outer, int64_t n, int64_t inner, int64_t before, int64_t after,
                        bool reflect, Tensor& out) = 0;
  /// dx [outer, n, inner] = pad_axis's gradient from g [outer, before + n + after, inner]. Floating.
  virtual void pad_axis_backward(const Tensor& g, int64_t outer, int64_t n, int64_t inner, int64_t before,
                                 int64_t after, bool reflect, Tensor& dx) = 0;
  /// out [outer, depth, inner] (floating) = on where index [outer, inner] (+ depth when negative) equals the
  /// position along depth, else off; an index outside [-depth, depth) gives a row of off.
  virtual void one_hot(const Tensor& index, int64_t outer, int64_t depth, int64_t inner, double off, double on,
                       Tensor& out) = 0;
  /// The positions of x's nonzero elements (NaN counts as nonzero), as i64 [x.dim(), count] in row-major
  /// order. Allocates its output: its shape depends on the data, so the host waits for the device.
  virtual Tensor nonzero(const Tensor& x) = 0;
  /// For b < batch: C_b = alpha op(A_b) op(B_b) + beta C_b, row-major, the matrices of each operand stride
  /// elements apart (stride 0: one matrix for every b). Types as gemm.
  virtual void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
                            const Tensor& a, int64_t stride_a, const Tensor& b, int64_t stride_b, double beta,
                            Tensor& c, int64_t stride_c) = 0;

  // ---- softmax along an axis, layer / RMS normalisation, losses over N-D logits, attention
  // Statistics (mean, rstd, lse) are f64 for f64 data and f32 for every other type.
  /// y = softmax (log_softmax with log) of x viewed as [outer, c, inner], along the middle dimension, the
  /// maximum subtracted first. x and y share a type: CPU f32, f64; CUDA f32, f16, bf16 (arithmetic in f32).
  virtual void softmax_forward(const Tensor& x, int64_t outer, int64_t c, int64_t inner, bool log, Tensor& y) = 0;
  /// dx from dy and the forward's output y: y * (dy - sum_c dy y), or with log dy - exp(y) sum_c dy. dx may be dy.
  virtual void softmax_backward(const Tensor& dy, const Tensor& y, int64_t outer, int64_t c, int64_t inner, bool log,
                                Tensor& dx) = 0;
  /// Layer normalisation of each row of x viewed as [n, c]: y = (x - mean) * rstd * w + b with
  /// rstd = 1 / sqrt(var + eps) (biased variance); with rms, y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) +
  /// eps). w and b may be undefined (1 and 0); mean (undefined with rms) and rstd are [n]. CUDA: x, y f32,
  /// f16, bf16; w, b f32 or x's type. y is contiguous, or an [n, c] view of rows ld = y.stride(0) apart
  /// (padded rows, ops/padded_rows.h; CUDA: ld - c <= 32): each row is then followed by a one and ld - c - 1
  /// zeros.
  virtual void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t n, int64_t c, double eps,
                                  bool rms, Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  /// dx (x's type) and, where defined, dw = sum over rows of dy * xhat and db = sum over rows of dy (w's type).
  /// With dx_sums defined (f32, [c]) the backend may also write the column sums of dx as stored; it returns
  /// whether it did (the CPU for f32, CUDA for rows a warp holds).
  virtual bool layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                   const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw,
                                   Tensor& db, Tensor& dx_sums) = 0;
  /// layer_norm_backward with dx added into acc (x's type and size, holding the gradient x has received from
  /// its other readers: a residual connection's); acc_sums, the column sums of acc after the addition. The
  /// default computes dx and adds it (no sums); the CPU (f32) and CUDA fuse the two.
  virtual bool layer_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                       const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& acc, Tensor& dw,
                                       Tensor& db, Tensor& acc_sums);
  /// Softmax cross-entropy of the rows of logits [n, c] against targets [n] (i32 or i64): loss[i] =
  /// logsumexp(logits_i) - logits_i[t_i], lse[i] = logsumexp(logits_i), valid[i] = 1; a row whose target is
  /// ignore_index gets loss 0 and valid 0. loss, lse, valid: [n] of the statistics' type. A target outside
  /// [0, c) that is not ignore_index is an Input error (on CUDA reported at the next synchronisation; the loss
  /// is NaN). CUDA: logits f32, f16, bf16, read as they are.
  virtual void xent_rows_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                 Tensor& lse, Tensor& valid) = 0;
  /// dlogits (logits' type) = (softmax(logits_i) - onehot(t_i)) * g_i, 0 in ignored rows; g holds one weight for
  /// every row or one per row (the statistics' type).
  virtual void xent_rows_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g,
                                  int64_t ignore_index, Tensor& dlogits) = 0;
  /// xent_rows_forward's loss and valid, then logits overwritten in place by the gradient of each row's loss at
  /// unit weight: softmax(logits_i) - onehot(t_i), 0 in ignored rows (a fused classifier's forward, whose logits
  /// are needed only for that gradient). Only the first `classes` columns (classes <= c) are classes: the
  /// others (a token table's padding rows) take no part in the softmax and their gradient is 0; a target must be
  /// below classes. logits contiguous.
  virtual void xent_rows_forward_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                      Tensor& valid, int64_t classes) = 0;
  /// Negative log-likelihood of the rows of logp [n, c] (log-probabilities): loss[i] = -logp_i[t_i] (statistics'
  /// type), valid as for xent_rows_forward.
  virtual void nll_rows_forward(const Tensor& logp, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                                Tensor& valid) = 0;
  /// dlogp (its type) = -g_i at [i, t_i] and 0 elsewhere (and in ignored rows); g as for xent_rows_backward.
  virtual void nll_rows_backward(const Tensor& targets, const Tensor& g, int64_t ignore_index, Tensor& dlogp) = 0;
  /// The loss of each element of x against t (same shape and type), into loss (the statistics' type):
  /// (x - t)^2; -(t log x + (1 - t) log(1 - x)) with each log at least -100; max(x, 0) - x t + log(1 + e^-|x|).
  virtual void pointwise_loss_forward(PointLoss op, const Tensor& x, const Tensor& t, Tensor& loss) = 0;
  /// dx (x's type) = g * d loss / dx, g one element (one weight for all) or one per element (statistics' type).
  virtual void pointwise_loss_backward(PointLoss op, const Tensor& x, const Tensor& t, const Tensor& g, Tensor& dx) = 0;
  /// y = softmax of each row of scale * s, s viewed as [batch, tq, tk]; with causal, entries j > i of row i are
  /// masked out (exp(-inf) = 0). y may be s. Types as softmax_forward.
  virtual void attention_softmax(const Tensor& s, int64_t batch, int64_t tq, int64_t tk, double scale, bool causal,
                                 Tensor& y) = 0;
  /// Packed documents on the composed path: s [batch heads, tq, tk] (f32 or f64, contiguous) gets -1e30 at
  /// (b h, i, j) where j < i - doc_pos[b, i] (keys of earlier documents; doc_pos i32 [batch, tq] as
  /// AttentionGeom's), so that attention_softmax gives them probability 0.
  virtual void attention_mask_documents(Tensor& s, int64_t heads, const Tensor& doc_pos) = 0;
  /// Whether fused_attention_forward and _backward take this geometry in this type on the device (false: the op
  /// computes attention by matrix products). A backend may prepare its kernels for the geometry on the first call.
  virtual bool fused_attention_supported(const AttentionGeom& g, DType dtype, int device) { return false; }
  /// o [b, h, tq, dv] = attention of q [b, h, tq, d], k [b, h, tk, d], v [b, h, tk, dv] (one type; CUDA: the
  /// strides of g, the CPU: any strides); stats [b, h, tq] (f32; f64 for f64 inputs) = each row's log-sum-exp of
  /// the scaled scores, for the backward. Dropout of the probabilities (g.dropout_p > 0) draws from (seed,
  /// offset) what the composed path's dropout_mask of [b h, tq, tk] elements draws.
  virtual void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeom& g,
                                       uint64_t seed, uint64_t offset, Tensor& o, Tensor& stats);
  /// dq, dk, dv from the forward's inputs, output o, its gradient dout and stats (the same seed and offset).
  virtual void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                        const Tensor& dout, const Tensor& stats, const AttentionGeom& g, uint64_t seed,
                                        uint64_t offset, Tensor& dq, Tensor& dk, Tensor& dv);

  // ---- fused pointwise ops of Llama-family blocks. Each returns whether it computed (false: the backend does not
  // take the dtype, and nothing was written; the op then composes other ops): the CPU takes f32 and f64, CUDA f32,
  // f16 and bf16 (arithmetic in f32).
  /// y [batch, t, width] = x with each of the first g.rotated heads of every row rotated in Hugging Face's
  /// rotate-half layout: with h = d / 2 and p the row's position, the pair (x1, x2) = (x[i], x[i + h]), i < h,
  /// goes to (x1 cos[p, i] - x2 sin[p, i], x2 cos[p, i + h] + x1 sin[p, i + h]); with g.transpose to
  /// (x1 cos[p, i] + x2 sin[p, i + h], x2 cos[p, i + h] - x1 sin[p, i]). The last g.copied heads are copied.
  /// cos and sin: [P, d] of x's type, P >= g.start + g.t.
  virtual bool rotary_packed(const Tensor& x, const Tensor& cos, const Tensor& sin, const RotaryGeom& g, Tensor& y) {
    return false;
  }
  /// y [rows, hidden] = silu(gate) * up for x [rows, 2 hidden], each row the gate then the up projection
  /// (silu(a) = a sigmoid(a)).
  virtual bool swiglu_forward(const Tensor& x, int64_t rows, int64_t hidden, Tensor& y) { return false; }
  /// dx [rows, 2 hidden] from dy [rows, hidden] and the forward's x: the gate's part dy up silu'(gate), the up
  /// projection's dy silu(gate).
  virtual bool swiglu_backward(const Tensor& dy, const Tensor& x, int64_t rows, int64_t hidden, Tensor& dx) {
    return false;
  }

  // ---- embedding and recurrent networks
  /// out [n, d] = rows indices[i] of weight [v, d]; indices i32 or i64 [n]. An index outside [0, v) is an
  /// Input error: the CPU throws it; CUDA writes a row of zeros and records the error in the device's
  /// error record (synchronize and copy_to_host throw it). CUDA: f32, f16, bf16.
  virtual void embedding_forward(const Tensor& weight, const Tensor& indices, Tensor& out) = 0;
  /// dweight [v, d] (overwritten) = for each row r, the sum of the rows dy[i] (dy [n, d]) with
  /// indices[i] == r; indices outside [0, v) add nothing. With deterministic, every sum is taken in
  /// the order of i (the same bits on every run); otherwise in any order (CUDA: f32 atomics).
  /// dy and dweight share the weight's dtype; 16-bit sums are f32.
  virtual void embedding_backward(const Tensor& dy, const Tensor& indices, bool deterministic, Tensor& dweight) = 0;
  /// embedding_backward with the sums added into dweight (a gradient the table has received already: a tied
  /// output layer's), where the backend takes the case: returns whether it did (the default: never; the CPU:
  /// always; CUDA: f32 without deterministic, its atomics adding into dweight).
  virtual bool embedding_backward_add(const Tensor& dy, const Tensor& indices, bool deterministic, Tensor& dweight) {
    return false;
  }
  /// Whether rnn_forward and rnn_backward compute this network here (the fused kernels: cuDNN's);
  /// when not, tandem::rnn composes it of other ops.
  virtual bool rnn_supported(const RnnGeom& g) { return false; }
  /// y, hy and (LSTM) cy from x, the flat weight w and the initial states hx, cx (undefined: zeros); all
  /// contiguous in g.dtype. With training, reserve is made here (u8, on the device) and holds what
  /// rnn_backward needs.
  virtual void rnn_forward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                           bool training, Tensor& y, Tensor& hy, Tensor& cy, Tensor& reserve);
  /// Gradients of a training rnn_forward: dx and, when defined, dw (overwritten), dhx and dcx, from dy and
  /// dhy, dcy (undefined: zeros). y and reserve are that forward's (reserve is used up).
  virtual void rnn_backward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                            const Tensor& y, const Tensor& reserve, const Tensor& dy, const Tensor& dhy,
                            const Tensor& dcy, Tensor& dx, Tensor& dw, Tensor& dhx, Tensor& dcx);

  // ---- optimizers, over many tensors in one call (f32 params)
  virtual void sgd_step(ParamSlot* slots, int64_t count, const SgdArgs& a) = 0;
  virtual void adam_step(ParamSlot* slots, int64_t count, const AdamArgs& a) = 0;
  virtual void rmsprop_step(ParamSlot* slots, int64_t count, const RmsPropArgs& a) = 0;
  virtual void adagrad_step(ParamSlot* slots, int64_t count, const AdagradArgs& a) = 0;
};

/// The backend for a device; throws tandem::Error when tandem was built without it.
Backend& backend_for(Device d);
Backend& cpu_backend();
/// The CUDA backend, or null when tandem was built without CUDA (link-time choice).
Backend* cuda_backend();

}  // namespace tandem::backend
