// Layer and RMS normalisation over the trailing dimensions: one fused kernel per direction, the row
// statistics saved by the forward for the backward.
#include <cstdlib>

#include "autograd/column_sums.h"
#include "core/tensor_impl.h"
#include "ops/op_utils.h"
#include "ops/padded_rows.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

namespace {

// Whether the backward hands on dx's column sums (TANDEM_LN_COLUMN_SUMS=0: not, and the layers that would take
// them reduce the gradient themselves; for measuring).
bool column_sums_on() {
  static const bool on = [] {
    const char* e = std::getenv("TANDEM_LN_COLUMN_SUMS");
    return !(e && e[0] == '0');
  }();
  return on;
}

// Checks a parameter of normalized_shape: x's type, or f32 with 16-bit x on CUDA.
void check_param(const Tensor& p, const Tensor& x, const Shape& normalized_shape, const char* op, const char* what) {
  if (!p.defined()) return;
  check_floating(p, op, what);
  TANDEM_CHECK(p.shape() == normalized_shape, op, ": ", what, " ", p.str(), " must have the normalized shape ",
               shape_str(normalized_shape));
  check_same_device(p, x, op);
  const bool mixed = x.device().is_cuda() && is_half(x.dtype()) && p.dtype() == DType::f32;
  TANDEM_CHECK(p.dtype() == x.dtype() || mixed, op, ": ", what, " ", p.str(), " and input ", x.str(),
               " differ in dtype", x.device().is_cuda() && is_half(x.dtype()) ? " (16-bit inputs take f32 or their own type)" : "");
}

// With pad (one normalized dimension), the output's rows are the first c columns of padded rows (see
// padded_rows.h): the same values, for a product with a bias after it.
Tensor normalise(const Tensor& x, const Shape& normalized_shape, const Tensor& w, const Tensor& b, double eps, bool rms,
                 const char* op, bool pad = false) {
  check_floating(x, op, "input");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  TANDEM_CHECK(k >= 1 && k <= x.dim(), op, ": normalized_shape ", shape_str(normalized_shape), " needs between 1 and ",
               x.dim(), " dimensions for the input ", x.str());
  for (int64_t i = 0; i < k; ++i)
    TANDEM_CHECK(x.size(x.dim() - k + i) == normalized_shape[i], op, ": normalized_shape ",
                 shape_str(normalized_shape), " does not match the trailing dimensions of the input ", x.str());
  check_param(w, x, normalized_shape, op, "weight");
  check_param(b, x, normalized_shape, op, "bias");
  TANDEM_CHECK(eps >= 0.0, op, ": eps must not be negative, got ", eps);
  const int64_t c = shape_numel(normalized_shape);
  int64_t n = 1;
  for (int64_t i = 0; i < x.dim() - k; ++i) n *= x.size(i);
  const DType st = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor xc = x.contiguous(), wc = w.defined() ? w.contiguous() : Tensor(), bc = b.defined() ? b.contiguous() : Tensor();
  Tensor mean = rms ? Tensor() : Tensor::empty({n}, st, x.device()), rstd = Tensor::empty({n}, st, x.device());
  const bool work = n > 0 && c > 0;
  Tensor y, rows;  // rows: y as [n, c] for the kernel
  if (pad && work && k == 1) {
    const int64_t ld = padded_ld(c);
    Tensor buf = Tensor::empty({n, ld}, xc.dtype(), x.device());
    mark_padded_rows(buf, c);
    Shape wide = x.shape();  // x's shape with rows ld long: its strides are the view's
    wide.back() = ld;
    y = as_strided(buf, x.shape(), contiguous_strides(wide), 0);
    rows = as_strided(buf, {n, c}, {ld, 1}, 0);
  } else {
    y = empty_like(xc);
    rows = y;
  }
  if (work) be(x).layer_norm_forward(xc, wc, bc, n, c, eps, rms, rows, mean, rstd);
  const bool need_x = x.requires_grad(), need_w = w.defined() && w.requires_grad(),
             need_b = b.defined() && b.requires_grad();
  Tensor sx = xc.detach(), sw = wc.defined() ? wc.detach() : Tensor();
  const DType bdt = b.defined() ? b.dtype() : x.dtype();
  const Shape pshape = normalized_shape;
  return record_op(y, {x, w, b}, op,
                   [sx, sw, mean, rstd, n, c, rms, work, need_x, need_w, need_b, bdt, pshape](const Tensor& g) {
    Tensor dy = g.contiguous().to(sx.dtype());
    // Where x's gradient from its other readers has arrived (a residual connection's), this one is added
    // into it by the kernel.
    Tensor acc = need_x && work ? grad_add_target(0) : Tensor();
    const bool into = acc.defined() && acc.dtype() == sx.dtype() && acc.shape() == sx.shape() && acc.is_contiguous();
    Tensor dx = into ? acc : need_x ? grad_buffer(0, sx.shape(), sx.dtype(), sx.device()) : Tensor();
    Tensor dw = need_w ? grad_buffer(1, sw.shape(), sw.dtype(), sw.device()) : Tensor();
    Tensor db = need_b ? grad_buffer(2, pshape, bdt, sx.device()) : Tensor();
    // dx's column sums, where the kernel can take them on its pass: the bias gradient of a layer that added
    // into x (a residual branch's output projection) is those sums, read here instead of from dx again.
    Tensor sums = need_x && work && column_sums_on() ? Tensor::empty({c}, DType::f32, sx.device()) : Tensor();
    bool summed = false;
    if (work && into) {
      summed = be(dy).layer_norm_backward_add(dy, sx, sw, mean, rstd, n, c, rms, dx, dw, db, sums);
    } else if (work) {
      summed = be(dy).layer_norm_backward(dy, sx, sw, mean, rstd, n, c, rms, dx, dw, db, sums);
    } else {  // no rows (or empty rows): the parameters' gradients are empty sums
      if (dw.defined()) dw.zero_();
      if (db.defined()) db.zero_();
    }
    if (summed) set_column_sums(dx, c, sums);
    return std::vector<Tensor>{dx, dw, db};
  });
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, double eps) {
  return normalise(x, normalized_shape, weight, bias, eps, false, "layer_norm");
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  return normalise(x, normalized_shape, weight, Tensor(), eps, true, "rms_norm");
}

namespace ops {
Tensor layer_norm_padded(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                         double eps) {
  return normalise(x, normalized_shape, weight, bias, eps, false, "layer_norm", true);
}
}  // namespace ops

}  // namespace tandem
