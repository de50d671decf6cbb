#pragma once
// Internal: one functor per elementwise op (backend/elementwise.h), shared by the CPU and the CUDA
// kernels so that both compute the same formula. C is the compute type: float or double for floating
// tensors (16-bit ones compute in float), int32_t or int64_t for integer ones. with_*_functor picks the
// functor of an op at run time and calls a generic callable with it.
#include <math.h>

#include <cstdint>
#include <type_traits>

#include "backend/elementwise.h"
#include "tandem/error.h"

#if defined(__CUDACC__)
#define TANDEM_EW_FN __host__ __device__ __forceinline__
#else
#define TANDEM_EW_FN inline
#endif

namespace tandem::backend::ewf {

// ---- math in the compute type (the C library's float and double forms; CUDA has both on the device)
#define TANDEM_EW_MATH1(name, f, d)                       \
  TANDEM_EW_FN float name(float x) { return ::f(x); }   \
  TANDEM_EW_FN double name(double x) { return ::d(x); }
TANDEM_EW_MATH1(exp_, expf, exp)
TANDEM_EW_MATH1(expm1_, expm1f, expm1)
TANDEM_EW_MATH1(log_, logf, log)
TANDEM_EW_MATH1(log1p_, log1pf, log1p)
TANDEM_EW_MATH1(sqrt_, sqrtf, sqrt)
TANDEM_EW_MATH1(fabs_, fabsf, fabs)
TANDEM_EW_MATH1(erf_, erff, erf)
TANDEM_EW_MATH1(sin_, sinf, sin)
TANDEM_EW_MATH1(cos_, cosf, cos)
TANDEM_EW_MATH1(tan_, tanf, tan)
TANDEM_EW_MATH1(asin_, asinf, asin)
TANDEM_EW_MATH1(acos_, acosf, acos)
TANDEM_EW_MATH1(atan_, atanf, atan)
TANDEM_EW_MATH1(sinh_, sinhf, sinh)
TANDEM_EW_MATH1(cosh_, coshf, cosh)
TANDEM_EW_MATH1(tanh_, tanhf, tanh)
TANDEM_EW_MATH1(asinh_, asinhf, asinh)
TANDEM_EW_MATH1(acosh_, acoshf, acosh)
TANDEM_EW_MATH1(atanh_, atanhf, atanh)
TANDEM_EW_MATH1(ceil_, ceilf, ceil)
TANDEM_EW_MATH1(floor_, floorf, floor)
TANDEM_EW_MATH1(round_, roundf, round)  // halves away from zero
TANDEM_EW_MATH1(rint_, rintf, rint)     // halves to even (the default rounding mode)
#undef TANDEM_EW_MATH1
TANDEM_EW_FN float pow_(float x, float y) { return ::powf(x, y); }
TANDEM_EW_FN double pow_(double x, double y) { return ::pow(x, y); }

template <typename C>
TANDEM_EW_FN C sigmoid_(C x) {
  return C(1) / (C(1) + exp_(-x));
}
template <typename C>
TANDEM_EW_FN C sign_(C x) {
  return C((C(0) < x) - (x < C(0)));  // 0 for 0 and NaN, as PyTorch's
}

constexpr double kSqrt1_2 = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kTwoRsqrtPi = 1.12837916709551257390;  // 2 / sqrt(pi)
constexpr double kRsqrt2Pi = 0.39894228040143267794;    // 1 / sqrt(2 pi)
constexpr double kSqrt2RsqrtPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluKappa = 0.044715;

template <typename C>
TANDEM_EW_FN C clamp01_(C x) {
  return x < C(0) ? C(0) : (x > C(1) ? C(1) : x);
}
template <typename C>
TANDEM_EW_FN C gelu_tanh_grad_(C g, C x) {
  const C t = tanh_(C(kSqrt2RsqrtPi) * (x + C(kGeluKappa) * x * x * x));
  const C inner_grad = C(kSqrt2RsqrtPi) * (C(1) + C(3 * kGeluKappa) * x * x);
  return g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * inner_grad);
}

// Integer add, subtract and multiply wrap (as unsigned arithmetic does) instead of overflowing into
// undefined behaviour; x / -1 is negation, which wraps for the smallest value instead of trapping.
template <typename C>
TANDEM_EW_FN C wrap_add(C x, C y) {
  if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<std::make_unsigned_t<C>>(x) + static_cast<std::make_unsigned_t<C>>(y));
  else
    return x + y;
}
template <typename C>
TANDEM_EW_FN C wrap_sub(C x, C y) {
  if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<std::make_unsigned_t<C>>(x) - static_cast<std::make_unsigned_t<C>>(y));
  else
    return x - y;
}
template <typename C>
TANDEM_EW_FN C wrap_mul(C x, C y) {
  if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<std::make_unsigned_t<C>>(x) * static_cast<std::make_unsigned_t<C>>(y));
  else
    return x * y;
}
template <typename C>
TANDEM_EW_FN C wrap_div(C x, C y) {
  if constexpr (std::is_integral_v<C>)
    return y == C(-1) ? wrap_sub(C(0), x) : x / y;
  else
    return x / y;
}

// ---- one operand: forward (a, b: EwArgs in the compute type)
#define TANDEM_EW_UNARY(Name, expr)                                        \
  template <typename C>                                                    \
  struct Name {                                                            \
    C a, b;                                                                \
    TANDEM_EW_FN C operator()(C x) const { return expr; }                  \
  };

TANDEM_EW_UNARY(NegF, -x)
TANDEM_EW_UNARY(ReluF, x < C(0) ? C(0) : x)  // NaN stays NaN
TANDEM_EW_UNARY(SigmoidF, sigmoid_(x))
TANDEM_EW_UNARY(TanhF, tanh_(x))
TANDEM_EW_UNARY(ExpF, exp_(x))
TANDEM_EW_UNARY(LogF, log_(x))
TANDEM_EW_UNARY(AbsF, fabs_(x))
TANDEM_EW_UNARY(SqrtF, sqrt_(x))
TANDEM_EW_UNARY(ReciprocalF, C(1) / x)
TANDEM_EW_UNARY(SignF, sign_(x))
TANDEM_EW_UNARY(ErfF, erf_(x))
TANDEM_EW_UNARY(SinF, sin_(x))
TANDEM_EW_UNARY(CosF, cos_(x))
TANDEM_EW_UNARY(TanF, tan_(x))
TANDEM_EW_UNARY(AsinF, asin_(x))
TANDEM_EW_UNARY(AcosF, acos_(x))
TANDEM_EW_UNARY(AtanF, atan_(x))
TANDEM_EW_UNARY(SinhF, sinh_(x))
TANDEM_EW_UNARY(CoshF, cosh_(x))
TANDEM_EW_UNARY(AsinhF, asinh_(x))
TANDEM_EW_UNARY(AcoshF, acosh_(x))
TANDEM_EW_UNARY(AtanhF, atanh_(x))
TANDEM_EW_UNARY(CeilF, ceil_(x))
TANDEM_EW_UNARY(FloorF, floor_(x))
TANDEM_EW_UNARY(RoundF, round_(x))
TANDEM_EW_UNARY(RoundEvenF, rint_(x))
TANDEM_EW_UNARY(LeakyReluF, x > C(0) ? x : a * x)
TANDEM_EW_UNARY(EluF, x > C(0) ? x : a * expm1_(x))
TANDEM_EW_UNARY(SeluF, b * (x > C(0) ? x : a * expm1_(x)))
// max(x, 0) + log(1 + e^-|x|): log(1 + e^x) without overflow
TANDEM_EW_UNARY(SoftplusF, (x > C(0) ? x : C(0)) + log1p_(exp_(-fabs_(x))))
TANDEM_EW_UNARY(SoftsignF, x / (C(1) + fabs_(x)))
TANDEM_EW_UNARY(HardSigmoidF, clamp01_(a * x + b))
TANDEM_EW_UNARY(GeluErfF, C(0.5) * x * (C(1) + erf_(x * C(kSqrt1_2))))
TANDEM_EW_UNARY(GeluTanhF, C(0.5) * x * (C(1) + tanh_(C(kSqrt2RsqrtPi) * (x + C(kGeluKappa) * x * x * x))))
TANDEM_EW_UNARY(SiluF, x * sigmoid_(x))
// min(max(x, a), b): b everywhere when a > b (as PyTorch's clamp); NaN stays NaN
TANDEM_EW_UNARY(ClipF, (x < a ? a : x) > b ? b : (x < a ? a : x))
TANDEM_EW_UNARY(PowScalarF, pow_(x, a))
TANDEM_EW_UNARY(ScalarPowF, pow_(a, x))
TANDEM_EW_UNARY(NotF, C(x == C(0)))
TANDEM_EW_UNARY(AffineF, a * x + b)

// ---- one operand: gradient, from (grad g, v), v the output y where grad_from_output(op), else the input x
#define TANDEM_EW_GRAD(Name, expr)                                          \
  template <typename C>                                                     \
  struct Name {                                                             \
    C a, b;                                                                 \
    TANDEM_EW_FN C operator()(C g, C v) const { return expr; }              \
  };

TANDEM_EW_GRAD(NegG, -g)
TANDEM_EW_GRAD(ReluG, v > C(0) ? g : C(0))
TANDEM_EW_GRAD(SigmoidG, g * v * (C(1) - v))
TANDEM_EW_GRAD(TanhG, g * (C(1) - v * v))
TANDEM_EW_GRAD(ExpG, g * v)
TANDEM_EW_GRAD(LogG, g / v)
TANDEM_EW_GRAD(AbsG, g * sign_(v))
TANDEM_EW_GRAD(SqrtG, g / (C(2) * v))
TANDEM_EW_GRAD(ReciprocalG, -g * v * v)
TANDEM_EW_GRAD(ErfG, g * C(kTwoRsqrtPi) * exp_(-v * v))
TANDEM_EW_GRAD(SinG, g * cos_(v))
TANDEM_EW_GRAD(CosG, -g * sin_(v))
TANDEM_EW_GRAD(TanG, g * (C(1) + v * v))
TANDEM_EW_GRAD(AsinG, g / sqrt_(C(1) - v * v))
TANDEM_EW_GRAD(AcosG, -g / sqrt_(C(1) - v * v))
TANDEM_EW_GRAD(AtanG, g / (C(1) + v * v))
TANDEM_EW_GRAD(SinhG, g * cosh_(v))
TANDEM_EW_GRAD(CoshG, g * sinh_(v))
TANDEM_EW_GRAD(AsinhG, g / sqrt_(v * v + C(1)))
TANDEM_EW_GRAD(AcoshG, g / sqrt_(v * v - C(1)))
TANDEM_EW_GRAD(AtanhG, g / (C(1) - v * v))
TANDEM_EW_GRAD(LeakyReluG, v > C(0) ? g : a * g)
TANDEM_EW_GRAD(EluG, v > C(0) ? g : g * a * exp_(v))
TANDEM_EW_GRAD(SeluG, v > C(0) ? b * g : g * b * a * exp_(v))
TANDEM_EW_GRAD(SoftplusG, g * sigmoid_(v))
TANDEM_EW_GRAD(SoftsignG, g / ((C(1) + fabs_(v)) * (C(1) + fabs_(v))))
TANDEM_EW_GRAD(HardSigmoidG, (a * v + b > C(0) && a * v + b < C(1)) ? a * g : C(0))
TANDEM_EW_GRAD(GeluErfG, g * (C(0.5) * (C(1) + erf_(v * C(kSqrt1_2))) + v * C(kRsqrt2Pi) * exp_(C(-0.5) * v * v)))
TANDEM_EW_GRAD(GeluTanhG, gelu_tanh_grad_(g, v))
TANDEM_EW_GRAD(SiluG, g * sigmoid_(v) * (C(1) + v * (C(1) - sigmoid_(v))))
TANDEM_EW_GRAD(ClipG, (v >= a && v <= b) ? g : C(0))
TANDEM_EW_GRAD(PowScalarG, a == C(0) ? C(0) : g * a * pow_(v, a - C(1)))
TANDEM_EW_GRAD(ScalarPowG, (a == C(0) && v >= C(0)) ? C(0) : g * pow_(a, v) * log_(a))
TANDEM_EW_GRAD(AffineG, a * g)

// ---- two operands
#define TANDEM_EW_BINARY(Name, expr)                                        \
  template <typename C>                                                     \
  struct Name {                                                             \
    TANDEM_EW_FN C operator()(C x, C y) const { return expr; }              \
  };

TANDEM_EW_BINARY(AddF, wrap_add(x, y))
TANDEM_EW_BINARY(SubF, wrap_sub(x, y))
TANDEM_EW_BINARY(MulF, wrap_mul(x, y))
TANDEM_EW_BINARY(DivF, wrap_div(x, y))
// Floats: a NaN in either operand propagates; ties give the second operand.
TANDEM_EW_BINARY(MaxF, (x > y || x != x) ? x : y)
TANDEM_EW_BINARY(MinF, (x < y || x != x) ? x : y)
TANDEM_EW_BINARY(GtF, C(x > y))
TANDEM_EW_BINARY(GeF, C(x >= y))
TANDEM_EW_BINARY(LtF, C(x < y))
TANDEM_EW_BINARY(LeF, C(x <= y))
TANDEM_EW_BINARY(EqF, C(x == y))
TANDEM_EW_BINARY(NeF, C(x != y))
TANDEM_EW_BINARY(PowF, pow_(x, y))
TANDEM_EW_BINARY(AndF, C(x != C(0) && y != C(0)))
TANDEM_EW_BINARY(OrF, C(x != C(0) || y != C(0)))
TANDEM_EW_BINARY(XorF, C((x != C(0)) != (y != C(0))))
TANDEM_EW_BINARY(PreluF, x > C(0) ? x : y * x)
TANDEM_EW_BINARY(PreluGradSlopeF, y > C(0) ? C(0) : x * y)  // (grad, x)

/// y = alpha x + y (a: alpha)
template <typename C>
struct AxpyF {
  C a;
  TANDEM_EW_FN C operator()(C x, C y) const { return a * x + y; }
};

// ---- three operands
#define TANDEM_EW_TERNARY(Name, expr)                                       \
  template <typename C>                                                     \
  struct Name {                                                             \
    TANDEM_EW_FN C operator()(C g, C x, C y) const { return expr; }         \
  };

TANDEM_EW_TERNARY(WhereF, g != C(0) ? x : y)  // (cond, a, b)
TANDEM_EW_TERNARY(DivGradBF, -g * x / (y * y))
TANDEM_EW_TERNARY(PowGradAF, y == C(0) ? C(0) : g * y * pow_(x, y - C(1)))
TANDEM_EW_TERNARY(PowGradBF, (x == C(0) && y >= C(0)) ? C(0) : g * pow_(x, y) * log_(x))
TANDEM_EW_TERNARY(MaxGradAF, x == y ? g * C(0.5) : (x < y ? C(0) : g))
TANDEM_EW_TERNARY(MaxGradBF, x == y ? g * C(0.5) : (x > y ? C(0) : g))
TANDEM_EW_TERNARY(PreluGradXF, x > C(0) ? g : g * y)  // (grad, x, slope)

// ---- choosing the functor of an op (host code): f(functor) for the op's functor in compute type C
template <typename C, typename F>
void with_unary(Unary op, const EwArgs& args, F&& f) {
  static_assert(std::is_floating_point_v<C>, "one-operand ops compute in float or double");
  const C a = static_cast<C>(args.alpha), b = static_cast<C>(args.beta);
#define TANDEM_EW_CASE(Op) \
  case Unary::Op: return f(Op##F<C>{a, b});
  switch (op) {
    TANDEM_EW_CASE(Neg) TANDEM_EW_CASE(Relu) TANDEM_EW_CASE(Sigmoid) TANDEM_EW_CASE(Tanh) TANDEM_EW_CASE(Exp)
    TANDEM_EW_CASE(Log) TANDEM_EW_CASE(Abs) TANDEM_EW_CASE(Sqrt) TANDEM_EW_CASE(Reciprocal) TANDEM_EW_CASE(Sign)
    TANDEM_EW_CASE(Erf) TANDEM_EW_CASE(Sin) TANDEM_EW_CASE(Cos) TANDEM_EW_CASE(Tan) TANDEM_EW_CASE(Asin)
    TANDEM_EW_CASE(Acos) TANDEM_EW_CASE(Atan) TANDEM_EW_CASE(Sinh) TANDEM_EW_CASE(Cosh) TANDEM_EW_CASE(Asinh)
    TANDEM_EW_CASE(Acosh) TANDEM_EW_CASE(Atanh) TANDEM_EW_CASE(Ceil) TANDEM_EW_CASE(Floor) TANDEM_EW_CASE(Round)
    TANDEM_EW_CASE(RoundEven) TANDEM_EW_CASE(LeakyRelu) TANDEM_EW_CASE(Elu) TANDEM_EW_CASE(Selu)
    TANDEM_EW_CASE(Softplus) TANDEM_EW_CASE(Softsign) TANDEM_EW_CASE(HardSigmoid) TANDEM_EW_CASE(GeluErf)
    TANDEM_EW_CASE(GeluTanh) TANDEM_EW_CASE(Silu) TANDEM_EW_CASE(Clip) TANDEM_EW_CASE(PowScalar)
    TANDEM_EW_CASE(ScalarPow) TANDEM_EW_CASE(Not) TANDEM_EW_CASE(Affine)
  }
#undef TANDEM_EW_CASE
  TANDEM_CHECK(false, "unary: unknown op ", static_cast<int>(op));
}

template <typename C, typename F>
void with_unary_grad(Unary op, const EwArgs& args, F&& f) {
  static_assert(std::is_floating_point_v<C>, "one-operand gradients compute in float or double");
  const C a = static_cast<C>(args.alpha), b = static_cast<C>(args.beta);
#define TANDEM_EW_CASE(Op) \
  case Unary::Op: return f(Op##G<C>{a, b});
  switch (op) {
    TANDEM_EW_CASE(Neg) TANDEM_EW_CASE(Relu) TANDEM_EW_CASE(Sigmoid) TANDEM_EW_CASE(Tanh) TANDEM_EW_CASE(Exp)
    TANDEM_EW_CASE(Log) TANDEM_EW_CASE(Abs) TANDEM_EW_CASE(Sqrt) TANDEM_EW_CASE(Reciprocal) TANDEM_EW_CASE(Erf)
    TANDEM_EW_CASE(Sin) TANDEM_EW_CASE(Cos) TANDEM_EW_CASE(Tan) TANDEM_EW_CASE(Asin) TANDEM_EW_CASE(Acos)
    TANDEM_EW_CASE(Atan) TANDEM_EW_CASE(Sinh) TANDEM_EW_CASE(Cosh) TANDEM_EW_CASE(Asinh) TANDEM_EW_CASE(Acosh)
    TANDEM_EW_CASE(Atanh) TANDEM_EW_CASE(LeakyRelu) TANDEM_EW_CASE(Elu) TANDEM_EW_CASE(Selu)
    TANDEM_EW_CASE(Softplus) TANDEM_EW_CASE(Softsign) TANDEM_EW_CASE(HardSigmoid) TANDEM_EW_CASE(GeluErf)
    TANDEM_EW_CASE(GeluTanh) TANDEM_EW_CASE(Silu) TANDEM_EW_CASE(Clip) TANDEM_EW_CASE(PowScalar)
    TANDEM_EW_CASE(ScalarPow) TANDEM_EW_CASE(Affine)
    default: break;
  }
#undef TANDEM_EW_CASE
  TANDEM_CHECK(false, "unary_backward: ", op_name(op), " has a zero derivative and no gradient kernel");
}

template <typename C, typename F>
void with_binary(Binary op, F&& f) {
#define TANDEM_EW_CASE(Op) \
  case Binary::Op: return f(Op##F<C>{});
  switch (op) {
    TANDEM_EW_CASE(Add) TANDEM_EW_CASE(Sub) TANDEM_EW_CASE(Mul) TANDEM_EW_CASE(Div) TANDEM_EW_CASE(Max)
    TANDEM_EW_CASE(Min) TANDEM_EW_CASE(Gt) TANDEM_EW_CASE(Ge) TANDEM_EW_CASE(Lt) TANDEM_EW_CASE(Le)
    TANDEM_EW_CASE(Eq) TANDEM_EW_CASE(Ne) TANDEM_EW_CASE(And) TANDEM_EW_CASE(Or) TANDEM_EW_CASE(Xor)
    default: break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      TANDEM_EW_CASE(Pow) TANDEM_EW_CASE(Prelu) TANDEM_EW_CASE(PreluGradSlope)
      default: break;
    }
  }
#undef TANDEM_EW_CASE
  TANDEM_CHECK(false, op_name(op), ": integer operands are not supported (use a floating dtype)");
}

template <typename C, typename F>
void with_ternary(Ternary op, F&& f) {
#define TANDEM_EW_CASE(Op) \
  case Ternary::Op: return f(Op##F<C>{});
  if (op == Ternary::Where) return f(WhereF<C>{});
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      TANDEM_EW_CASE(DivGradB) TANDEM_EW_CASE(PowGradA) TANDEM_EW_CASE(PowGradB) TANDEM_EW_CASE(MaxGradA)
      TANDEM_EW_CASE(MaxGradB) TANDEM_EW_CASE(PreluGradX)
      default: break;
    }
  }
#undef TANDEM_EW_CASE
  TANDEM_CHECK(false, op_name(op), ": integer operands are not supported (use a floating dtype)");
}

}  // namespace tandem::backend::ewf
