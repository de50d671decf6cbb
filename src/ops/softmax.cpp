// Softmax along one dimension.
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor softmax(const Tensor& x, int64_t dim) {
  check_floating(x, "softmax", "input");
  const int64_t nd = x.dim();
  TANDEM_CHECK(nd > 0, "softmax: the input ", x.str(), " has no dimension to normalise");
  const int64_t d = dim < 0 ? dim + nd : dim;
  TANDEM_CHECK(d >= 0 && d < nd, "softmax: dimension ", dim, " is out of range for ", x.str());
  // The kernels normalise rows: the dimension is moved last, and back afterwards.
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < nd; ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  const std::vector<int64_t> inv = inverse_permutation(perm);
  const bool last = d == nd - 1;
  Tensor xp = permute_raw(x, perm);
  const int64_t c = x.size(d), n = c ? xp.numel() / c : 0;
  Tensor yp = empty_like(xp);
  be(x).softmax_rows(xp, n, c, yp);
  Tensor y = last ? yp.view(x.shape()) : permute_raw(yp, inv);
  Tensor saved = yp.detach();
  return record_op(y, {x}, "softmax", [saved, perm, inv, last, n, c](const Tensor& g) {
    Tensor gp = permute_raw(g.to(saved.dtype()), perm);
    Tensor dx = empty_like(gp);
    be(gp).softmax_rows_backward(gp, saved, n, c, dx);
    return std::vector<Tensor>{last ? dx : permute_raw(dx, inv)};
  });
}

}  // namespace tandem
