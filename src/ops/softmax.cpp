// Softmax and log-softmax along one dimension: x viewed as [outer, c, inner] and normalised along c in one
// kernel, whatever the dimension (no transposes).
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

namespace {
Tensor softmax_along(const Tensor& x, int64_t dim, bool log, const char* op) {
  check_floating(x, op, "input");
  const int64_t nd = x.dim();
  TANDEM_CHECK(nd > 0, op, ": the input ", x.str(), " has no dimension to normalise");
  const int64_t d = dim < 0 ? dim + nd : dim;
  TANDEM_CHECK(d >= 0 && d < nd, op, ": dimension ", dim, " is out of range for ", x.str(), " (", nd,
               " dimensions: use -", nd, " .. ", nd - 1, ")");
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
  for (int64_t i = d + 1; i < nd; ++i) inner *= x.size(i);
  const int64_t c = x.size(d);
  Tensor xc = x.contiguous();
  Tensor y = empty_like(xc);
  if (y.numel()) be(x).softmax_forward(xc, outer, c, inner, log, y);
  Tensor saved = y.detach();
  return record_op(y, {x}, op, [saved, outer, c, inner, log](const Tensor& g) {
    Tensor gc = g.contiguous().to(saved.dtype());
    Tensor dx = grad_buffer(0, saved.shape(), saved.dtype(), saved.device());
    if (dx.numel()) be(gc).softmax_backward(gc, saved, outer, c, inner, log, dx);
    return std::vector<Tensor>{dx};
  });
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, false, "softmax"); }

Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_along(x, dim, true, "log_softmax"); }

}  // namespace tandem
