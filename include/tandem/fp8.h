#pragma once
// 8-bit floating point (FP8) for training, in progress: the two formats, the scaling recipe that layers
// consult, the scale state each FP8 tensor keeps on its device, the scaled casts and a linear product
// computed from FP8 operands. Nothing selects FP8 yet (there is no Precision::fp8): these are the parts
// a training step will be made of. docs/precision.md says what is tested and what is not wired yet.
#include <cstdint>
#include <string_view>

#include "tandem/device.h"
#include "tandem/tensor.h"

namespace tandem {

/// The 8-bit float formats, both with subnormals:
///  e4m3  4 exponent bits (bias 7), 3 mantissa bits; the "fn" variant: no infinities, S.1111.111 is NaN,
///        largest finite value 448, smallest normal 2^-6, smallest subnormal 2^-9
///  e5m2  5 exponent bits (bias 15), 2 mantissa bits; IEEE-like: S.11111.00 is infinity, S.11111.xx (xx
///        not 00) NaN, largest finite value 57344, smallest normal 2^-14, smallest subnormal 2^-16
/// FP8 tensors are stored as u8 tensors of the codes; the format travels beside them.
enum class Fp8Format : uint8_t { e4m3, e5m2 };

/// "e4m3" or "e5m2".
const char* fp8_format_name(Fp8Format f);
/// Parses "e4m3" or "e5m2" (any case); throws tandem::Error listing the choices otherwise.
Fp8Format parse_fp8_format(std::string_view s);
/// The largest finite value of the format: 448 (e4m3), 57344 (e5m2).
float fp8_max(Fp8Format f);

/// How a tensor's scale is chosen:
///  current  from the tensor's own maximum |x|, computed just before the cast (one extra pass over it)
///  delayed  from a history of the maxima of earlier steps; the cast records this step's maximum as it goes
enum class Fp8Scaling : uint8_t { current, delayed };
/// The maximum a delayed scale is computed from: the largest of the history, or the most recent one.
enum class Fp8AmaxCompute : uint8_t { max, most_recent };

/// The scaling recipe: how the scales of a model's FP8 tensors are kept. A tensor x is cast as
/// q = fp8(x * scale), rounded to nearest even and saturating (beyond the format's largest value: that
/// value); it stands for q * scale_inv, scale_inv = 1 / scale. The scale is
///     scale = fp8_max(format) / amax / 2^margin
/// with amax the tensor's maximum |x| (current) or the maximum of the history (delayed); an amax that is
/// zero or not finite leaves the previous scale in place (at first 1).
struct Fp8Recipe {
  Fp8Scaling scaling = Fp8Scaling::current;
  /// Powers of two of headroom left below the format's largest value.
  int margin = 0;
  /// Delayed scaling: how many steps' maxima the history keeps (current scaling keeps one).
  int64_t amax_history_len = 1024;
  Fp8AmaxCompute amax_compute = Fp8AmaxCompute::max;
  /// The format of the forward's operands (inputs and weights) and of the gradients cast in backward.
  Fp8Format forward_format = Fp8Format::e4m3;
  Fp8Format backward_format = Fp8Format::e5m2;

  /// Per-tensor current scaling, e4m3 forward, e5m2 backward.
  static Fp8Recipe current(int margin = 0);
  /// Delayed scaling over `history` steps.
  static Fp8Recipe delayed(int64_t history = 1024, Fp8AmaxCompute compute = Fp8AmaxCompute::max, int margin = 0);

  /// Rows of the amax history: 1 under current scaling, amax_history_len under delayed.
  int64_t history_rows() const { return scaling == Fp8Scaling::current ? 1 : amax_history_len; }
  /// Throws tandem::Error naming the field when a value is out of range (margin in [0, 64], history >= 1).
  void validate() const;
};

/// The scale state of `count` tensors cast to one format under one recipe, kept on their device so that a
/// step using it can be recorded (tandem/graph.h) and replayed:
///   scale, scale_inv  f32 [count], at first 1
///   amax_history      f32 [rows, count], at first 0; row 0 collects the current step's maxima (each cast
///                     or amax pass takes the maximum of what is there and its tensor's), older rows the
///                     steps before
/// Copies share the tensors.
class Fp8ScaleState {
 public:
  Fp8ScaleState() = default;
  Fp8ScaleState(const Fp8Recipe& recipe, Fp8Format format, int64_t count, Device device);

  bool defined() const { return scale_.defined(); }
  const Fp8Recipe& recipe() const { return recipe_; }
  Fp8Format format() const { return format_; }
  int64_t count() const { return count_; }
  Device device() const { return scale_.device(); }
  const Tensor& scale() const { return scale_; }
  const Tensor& scale_inv() const { return scale_inv_; }
  const Tensor& amax_history() const { return history_; }
  /// One-element views of slot i: its scale, its inverse, and its entry of history row 0.
  Tensor scale(int64_t i) const;
  Tensor scale_inv(int64_t i) const;
  Tensor amax(int64_t i) const;

  /// The update step, one kernel for every slot (nothing waits for the device). For each slot, with
  /// recent = its entry of row 0:
  ///  - recent not finite (inf or NaN): the scale and the older rows stay; the entry is cleared to 0; the
  ///    verdict, when defined, becomes NaN
  ///  - otherwise amax = the maximum of its history (Fp8AmaxCompute::max) or recent (most_recent); when
  ///    amax > 0, scale = fp8_max / amax / 2^margin (the largest finite f32 where that overflows) and
  ///    scale_inv = 1 / scale; then the history moves down a row (the oldest entry leaves) and row 0 is 0.
  /// verdict: one f32 on the state's device, left as it is when every slot was finite, so that one verdict
  /// collects a whole step's updates (0 before the step; the non-finite guards of optim and
  /// distributed then skip the step, as they skip a bf16 or f16 step whose gradients overflowed).
  void update(const Tensor& verdict = Tensor()) const;

 private:
  Fp8Recipe recipe_;
  Fp8Format format_ = Fp8Format::e4m3;
  int64_t count_ = 0;
  Tensor scale_, scale_inv_, history_;
};

// ---- scaled casts (ops without gradients; x f32, bf16 or f16; the scales one-element f32 tensors on x's
// device, such as Fp8ScaleState::scale(i))
/// The codes (u8, x's shape) of x * scale in `format`, round to nearest even, saturating (±inf and values
/// beyond the largest finite value give that value with their sign; NaN gives NaN). With amax defined (one
/// f32), amax = max(amax, max |x|) on the way: a NaN of x makes it NaN, an infinity +inf.
Tensor fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& amax = Tensor());
/// The cast of x^T for a 2-D x [r, c]: codes [c, r], equal to transposing fp8_quantize's (the layout Hopper's
/// FP8 products need for a backward product's operands).
Tensor fp8_quantize_transposed(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& amax = Tensor());
/// The values the codes q (u8) stand for: decode(q) * scale_inv, as `dtype` (f32, bf16, f16).
Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype = DType::f32);
/// amax (one f32) = max(amax, max |x|), NaN propagating as in fp8_quantize.
void fp8_amax(const Tensor& x, const Tensor& amax);

// ---- the linear layer's product from FP8 operands
/// The scale state of one FP8 linear layer under a recipe: the forward's (slot 0 the input, slot 1 the
/// weight, in recipe.forward_format) and the backward's (slot 0 the output gradient, in
/// recipe.backward_format), and a verdict (one f32, 0 at first) that becomes NaN when an update meets a
/// maximum that is not finite (see Fp8ScaleState::update). Copies share the state.
struct Fp8LinearState {
  Fp8LinearState() = default;
  Fp8LinearState(const Fp8Recipe& recipe, Device device);
  Fp8Recipe recipe;
  Fp8ScaleState forward, backward;
  Tensor verdict;
  /// Delayed scaling's step-end update of both states (under current scaling the casts compute their
  /// scales, and this does nothing).
  void update() const;
  /// The verdict back to 0 (before a step).
  void reset_verdict() const;
};

/// x [..., in] x w [out, in]^T + b [out] (b may be undefined) from FP8 operands: x and w cast with their
/// scales in the forward format, the product of the values the codes stand for summed in f32, plus the
/// bias in f32, returned in x's dtype (f32 or bf16). Under current scaling each call first computes the
/// tensors' maxima and scales; under delayed scaling the casts use the scales as they are and record the
/// maxima for Fp8LinearState::update. Backward casts the output gradient in the backward format with its
/// own scale and computes dx = g w and dw = g^T x from the FP8 operands (their transposed casts where the
/// product needs them), db = the sums of the uncast g; dx in x's dtype, dw and db in w's.
/// CPU: the products are emulated (the codes decoded to f32, then the f32 product). CUDA: cuBLASLt's FP8
/// products where the device and shapes allow, else the same emulation.
Tensor fp8_linear(const Tensor& x, const Tensor& w, const Tensor& b, const Fp8LinearState& state);

}  // namespace tandem
