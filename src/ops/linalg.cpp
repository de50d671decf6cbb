// Matrix products.
#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_dim(a, 2, "matmul", "first operand");
  check_dim(b, 2, "matmul", "second operand");
  check_floating(a, "matmul", "first operand");
  TANDEM_CHECK(a.dtype() == b.dtype(), "matmul: operands of different dtypes (", a.str(), " and ", b.str(), ")");
  check_same_device(a, b, "matmul");
  TANDEM_CHECK(a.size(1) == b.size(0), "matmul: ", a.str(), " x ", b.str(), ": inner dimensions differ");
  Tensor sa = b.requires_grad() ? a.detach() : Tensor();
  Tensor sb = a.requires_grad() ? b.detach() : Tensor();
  const Precision prec = current_precision();
  return record_op(gemm_raw(false, false, a, b), {a, b}, "matmul", [sa, sb, prec](const Tensor& g) {
    PrecisionScope scope(prec);
    Tensor da = sb.defined() ? gemm_raw(false, true, g, sb) : Tensor();
    Tensor db;
    if (sa.defined()) db = gemm_raw(true, false, sa, g, grad_buffer(1, {sa.size(1), g.size(1)}, sa.dtype(), g.device()));
    return std::vector<Tensor>{da, db};
  });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu) {
  check_dim(x, 2, "linear", "input");
  check_dim(w, 2, "linear", "weight");
  check_floating(x, "linear", "input");
  check_floating(w, "linear", "weight");
  check_same_device(x, w, "linear");
  const Precision prec = current_precision();
  const DType cdt = compute_dtype(x.device(), prec, x.dtype());
  const bool mixed = compute_dtype(x.device(), prec, DType::f64) != DType::f64;  // 16-bit copies are made here
  TANDEM_CHECK(x.dtype() == w.dtype() || mixed, "linear: input ", x.str(), " and weight ", w.str(),
               " differ in dtype");
  TANDEM_CHECK(x.size(1) == w.size(1), "linear: input ", x.str(), " has ", x.size(1), " features, the weight ",
               w.str(), " expects ", w.size(1));
  if (b.defined()) {
    check_dim(b, 1, "linear", "bias");
    TANDEM_CHECK(b.size(0) == w.size(0) && b.dtype() == w.dtype(), "linear: bias ", b.str(),
                 " does not match weight ", w.str());
    check_same_device(x, b, "linear");
  }
  int64_t n = x.size(0), out_f = w.size(0);
  Tensor xc = to_dense(x, cdt, false), wc = to_dense(w, cdt, false);
  Tensor y = gemm_raw(false, true, xc, wc);  // [n, out]
  if (y.numel()) {
    if (relu)
      be(y).bias_relu(y, b.defined() ? b.contiguous() : Tensor(), n, out_f, 1, y);
    else if (b.defined())
      be(y).bias_add(y, b.contiguous(), n, out_f, 1, y);
  }
  Tensor sx = w.requires_grad() ? xc.detach() : Tensor();
  Tensor sw = x.requires_grad() ? wc.detach() : Tensor();
  Tensor sy = relu ? y.detach() : Tensor();
  bool need_b = b.defined() && b.requires_grad();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype();
  return record_op(y, {x, w, b}, "linear",
                   [sx, sw, sy, need_b, n, out_f, prec, cdt, x_dtype, w_dtype](const Tensor& g) {
    PrecisionScope scope(prec);
    Tensor gc = to_dense(g, cdt, false);
    Tensor db;
    if (need_b) db = grad_buffer(2, {out_f}, w_dtype, gc.device());
    if (sy.defined()) {  // the fused ReLU: mask the gradient (and sum it for the bias on the way)
      Tensor masked = empty_like(gc);
      be(gc).relu_bias_grad(gc, sy, n, out_f, 1, masked, db);
      gc = masked;
    } else if (need_b) {
      be(gc).bias_grad(gc, n, out_f, 1, db);
    }
    Tensor dx = sw.defined() ? gemm_raw(false, false, gc, sw) : Tensor();
    Tensor dw;
    if (sx.defined())
      dw = gemm_raw(true, false, gc, sx,
                    w_dtype == cdt ? grad_buffer(1, {out_f, sx.size(1)}, cdt, gc.device()) : Tensor());
    if (dx.defined() && x_dtype != cdt) dx = dx.to(x_dtype);
    if (dw.defined() && w_dtype != cdt) dw = dw.to(w_dtype);
    return std::vector<Tensor>{dx, dw, db};
  });
}

}  // namespace tandem
