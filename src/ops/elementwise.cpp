// Elementwise ops of two or three operands (broadcast as NumPy's are, read in place through their
// strides), comparisons and logical masks, scalar arithmetic and bias addition. One-operand math and
// activations are in elementwise_unary.cpp.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using backend::Binary;
using backend::Ternary;
using backend::Unary;
using namespace ops;

namespace {

// Checks the operands of an elementwise op (defined, one device, one dtype) and returns the shape they
// broadcast to.
Shape operand_shape(const Tensor& a, const Tensor& b, const char* op) {
  check_defined(a, op, "first operand");
  check_defined(b, op, "second operand");
  TANDEM_CHECK(a.device() == b.device(), op, ": operands on different devices (", a.str(), " and ", b.str(), ")");
  TANDEM_CHECK(a.dtype() == b.dtype(), op, ": operands of different dtypes (", a.str(), " and ", b.str(), ")");
  return a.shape() == b.shape() ? a.shape() : broadcast_shape(a, b, op);
}

Shape floating_operand_shape(const Tensor& a, const Tensor& b, const char* op) {
  const Shape s = operand_shape(a, b, op);
  TANDEM_CHECK(is_floating(a.dtype()), op, ": operands must be floating tensors, got ", a.str(), " and ", b.str());
  return s;
}

// The incoming gradient in the op's dtype.
Tensor in_dtype(const Tensor& g, DType dt) { return g.dtype() == dt ? g : g.to(dt); }

// What an operand that needs a gradient saves: its value, cut off from the graph.
Tensor saved_if(bool needed, const Tensor& t) { return needed ? t.detach() : Tensor(); }

// Records a two-operand op whose backward gives each operand's gradient in the output's shape
// (grads(g)), summed back over what broadcasting stretched.
template <typename F>
Tensor record_binary(Tensor y, const Tensor& a, const Tensor& b, const char* name, F grads) {
  return record_op(y, {a, b}, name,
                   [grads, sa = a.shape(), sb = b.shape(), dt = y.dtype(), na = a.requires_grad(),
                    nb = b.requires_grad()](const Tensor& g) {
                     auto [da, db] = grads(in_dtype(g, dt), na, nb);
                     return std::vector<Tensor>{da.defined() ? sum_to_raw(da, sa) : Tensor(),
                                                db.defined() ? sum_to_raw(db, sb) : Tensor()};
                   });
}

struct Grads {
  Tensor a, b;
};

Tensor scalar_like(double v, const Tensor& t) { return Tensor::full({}, v, t.dtype(), t.device()); }
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  const Shape s = operand_shape(a, b, "add");
  return record_binary(binary_raw(Binary::Add, a, b, s), a, b, "add",
                       [](const Tensor& g, bool, bool) { return Grads{g, g}; });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  const Shape s = operand_shape(a, b, "sub");
  return record_binary(binary_raw(Binary::Sub, a, b, s), a, b, "sub", [](const Tensor& g, bool, bool nb) {
    return Grads{g, nb ? unary_raw(Unary::Neg, g) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  const Shape s = operand_shape(a, b, "mul");
  Tensor sa = saved_if(b.requires_grad(), a), sb = saved_if(a.requires_grad(), b);
  return record_binary(binary_raw(Binary::Mul, a, b, s), a, b, "mul", [sa, sb, s](const Tensor& g, bool na, bool nb) {
    return Grads{na ? binary_raw(Binary::Mul, g, sb, s) : Tensor(), nb ? binary_raw(Binary::Mul, g, sa, s) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  const Shape s = operand_shape(a, b, "div");
  Tensor sa = saved_if(b.requires_grad(), a), sb = b.detach();
  return record_binary(binary_raw(Binary::Div, a, b, s), a, b, "div", [sa, sb, s](const Tensor& g, bool na, bool nb) {
    // d(a/b)/db = -a / b^2
    return Grads{na ? binary_raw(Binary::Div, g, sb, s) : Tensor(),
                 nb ? ternary_raw(Ternary::DivGradB, g, sa, sb, s) : Tensor()};
  });
}

Tensor pow(const Tensor& a, const Tensor& b) {
  const Shape s = floating_operand_shape(a, b, "pow");
  Tensor sa = a.detach(), sb = b.detach();
  return record_binary(binary_raw(Binary::Pow, a, b, s), a, b, "pow", [sa, sb, s](const Tensor& g, bool na, bool nb) {
    return Grads{na ? ternary_raw(Ternary::PowGradA, g, sa, sb, s) : Tensor(),
                 nb ? ternary_raw(Ternary::PowGradB, g, sa, sb, s) : Tensor()};
  });
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  const Shape s = operand_shape(a, b, "maximum");
  Tensor sa = a.detach(), sb = b.detach();
  return record_binary(binary_raw(Binary::Max, a, b, s), a, b, "maximum",
                       [sa, sb, s](const Tensor& g, bool na, bool nb) {
                         return Grads{na ? ternary_raw(Ternary::MaxGradA, g, sa, sb, s) : Tensor(),
                                      nb ? ternary_raw(Ternary::MaxGradB, g, sa, sb, s) : Tensor()};
                       });
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  const Shape s = operand_shape(a, b, "minimum");
  Tensor sa = a.detach(), sb = b.detach();
  // min(a, b)'s gradient for a is max's for its second operand, and the other way round.
  return record_binary(binary_raw(Binary::Min, a, b, s), a, b, "minimum",
                       [sa, sb, s](const Tensor& g, bool na, bool nb) {
                         return Grads{na ? ternary_raw(Ternary::MaxGradB, g, sa, sb, s) : Tensor(),
                                      nb ? ternary_raw(Ternary::MaxGradA, g, sa, sb, s) : Tensor()};
                       });
}

Tensor prelu(const Tensor& x, const Tensor& slope) {
  const Shape s = floating_operand_shape(x, slope, "prelu");
  Tensor sx = x.detach(), ss = saved_if(x.requires_grad(), slope);
  return record_binary(binary_raw(Binary::Prelu, x, slope, s), x, slope, "prelu",
                       [sx, ss, s](const Tensor& g, bool nx, bool ns) {
                         return Grads{nx ? ternary_raw(Ternary::PreluGradX, g, sx, ss, s) : Tensor(),
                                      ns ? binary_raw(Binary::PreluGradSlope, g, sx, s) : Tensor()};
                       });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "condition");
  const Shape ab = operand_shape(a, b, "where");
  TANDEM_CHECK(cond.device() == a.device(), "where: the condition ", cond.str(), " and the operands ", a.str(),
               " are on different devices");
  Tensor c = (cond.dtype() == a.dtype() ? cond : cond.to(a.dtype())).detach();
  Shape s = ab;
  if (c.shape() != ab) {  // the condition broadcast with the operands' shape
    const Shape& cs = c.shape();
    s.assign(std::max(cs.size(), ab.size()), 1);
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t dc = i < cs.size() ? cs[cs.size() - 1 - i] : 1, dab = i < ab.size() ? ab[ab.size() - 1 - i] : 1;
      TANDEM_CHECK(dc == dab || dc == 1 || dab == 1, "where: the condition ", cond.str(), " does not broadcast with ",
                   "the operands ", a.str(), " and ", b.str(), ": extents ", dc, " and ", dab, " differ and neither is 1 ",
                   "(dimension ", i, " from the right, axis ", static_cast<int64_t>(s.size() - 1 - i), " of the result)");
      s[s.size() - 1 - i] = dc == 1 ? dab : dc;
    }
  }
  Tensor y = ternary_raw(Ternary::Where, c, a, b, s);
  if (!is_floating(a.dtype())) return y;
  return record_binary(y, a, b, "where", [c, s](const Tensor& g, bool na, bool nb) {
    const Tensor zero = scalar_like(0.0, g);
    return Grads{na ? ternary_raw(Ternary::Where, c, g, zero, s) : Tensor(),
                 nb ? ternary_raw(Ternary::Where, c, zero, g, s) : Tensor()};
  });
}

Tensor compare(const Tensor& a, const Tensor& b, Comparison op) {
  static constexpr const char* names[] = {"greater", "greater_equal", "less", "less_equal", "equal", "not_equal"};
  static constexpr Binary kernels[] = {Binary::Gt, Binary::Ge, Binary::Lt, Binary::Le, Binary::Eq, Binary::Ne};
  const int k = static_cast<int>(op);
  TANDEM_CHECK(k >= 0 && k < 6, "compare: unknown comparison ", k);
  const Shape s = operand_shape(a, b, names[k]);
  return binary_raw(kernels[k], a, b, s);
}

Tensor less(const Tensor& a, const Tensor& b) { return compare(a, b, Comparison::Less); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return compare(a, b, Comparison::LessEqual); }
Tensor greater(const Tensor& a, const Tensor& b) { return compare(a, b, Comparison::Greater); }
Tensor greater_equal(const Tensor& a, const Tensor& b) { return compare(a, b, Comparison::GreaterEqual); }
Tensor equal(const Tensor& a, const Tensor& b) { return compare(a, b, Comparison::Equal); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return compare(a, b, Comparison::NotEqual); }

namespace {
Tensor compare_number(const Tensor& a, double v, Comparison op, const char* name) {
  check_defined(a, name, "first operand");
  return compare(a, scalar_like(v, a), op);
}
}  // namespace

Tensor less(const Tensor& a, double b) { return compare_number(a, b, Comparison::Less, "less"); }
Tensor less_equal(const Tensor& a, double b) { return compare_number(a, b, Comparison::LessEqual, "less_equal"); }
Tensor greater(const Tensor& a, double b) { return compare_number(a, b, Comparison::Greater, "greater"); }
Tensor greater_equal(const Tensor& a, double b) {
  return compare_number(a, b, Comparison::GreaterEqual, "greater_equal");
}
Tensor equal(const Tensor& a, double b) { return compare_number(a, b, Comparison::Equal, "equal"); }
Tensor not_equal(const Tensor& a, double b) { return compare_number(a, b, Comparison::NotEqual, "not_equal"); }

Tensor logical_and(const Tensor& a, const Tensor& b) {
  return binary_raw(Binary::And, a, b, operand_shape(a, b, "logical_and"));
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return binary_raw(Binary::Or, a, b, operand_shape(a, b, "logical_or"));
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  return binary_raw(Binary::Xor, a, b, operand_shape(a, b, "logical_xor"));
}
Tensor logical_not(const Tensor& x) {
  check_floating(x, "logical_not", "input");
  return unary_raw(Unary::Not, x);
}

Tensor scale(const Tensor& a, double s) {
  check_floating(a, "scale", "input");
  return record_op(affine_raw(a, s, 0.0), {a}, "scale",
                   [s, dt = a.dtype()](const Tensor& g) { return std::vector<Tensor>{affine_raw(in_dtype(g, dt), s, 0.0)}; });
}

Tensor add_scalar(const Tensor& a, double s) {
  check_floating(a, "add_scalar", "input");
  return record_op(affine_raw(a, 1.0, s), {a}, "add_scalar",
                   [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "cast", "input");
  Tensor y = x.dtype() == dtype ? x.detach() : x.detach().to(dtype);
  if (!is_floating(dtype) || !is_floating(x.dtype())) return y;
  return record_op(y, {x}, "cast", [from = x.dtype()](const Tensor& g) { return std::vector<Tensor>{in_dtype(g, from)}; });
}

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
