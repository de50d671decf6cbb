// Elementwise ops (operands broadcast as NumPy's are), comparisons and bias addition.
#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using backend::Binary;
using backend::Unary;
using namespace ops;

namespace {
// Operands of different shapes are stretched to their common shape (each expansion recorded, so that
// an operand's gradient is summed back to its shape); returns false when they already agree.
bool broadcast_operands(const Tensor& a, const Tensor& b, const char* op, Tensor& ea, Tensor& eb) {
  check_defined(a, op, "first operand");
  check_defined(b, op, "second operand");
  if (a.shape() == b.shape()) {
    check_same(a, b, op);
    return false;
  }
  TANDEM_CHECK(a.device() == b.device(), op, ": operands on different devices (", a.str(), " and ", b.str(), ")");
  TANDEM_CHECK(a.dtype() == b.dtype(), op, ": operands of different dtypes (", a.str(), " and ", b.str(), ")");
  const Shape s = broadcast_shape(a, b, op);
  ea = expand(a, s);
  eb = expand(b, s);
  return true;
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  if (Tensor ea, eb; broadcast_operands(a, b, "add", ea, eb)) return add(ea, eb);
  return record_op(binary_raw(Binary::Add, a, b), {a, b}, "add",
                   [](const Tensor& g) { return std::vector<Tensor>{g, g}; });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (Tensor ea, eb; broadcast_operands(a, b, "sub", ea, eb)) return sub(ea, eb);
  return record_op(binary_raw(Binary::Sub, a, b), {a, b}, "sub",
                   [](const Tensor& g) { return std::vector<Tensor>{g, affine_raw(g, -1.0, 0.0)}; });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (Tensor ea, eb; broadcast_operands(a, b, "mul", ea, eb)) return mul(ea, eb);
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  Tensor sa = need_b ? a.detach() : Tensor(), sb = need_a ? b.detach() : Tensor();
  return record_op(binary_raw(Binary::Mul, a, b), {a, b}, "mul", [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{sb.defined() ? binary_raw(Binary::Mul, g, sb) : Tensor(),
                               sa.defined() ? binary_raw(Binary::Mul, g, sa) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (Tensor ea, eb; broadcast_operands(a, b, "div", ea, eb)) return div(ea, eb);
  bool need_b = b.requires_grad();
  Tensor sa = need_b ? a.detach() : Tensor(), sb = b.detach();
  return record_op(binary_raw(Binary::Div, a, b), {a, b}, "div", [sa, sb](const Tensor& g) {
    Tensor da = binary_raw(Binary::Div, g, sb);
    // d(a/b)/db = -(a/b)/b: -g * a / b^2
    Tensor db = sa.defined() ? affine_raw(binary_raw(Binary::Div, binary_raw(Binary::Mul, da, sa), sb), -1.0, 0.0)
                             : Tensor();
    return std::vector<Tensor>{da, db};
  });
}

Tensor exp(const Tensor& x) {
  check_floating(x, "exp", "input");
  Tensor y = unary_raw(Unary::Exp, x);
  Tensor saved = y.detach();
  return record_op(y, {x}, "exp",
                   [saved](const Tensor& g) { return std::vector<Tensor>{binary_raw(Binary::Mul, g, saved)}; });
}

Tensor log(const Tensor& x) {
  check_floating(x, "log", "input");
  Tensor saved = x.detach();
  return record_op(unary_raw(Unary::Log, x), {x}, "log",
                   [saved](const Tensor& g) { return std::vector<Tensor>{binary_raw(Binary::Div, g, saved)}; });
}

Tensor compare(const Tensor& a, const Tensor& b, Comparison op) {
  static constexpr const char* names[] = {"greater", "greater_equal", "less", "less_equal", "equal"};
  static constexpr Binary kernels[] = {Binary::Gt, Binary::Ge, Binary::Lt, Binary::Le, Binary::Eq};
  const int k = static_cast<int>(op);
  TANDEM_CHECK(k >= 0 && k < 5, "compare: unknown comparison ", k);
  check_defined(a, names[k], "first operand");
  check_defined(b, names[k], "second operand");
  if (a.shape() == b.shape()) {
    check_same(a, b, names[k]);
    return binary_raw(kernels[k], a, b);
  }
  TANDEM_CHECK(a.device() == b.device(), names[k], ": operands on different devices (", a.str(), " and ", b.str(), ")");
  TANDEM_CHECK(a.dtype() == b.dtype(), names[k], ": operands of different dtypes (", a.str(), " and ", b.str(), ")");
  const Shape s = broadcast_shape(a, b, names[k]);
  return binary_raw(kernels[k], expand_raw(a, s), expand_raw(b, s));
}

Tensor scale(const Tensor& a, double s) {
  check_floating(a, "scale", "input");
  return record_op(affine_raw(a, s, 0.0), {a}, "scale",
                   [s](const Tensor& g) { return std::vector<Tensor>{affine_raw(g, s, 0.0)}; });
}

Tensor add_scalar(const Tensor& a, double s) {
  check_floating(a, "add_scalar", "input");
  return record_op(affine_raw(a, 1.0, s), {a}, "add_scalar",
                   [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

namespace {
Tensor activation(const Tensor& x, Unary op, const char* name) {
  check_floating(x, name, "input");
  Tensor y = unary_raw(op, x);
  Tensor saved = y.detach();  // the output, not the graph node that owns it
  return record_op(y, {x}, name, [op, saved](const Tensor& g) {
    Tensor gc = to_dense(g, saved.dtype(), strictly_channels_last(saved));
    Tensor dx = empty_dense_like(gc);
    be(gc).unary_backward(op, gc, saved, dx);
    return std::vector<Tensor>{dx};
  });
}
}  // namespace

Tensor relu(const Tensor& x) { return activation(x, Unary::Relu, "relu"); }
Tensor sigmoid(const Tensor& x) { return activation(x, Unary::Sigmoid, "sigmoid"); }
Tensor tanh(const Tensor& x) { return activation(x, Unary::Tanh, "tanh"); }

Tensor bias_add(const Tensor& x, const Tensor& b) {
  check_floating(x, "bias_add", "input");
  check_dim(b, 1, "bias_add", "bias");
  TANDEM_CHECK(x.dim() >= 2 && x.size(1) == b.size(0), "bias_add: bias ", b.str(), " does not match dimension 1 of ",
               x.str());
  TANDEM_CHECK(x.dtype() == b.dtype(), "bias_add: input ", x.str(), " and bias ", b.str(), " differ in dtype");
  check_same_device(x, b, "bias_add");
  Tensor xc = x.contiguous();
  int64_t n = x.size(0), c = x.size(1), s = c ? x.numel() / (n * c) : 0;
  Tensor y = empty_like(xc);
  if (y.numel()) be(x).bias_add(xc, b.contiguous(), n, c, s, y);
  return record_op(y, {x, b}, "bias_add", [n, c, s, need_b = b.requires_grad()](const Tensor& g) {
    Tensor db;
    if (need_b) {
      db = grad_buffer(1, {c}, g.dtype(), g.device());
      be(g).bias_grad(g.contiguous(), n, c, s, db);
    }
    return std::vector<Tensor>{g, db};
  });
}

}  // namespace tandem

namespace tandem {

void add_into(Tensor& acc, const Tensor& x) {
  TANDEM_CHECK(acc.dtype() == x.dtype() && acc.device() == x.device() && acc.numel() == x.numel(),
               "add_into: ", acc.str(), " += ", x.str(), " needs the same dtype, device and element count");
  TANDEM_CHECK(acc.is_contiguous(), "add_into: the running sum ", acc.str(), " must be contiguous");
  Tensor xs = (x.is_contiguous() ? x : x.contiguous()).view(acc.shape());
  if (acc.numel()) be(acc).binary(backend::Binary::Add, acc, xs, acc);
}

}  // namespace tandem
