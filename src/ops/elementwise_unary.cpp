// One-operand elementwise ops: math functions, rounding and activations. Each is one backend functor
// forward and one backward (from the op's output or input, backend::grad_from_output), read in place
// through the operand's strides.
#include <cmath>

#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using backend::EwArgs;
using backend::Unary;
using namespace ops;

namespace {

Tensor unary_op(const Tensor& x, Unary op, const char* name, const EwArgs& args = {}) {
  check_floating(x, name, "input");
  Tensor y = unary_raw(op, x, args);
  if (backend::grad_is_zero(op)) {
    return record_op(y, {x}, name, [shape = x.shape(), dt = x.dtype(), dev = x.device()](const Tensor&) {
      return std::vector<Tensor>{Tensor::zeros(shape, dt, dev)};
    });
  }
  Tensor saved = backend::grad_from_output(op) ? y.detach() : x.detach();  // data, not the graph node
  return record_op(y, {x}, name, [op, saved, args](const Tensor& g) {
    return std::vector<Tensor>{unary_grad_raw(op, g, saved, args)};
  });
}

}  // namespace

Tensor exp(const Tensor& x) { return unary_op(x, Unary::Exp, "exp"); }
Tensor log(const Tensor& x) { return unary_op(x, Unary::Log, "log"); }
Tensor sqrt(const Tensor& x) { return unary_op(x, Unary::Sqrt, "sqrt"); }
Tensor reciprocal(const Tensor& x) { return unary_op(x, Unary::Reciprocal, "reciprocal"); }
Tensor abs(const Tensor& x) { return unary_op(x, Unary::Abs, "abs"); }
Tensor neg(const Tensor& x) { return unary_op(x, Unary::Neg, "neg"); }
Tensor sign(const Tensor& x) { return unary_op(x, Unary::Sign, "sign"); }
Tensor erf(const Tensor& x) { return unary_op(x, Unary::Erf, "erf"); }
Tensor sin(const Tensor& x) { return unary_op(x, Unary::Sin, "sin"); }
Tensor cos(const Tensor& x) { return unary_op(x, Unary::Cos, "cos"); }
Tensor tan(const Tensor& x) { return unary_op(x, Unary::Tan, "tan"); }
Tensor asin(const Tensor& x) { return unary_op(x, Unary::Asin, "asin"); }
Tensor acos(const Tensor& x) { return unary_op(x, Unary::Acos, "acos"); }
Tensor atan(const Tensor& x) { return unary_op(x, Unary::Atan, "atan"); }
Tensor sinh(const Tensor& x) { return unary_op(x, Unary::Sinh, "sinh"); }
Tensor cosh(const Tensor& x) { return unary_op(x, Unary::Cosh, "cosh"); }
Tensor asinh(const Tensor& x) { return unary_op(x, Unary::Asinh, "asinh"); }
Tensor acosh(const Tensor& x) { return unary_op(x, Unary::Acosh, "acosh"); }
Tensor atanh(const Tensor& x) { return unary_op(x, Unary::Atanh, "atanh"); }
Tensor ceil(const Tensor& x) { return unary_op(x, Unary::Ceil, "ceil"); }
Tensor floor(const Tensor& x) { return unary_op(x, Unary::Floor, "floor"); }
Tensor round(const Tensor& x) { return unary_op(x, Unary::Round, "round"); }
Tensor rounde(const Tensor& x) { return unary_op(x, Unary::RoundEven, "rounde"); }
Tensor relu(const Tensor& x) { return unary_op(x, Unary::Relu, "relu"); }
Tensor sigmoid(const Tensor& x) { return unary_op(x, Unary::Sigmoid, "sigmoid"); }
Tensor tanh(const Tensor& x) { return unary_op(x, Unary::Tanh, "tanh"); }
Tensor softplus(const Tensor& x) { return unary_op(x, Unary::Softplus, "softplus"); }
Tensor softsign(const Tensor& x) { return unary_op(x, Unary::Softsign, "softsign"); }
Tensor silu(const Tensor& x) { return unary_op(x, Unary::Silu, "silu"); }

Tensor leaky_relu(const Tensor& x, double alpha) {
  TANDEM_CHECK(std::isfinite(alpha), "leaky_relu: the slope must be finite, got ", alpha);
  return unary_op(x, Unary::LeakyRelu, "leaky_relu", {alpha, 0.0});
}

Tensor elu(const Tensor& x, double alpha) {
  TANDEM_CHECK(std::isfinite(alpha), "elu: alpha must be finite, got ", alpha);
  return unary_op(x, Unary::Elu, "elu", {alpha, 0.0});
}

Tensor selu(const Tensor& x, double alpha, double scale) {
  TANDEM_CHECK(std::isfinite(alpha) && std::isfinite(scale), "selu: alpha and scale must be finite, got ", alpha,
               " and ", scale);
  return unary_op(x, Unary::Selu, "selu", {alpha, scale});
}

Tensor hard_sigmoid(const Tensor& x, double alpha, double beta) {
  TANDEM_CHECK(std::isfinite(alpha) && std::isfinite(beta), "hard_sigmoid: alpha and beta must be finite, got ",
               alpha, " and ", beta);
  return unary_op(x, Unary::HardSigmoid, "hard_sigmoid", {alpha, beta});
}

Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return tanh_approximation ? unary_op(x, Unary::GeluTanh, "gelu") : unary_op(x, Unary::GeluErf, "gelu");
}

Tensor clip(const Tensor& x, double lo, double hi) {
  TANDEM_CHECK(!std::isnan(lo) && !std::isnan(hi), "clip: the bounds must not be NaN, got [", lo, ", ", hi, "]");
  return unary_op(x, Unary::Clip, "clip", {lo, hi});
}

Tensor pow(const Tensor& x, double p) { return unary_op(x, Unary::PowScalar, "pow", {p, 0.0}); }

Tensor pow(double s, const Tensor& x) { return unary_op(x, Unary::ScalarPow, "pow", {s, 0.0}); }

}  // namespace tandem
