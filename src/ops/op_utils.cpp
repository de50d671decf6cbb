#include "ops/op_utils.h"

#include <algorithm>
#include <numeric>

#include "autograd/column_sums.h"
#include "core/tensor_impl.h"
#include "ops/layout.h"

namespace tandem::ops {

void check_defined(const Tensor& t, const char* op, const char* what) {
  TANDEM_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

void check_floating(const Tensor& t, const char* op, const char* what) {
  check_defined(t, op, what);
  TANDEM_CHECK(is_floating(t.dtype()), op, ": ", what, " must be a floating tensor, got ", t.str());
}

void check_same(const Tensor& a, const Tensor& b, const char* op) {
  check_defined(a, op, "first operand");
  check_defined(b, op, "second operand");
  TANDEM_CHECK(a.device() == b.device(), op, ": operands on different devices (", a.str(), " and ", b.str(), ")");
  TANDEM_CHECK(a.dtype() == b.dtype(), op, ": operands of different dtypes (", a.str(), " and ", b.str(), ")");
  TANDEM_CHECK(a.shape() == b.shape(), op, ": operands of different shapes (", a.str(), " and ", b.str(), ")");
}

void check_dim(const Tensor& t, int64_t dim, const char* op, const char* what) {
  check_defined(t, op, what);
  TANDEM_CHECK(t.dim() == dim, op, ": ", what, " must have ", dim, " dimensions, got ", t.str());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  TANDEM_CHECK(a.device() == b.device(), op, ": tensors on different devices (", a.str(), " and ", b.str(), ")");
}

Tensor ew_output(const Shape& shape, DType dtype, Device device, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    if (t->shape() == shape && strictly_channels_last(*t)) return empty_channels_last(shape, dtype, device);
  return Tensor::empty(shape, dtype, device);
}

// The kernels read operands through their strides (broadcast ones with stride 0) and write a dense
// output: channels-last when an operand of the output's shape is, else contiguous.
Tensor binary_raw(backend::Binary op, const Tensor& a, const Tensor& b, const Shape& shape) {
  Tensor out = ew_output(shape, a.dtype(), a.device(), {&a, &b});
  if (out.numel()) be(a).binary(op, a, b, out);
  return out;
}

namespace {
bool broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const int64_t da = a[a.size() - 1 - i], db = b[b.size() - 1 - i];
    if (da != db && da != 1 && db != 1) return false;
  }
  return true;
}
}  // namespace

Tensor binary_raw(backend::Binary op, const Tensor& a, const Tensor& b) {
  if (a.shape() == b.shape()) return binary_raw(op, a, b, a.shape());
  // Shapes that do not broadcast but hold as many elements: one tensor's gradients in two shapes, flat.
  if (!broadcastable(a.shape(), b.shape()) && a.numel() == b.numel())
    return binary_raw(op, a, b.contiguous().view(a.shape()), a.shape());
  return binary_raw(op, a, b, broadcast_shape(a, b, backend::op_name(op)));
}

Tensor ternary_raw(backend::Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, const Shape& shape) {
  Tensor out = ew_output(shape, b.dtype(), b.device(), {&a, &b, &c});
  if (out.numel()) be(b).ternary(op, a, b, c, out);
  return out;
}

Tensor unary_raw(backend::Unary op, const Tensor& a, const backend::EwArgs& args) {
  Tensor out = ew_output(a.shape(), a.dtype(), a.device(), {&a});
  if (out.numel()) be(a).unary(op, a, out, args);
  return out;
}

Tensor unary_grad_raw(backend::Unary op, const Tensor& g, const Tensor& saved, const backend::EwArgs& args) {
  const Tensor gd = g.dtype() == saved.dtype() ? g : g.to(saved.dtype());
  Tensor out = ew_output(saved.shape(), saved.dtype(), saved.device(), {&saved, &gd});
  if (out.numel()) be(saved).unary_backward(op, gd, saved, out, args);
  return out;
}

Tensor affine_raw(const Tensor& a, double alpha, double beta) {
  Tensor out = ew_output(a.shape(), a.dtype(), a.device(), {&a});
  if (out.numel()) be(a).affine(a, alpha, beta, out);
  return out;
}

Tensor grad_buffer(size_t i, const Shape& shape, DType dtype, Device device) {
  Tensor d = grad_destination(i);
  if (d.defined() && d.shape() == shape && d.dtype() == dtype && d.device() == device && d.is_contiguous()) return d;
  return Tensor::empty(shape, dtype, device);
}

void bias_grad_of(const Tensor& g, int64_t n, int64_t c, Tensor& db) {
  if (!db.defined()) return;
  Tensor sums = column_sums_of(g, c);
  if (sums.defined() && g.numel() == n * c)
    db.copy_(sums);
  else
    be(g).bias_grad(g, n, c, 1, db);
}

Tensor gemm_raw(bool ta, bool tb, const Tensor& a, const Tensor& b, Tensor out) {
  Tensor ac = a.contiguous(), bc = b.contiguous();
  int64_t m = ta ? ac.size(1) : ac.size(0);
  int64_t k = ta ? ac.size(0) : ac.size(1);
  int64_t kb = tb ? bc.size(1) : bc.size(0);
  int64_t n = tb ? bc.size(0) : bc.size(1);
  TANDEM_CHECK(k == kb, "matmul: inner dimensions differ (", ac.str(), ta ? " transposed" : "", " and ", bc.str(),
               tb ? " transposed" : "", ")");
  if (!out.defined()) out = Tensor::empty({m, n}, ac.dtype(), ac.device());
  TANDEM_ASSERT(out.shape() == Shape({m, n}) && out.dtype() == ac.dtype() && out.is_contiguous(), "matmul into ",
                out.str());
  if (out.numel()) be(a).gemm(ta, tb, m, n, k, 1.0, ac, bc, 0.0, out);
  return out;
}

Tensor broadcast_scalar(const Tensor& s, const Shape& shape) {
  Tensor out = Tensor::zeros(shape, s.dtype(), s.device());
  int64_t n = out.numel();
  if (n) be(s).bias_add(out, s.contiguous().view({1}), 1, 1, n, out);
  return out;
}

Shape broadcast_shape(const Tensor& a, const Tensor& b, const char* op) {
  const Shape &sa = a.shape(), &sb = b.shape();
  const size_t n = std::max(sa.size(), sb.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {  // from the right
    const int64_t da = i < sa.size() ? sa[sa.size() - 1 - i] : 1, db = i < sb.size() ? sb[sb.size() - 1 - i] : 1;
    TANDEM_CHECK(da == db || da == 1 || db == 1, op, ": operands of different shapes (", a.str(), " and ", b.str(),
                 ") that do not broadcast: extents ", da, " and ", db, " differ and neither is 1 (dimension ", i,
                 " from the right, axis ", static_cast<int64_t>(n - 1 - i), " of the result)");
    out[n - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

Tensor expand_raw(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const Shape& xs = x.shape();
  TANDEM_CHECK(xs.size() <= shape.size(), "expand: ", x.str(), " has more dimensions than the shape it is expanded to");
  const size_t lead = shape.size() - xs.size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < xs.size(); ++i) {
    TANDEM_CHECK(xs[i] == shape[lead + i] || xs[i] == 1, "expand: ", x.str(), " does not broadcast to extent ",
                 shape[lead + i], " in dimension ", lead + i);
    strides[lead + i] = xs[i] == 1 ? 0 : x.strides()[i];
  }
  // A view that reads each element of x as often as broadcasting repeats it; the copy makes it dense.
  return as_strided(x, shape, strides, x.impl()->offset).contiguous();
}

Tensor sum_to_raw(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const Shape& gs = g.shape();
  TANDEM_ASSERT(shape.size() <= gs.size(), "sum_to ", g.str(), " into ", shape.size(), " dimensions");
  const size_t lead = gs.size() - shape.size();
  std::vector<int64_t> reduced, kept;
  int64_t n = 1, c = 1;
  for (size_t i = 0; i < gs.size(); ++i) {
    const int64_t target = i < lead ? 1 : shape[i - lead];
    if (target == 1 && gs[i] != 1) {
      reduced.push_back(static_cast<int64_t>(i));
      n *= gs[i];
    } else {
      kept.push_back(static_cast<int64_t>(i));
      c *= gs[i];
    }
  }
  if (reduced.empty()) return g.contiguous().view(shape);
  // The stretched dimensions first: then the sum is over the rows of an [n, c] matrix.
  std::vector<int64_t> perm = reduced;
  perm.insert(perm.end(), kept.begin(), kept.end());
  Tensor gp = permute_raw(g, perm);
  Tensor out = Tensor::zeros({c}, g.dtype(), g.device());
  if (n * c > 0) be(g).bias_grad(gp, n, c, 1, out);
  return out.view(shape);
}

std::vector<int64_t> check_permutation(const std::vector<int64_t>& perm, int64_t dim, const char* op) {
  TANDEM_CHECK(static_cast<int64_t>(perm.size()) == dim, op, ": a permutation of ", dim, " dimensions needs ", dim,
               " entries, got ", perm.size());
  std::vector<int64_t> out(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t p = perm[i] < 0 ? perm[i] + dim : perm[i];
    TANDEM_CHECK(p >= 0 && p < dim, op, ": dimension ", perm[i], " is out of range for ", dim, " dimensions");
    TANDEM_CHECK(!seen[p], op, ": dimension ", p, " appears twice in the permutation");
    seen[p] = true;
    out[i] = p;
  }
  return out;
}

Tensor permute_raw(const Tensor& x, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return x.contiguous();
  Shape shape(perm.size()), strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    shape[i] = x.shape()[perm[i]];
    strides[i] = x.strides()[perm[i]];
  }
  return as_strided(x, shape, strides, x.impl()->offset).contiguous();
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

Tensor concat_raw(const std::vector<Tensor>& xs, int64_t dim) {
  TANDEM_ASSERT(!xs.empty(), "concat of no tensors");
  const int64_t nd = xs[0].dim();
  // Joined along the first dimension, every input is one contiguous block of the output; other
  // dimensions are moved to the front and back.
  std::vector<int64_t> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  if (dim != 0) {
    perm.erase(perm.begin() + dim);
    perm.insert(perm.begin(), dim);
  }
  Shape shape = xs[0].shape();
  shape[dim] = 0;
  for (const Tensor& x : xs) shape[dim] += x.size(dim);
  Shape front(nd);
  for (int64_t i = 0; i < nd; ++i) front[i] = shape[perm[i]];
  Tensor out = Tensor::empty(front, xs[0].dtype(), xs[0].device());
  int64_t at = 0;
  for (const Tensor& x : xs) {
    const int64_t len = x.size(dim);
    if (len > 0) out.narrow(0, at, len).copy_(permute_raw(x, perm));
    at += len;
  }
  return dim == 0 ? out : permute_raw(out, inverse_permutation(perm));
}

}  // namespace tandem::ops
