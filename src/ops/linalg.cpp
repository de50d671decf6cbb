// Matrix products.
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
  return record_op(gemm_raw(false, false, a, b), {a, b}, "matmul", [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{sb.defined() ? gemm_raw(false, true, g, sb) : Tensor(),
                               sa.defined() ? gemm_raw(true, false, sa, g) : Tensor()};
  });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_dim(x, 2, "linear", "input");
  check_dim(w, 2, "linear", "weight");
  check_floating(x, "linear", "input");
  TANDEM_CHECK(x.dtype() == w.dtype(), "linear: input ", x.str(), " and weight ", w.str(), " differ in dtype");
  check_same_device(x, w, "linear");
  TANDEM_CHECK(x.size(1) == w.size(1), "linear: input ", x.str(), " has ", x.size(1), " features, the weight ",
               w.str(), " expects ", w.size(1));
  if (b.defined()) {
    check_dim(b, 1, "linear", "bias");
    TANDEM_CHECK(b.size(0) == w.size(0) && b.dtype() == w.dtype(), "linear: bias ", b.str(),
                 " does not match weight ", w.str());
    check_same_device(x, b, "linear");
  }
  int64_t n = x.size(0), out_f = w.size(0);
  Tensor y = gemm_raw(false, true, x, w);  // [n, out]
  if (b.defined() && y.numel()) be(y).bias_add(y, b.contiguous(), n, out_f, 1, y);
  Tensor sx = w.requires_grad() ? x.detach() : Tensor();
  Tensor sw = x.requires_grad() ? w.detach() : Tensor();
  bool need_b = b.defined() && b.requires_grad();
  return record_op(y, {x, w, b}, "linear", [sx, sw, need_b, n, out_f](const Tensor& g) {
    Tensor gc = g.contiguous();
    Tensor db;
    if (need_b) {
      db = Tensor::empty({out_f}, gc.dtype(), gc.device());
      be(gc).bias_grad(gc, n, out_f, 1, db);
    }
    return std::vector<Tensor>{sw.defined() ? gemm_raw(false, false, gc, sw) : Tensor(),
                               sx.defined() ? gemm_raw(true, false, gc, sx) : Tensor(), db};
  });
}

}  // namespace tandem
