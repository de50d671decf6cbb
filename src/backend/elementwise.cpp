// Names of the elementwise ops and the iteration geometry the backends' elementwise kernels share.
#include "backend/elementwise.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor_impl.h"
#include "tandem/error.h"

namespace tandem::backend {

const char* op_name(Binary op) {
  switch (op) {
    case Binary::Add: return "add";
    case Binary::Sub: return "sub";
    case Binary::Mul: return "mul";
    case Binary::Div: return "div";
    case Binary::Max: return "maximum";
    case Binary::Min: return "minimum";
    case Binary::Gt: return "greater";
    case Binary::Ge: return "greater_equal";
    case Binary::Lt: return "less";
    case Binary::Le: return "less_equal";
    case Binary::Eq: return "equal";
    case Binary::Ne: return "not_equal";
    case Binary::Pow: return "pow";
    case Binary::And: return "logical_and";
    case Binary::Or: return "logical_or";
    case Binary::Xor: return "logical_xor";
    case Binary::Prelu: return "prelu";
    case Binary::PreluGradSlope: return "prelu_backward_slope";
  }
  return "binary";
}

const char* op_name(Unary op) {
  switch (op) {
    case Unary::Neg: return "neg";
    case Unary::Relu: return "relu";
    case Unary::Sigmoid: return "sigmoid";
    case Unary::Tanh: return "tanh";
    case Unary::Exp: return "exp";
    case Unary::Log: return "log";
    case Unary::Abs: return "abs";
    case Unary::Sqrt: return "sqrt";
    case Unary::Reciprocal: return "reciprocal";
    case Unary::Sign: return "sign";
    case Unary::Erf: return "erf";
    case Unary::Sin: return "sin";
    case Unary::Cos: return "cos";
    case Unary::Tan: return "tan";
    case Unary::Asin: return "asin";
    case Unary::Acos: return "acos";
    case Unary::Atan: return "atan";
    case Unary::Sinh: return "sinh";
    case Unary::Cosh: return "cosh";
    case Unary::Asinh: return "asinh";
    case Unary::Acosh: return "acosh";
    case Unary::Atanh: return "atanh";
    case Unary::Ceil: return "ceil";
    case Unary::Floor: return "floor";
    case Unary::Round: return "round";
    case Unary::RoundEven: return "rounde";
    case Unary::LeakyRelu: return "leaky_relu";
    case Unary::Elu: return "elu";
    case Unary::Selu: return "selu";
    case Unary::Softplus: return "softplus";
    case Unary::Softsign: return "softsign";
    case Unary::HardSigmoid: return "hard_sigmoid";
    case Unary::GeluErf: return "gelu";
    case Unary::GeluTanh: return "gelu_tanh";
    case Unary::Silu: return "silu";
    case Unary::Clip: return "clip";
    case Unary::PowScalar: return "pow_scalar";
    case Unary::ScalarPow: return "scalar_pow";
    case Unary::Not: return "logical_not";
    case Unary::Affine: return "affine";
  }
  return "unary";
}

const char* op_name(Ternary op) {
  switch (op) {
    case Ternary::Where: return "where";
    case Ternary::DivGradB: return "div_backward_divisor";
    case Ternary::PowGradA: return "pow_backward_base";
    case Ternary::PowGradB: return "pow_backward_exponent";
    case Ternary::MaxGradA: return "maximum_backward_first";
    case Ternary::MaxGradB: return "maximum_backward_second";
    case Ternary::PreluGradX: return "prelu_backward";
  }
  return "ternary";
}

const char* backward_name(Unary op) {
  constexpr int count = static_cast<int>(Unary::Affine) + 1;
  static const std::array<std::string, count> names = [] {
    std::array<std::string, count> n;
    for (int i = 0; i < count; ++i) n[i] = std::string(op_name(static_cast<Unary>(i))) + "_backward";
    return n;
  }();
  const int i = static_cast<int>(op);
  return i >= 0 && i < count ? names[i].c_str() : "unary_backward";
}

namespace ew {

bool make_geometry(const Tensor& out, std::span<const Tensor* const> operands, Geometry& g) {
  const Shape& shape = out.shape();
  const int nd = static_cast<int>(shape.size());
  const int nargs = static_cast<int>(operands.size());
  TANDEM_ASSERT(nargs >= 1 && nargs < kMaxArgs, "elementwise kernel with ", nargs, " operands");
  g = Geometry{};
  g.nargs = nargs;
  g.numel = out.numel();
  if (g.numel == 0) return true;
  if (out.is_contiguous()) {  // the common case: contiguous operands of out's shape, or single elements
    bool flat = true;
    for (const Tensor* t : operands) flat = flat && ((t->shape() == shape && t->is_contiguous()) || t->numel() == 1);
    if (flat) {
      g.ndim = 1;
      g.sizes[0] = g.numel;
      int k = 0;
      for (const Tensor* t : operands) g.strides[k++][0] = t->numel() == 1 && g.numel != 1 ? 0 : 1;
      return true;
    }
  }

  // Each operand's strides over out's dimensions (0 where it is broadcast).
  std::vector<std::array<int64_t, kMaxArgs - 1>> st(static_cast<size_t>(nd));
  const Shape out_contig = [&] {
    Shape s(static_cast<size_t>(nd));
    int64_t acc = 1;
    for (int d = nd; d-- > 0;) {
      s[d] = acc;
      acc *= shape[d];
    }
    return s;
  }();
  int k = 0;
  for (const Tensor* t : operands) {
    const Shape& ts = t->shape();
    if (ts == shape) {
      for (int d = 0; d < nd; ++d) st[d][k] = t->strides()[d];
    } else if (t->numel() == g.numel && t->is_contiguous() && out.is_contiguous()) {
      for (int d = 0; d < nd; ++d) st[d][k] = out_contig[d];
    } else {
      const int tn = static_cast<int>(ts.size());
      TANDEM_ASSERT(tn <= nd, "elementwise operand ", t->str(), " has more dimensions than the output ", out.str());
      for (int d = 0; d < nd; ++d) {
        const int td = d - (nd - tn);
        if (td < 0 || ts[td] == 1) {
          st[d][k] = 0;
        } else {
          TANDEM_ASSERT(ts[td] == shape[d], "elementwise operand ", t->str(), " does not broadcast to ", out.str());
          st[d][k] = t->strides()[td];
        }
      }
    }
    ++k;
  }

  // Out's dimensions of extent > 1, outermost in storage first.
  std::vector<int> order;
  for (int d = 0; d < nd; ++d)
    if (shape[d] != 1) order.push_back(d);
  const Shape& os = out.strides();
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return os[a] > os[b]; });
  {
    int64_t expect = 1;
    for (size_t i = order.size(); i-- > 0;) {
      TANDEM_ASSERT(os[order[i]] == expect, "elementwise output ", out.str(), " is not dense");
      expect *= shape[order[i]];
    }
  }
  if (order.empty()) {  // one element
    g.ndim = 1;
    g.sizes[0] = 1;
    return true;
  }
  // Merge a dimension into the one outside it when every operand steps through both as through one.
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, kMaxArgs - 1>> strides;
  for (int d : order) {
    if (!sizes.empty()) {
      bool merge = true;
      for (int a = 0; a < nargs && merge; ++a) merge = strides.back()[a] == st[d][a] * shape[d];
      if (merge) {
        sizes.back() *= shape[d];
        strides.back() = st[d];
        continue;
      }
    }
    sizes.push_back(shape[d]);
    strides.push_back(st[d]);
  }
  if (sizes.size() > static_cast<size_t>(kMaxDims)) return false;
  g.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < g.ndim; ++d) {
    g.sizes[d] = sizes[d];
    for (int a = 0; a < nargs; ++a) g.strides[a][d] = strides[d][a];
  }
  return true;
}

Tensor broadcast_copy(const Tensor& t, const Tensor& out) {
  TANDEM_ASSERT(out.is_contiguous(), "elementwise output ", out.str(), " of more than ", kMaxDims,
                " dimensions must be contiguous");
  const Shape& shape = out.shape();
  const size_t nd = shape.size(), tn = t.dim();
  Shape strides(nd, 0);
  if (t.numel() == out.numel() && t.shape() != shape) return t.contiguous().view(shape);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t td = static_cast<int64_t>(d) - static_cast<int64_t>(nd - tn);
    if (td >= 0 && t.shape()[td] != 1) strides[d] = t.strides()[td];
  }
  Tensor dst = Tensor::empty(shape, t.dtype(), t.device());
  if (dst.numel()) backend_for(t.device()).copy_strided(as_strided(t, shape, strides, t.storage_offset()), dst);
  return dst;
}

}  // namespace ew

}  // namespace tandem::backend
