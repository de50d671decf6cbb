#pragma once
// Internal: the elementwise ops every backend computes, their parameters and the iteration geometry
// the backends share. One functor per op (backend/elementwise_functors.h) runs inside one generic
// broadcasting kernel per backend (cpu_elementwise.cpp, cuda_elementwise.cu).
#include <cstdint>
#include <span>

#include "tandem/tensor.h"

namespace tandem::backend {

/// Two-operand ops. Gt, Ge, Lt, Le, Eq and Ne give 1 where the comparison holds and 0 elsewhere (false
/// wherever a NaN takes part, Ne excepted), And, Or and Xor 1 or 0 from operands read as true when
/// nonzero, in the operands' type. Prelu is a > 0 ? a : b * a; PreluGradSlope (grad, x) is the
/// gradient of Prelu's slope, x > 0 ? 0 : grad * x. Pow, Prelu and PreluGradSlope take floats only.
enum class Binary { Add, Sub, Mul, Div, Max, Min, Gt, Ge, Lt, Le, Eq, Ne, Pow, And, Or, Xor, Prelu, PreluGradSlope };

/// One-operand ops. Parameters come in EwArgs: LeakyRelu (alpha: the slope below 0), Elu (alpha),
/// Selu (alpha, beta: the scale), HardSigmoid (max(0, min(1, alpha x + beta))), Clip (alpha, beta:
/// the bounds), PowScalar (x^alpha), ScalarPow (alpha^x), Affine (alpha x + beta). Round rounds halves
/// away from zero, RoundEven to the even neighbour; Not is 1 where x is 0, else 0.
enum class Unary {
  Neg, Relu, Sigmoid, Tanh, Exp, Log, Abs, Sqrt, Reciprocal, Sign, Erf,
  Sin, Cos, Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh,
  Ceil, Floor, Round, RoundEven,
  LeakyRelu, Elu, Selu, Softplus, Softsign, HardSigmoid, GeluErf, GeluTanh, Silu,
  Clip, PowScalar, ScalarPow, Not, Affine
};

/// Three-operand ops: Where (cond, a, b) is cond != 0 ? a : b; the others are gradients of two-operand
/// ops given (grad, a, b): DivGradB -grad a / b^2; PowGradA and PowGradB those of a^b for a and b
/// (PyTorch's: 0 where b is 0, and where a is 0 and b >= 0, respectively); MaxGradA / MaxGradB those of
/// max(a, b) (a tie splits grad in halves; min's are MaxGradB / MaxGradA); PreluGradX
/// x > 0 ? grad : grad * slope for (grad, x, slope). All but Where take floats only.
enum class Ternary { Where, DivGradB, PowGradA, PowGradB, MaxGradA, MaxGradB, PreluGradX };

/// The numbers some ops take (see Unary).
struct EwArgs {
  double alpha = 0.0, beta = 0.0;
};

/// The op's name as users know it ("add", "greater", "leaky_relu", ...).
const char* op_name(Binary op);
const char* op_name(Unary op);
const char* op_name(Ternary op);
/// "relu_backward", ...
const char* backward_name(Unary op);

/// Whether unary_backward differentiates op from its output y (else from its input x).
constexpr bool grad_from_output(Unary op) {
  return op == Unary::Relu || op == Unary::Sigmoid || op == Unary::Tanh || op == Unary::Exp || op == Unary::Sqrt ||
         op == Unary::Reciprocal || op == Unary::Tan;
}
/// Whether op's derivative is zero wherever it exists (unary_backward does not take it).
constexpr bool grad_is_zero(Unary op) {
  return op == Unary::Sign || op == Unary::Ceil || op == Unary::Floor || op == Unary::Round ||
         op == Unary::RoundEven || op == Unary::Not;
}
/// Whether op computes on integer operands too (i32, i64), besides floats.
constexpr bool takes_integers(Binary op) {
  return op != Binary::Pow && op != Binary::Prelu && op != Binary::PreluGradSlope;
}

namespace ew {

inline constexpr int kMaxDims = 16;
inline constexpr int kMaxArgs = 4;  // the output and up to three operands

/// How an elementwise kernel walks its tensors: the output's dimensions in its storage order (outermost
/// first), extents of 1 dropped and neighbours merged where every tensor allows, with each tensor's
/// element strides over them (0 where an operand is broadcast). The output is dense, so element i of
/// the walk is element i of its storage.
struct Geometry {
  int ndim = 0;  // at least 1 when numel > 0
  int nargs = 0;  // operands, the output not counted
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxArgs - 1][kMaxDims] = {};  // per operand

  /// True when every operand is read in the output's order or is one element: one dimension, strides
  /// 1 or 0.
  bool flat() const {
    if (ndim != 1) return false;
    for (int k = 0; k < nargs; ++k)
      if (strides[k][0] != 0 && strides[k][0] != 1) return false;
    return true;
  }
};

/// The walk of out (dense: contiguous or channels-last, any shape) and its operands: each has out's
/// shape or one that broadcasts to it (NumPy's rules), any strides; an operand of out's element count
/// with another shape is read flat when it and out are contiguous. Returns false when more than
/// kMaxDims dimensions remain after merging.
bool make_geometry(const Tensor& out, std::span<const Tensor* const> operands, Geometry& g);
/// t stretched to the shape of out (contiguous, more than kMaxDims dimensions) as a contiguous copy:
/// what a kernel reads instead when make_geometry gives up.
Tensor broadcast_copy(const Tensor& t, const Tensor& out);

}  // namespace ew

}  // namespace tandem::backend
