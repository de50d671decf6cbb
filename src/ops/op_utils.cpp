#include "ops/op_utils.h"

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

// Elementwise kernels see flat arrays: operands in one storage order (channels-last when either is,
// else contiguous) give an output in that order.
Tensor binary_raw(backend::Binary op, const Tensor& a, const Tensor& b) {
  const bool cl = strictly_channels_last(a) || strictly_channels_last(b);
  Tensor ac = to_dense(a, a.dtype(), cl), bc = to_dense(b, b.dtype(), cl);
  Tensor out = empty_dense_like(ac);
  if (out.numel()) be(a).binary(op, ac, bc, out);
  return out;
}

Tensor unary_raw(backend::Unary op, const Tensor& a) {
  Tensor ac = is_dense(a) ? a : a.contiguous();
  Tensor out = empty_dense_like(ac);
  if (out.numel()) be(a).unary(op, ac, out);
  return out;
}

Tensor affine_raw(const Tensor& a, double alpha, double beta) {
  Tensor ac = is_dense(a) ? a : a.contiguous();
  Tensor out = empty_dense_like(ac);
  if (out.numel()) be(a).affine(ac, alpha, beta, out);
  return out;
}

Tensor grad_buffer(size_t i, const Shape& shape, DType dtype, Device device) {
  Tensor d = grad_destination(i);
  if (d.defined() && d.shape() == shape && d.dtype() == dtype && d.device() == device && d.is_contiguous()) return d;
  return Tensor::empty(shape, dtype, device);
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

}  // namespace tandem::ops
