// Reshaping and reductions.
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "reshape", "input");
  Tensor y = x.contiguous().view(shape);
  Shape in_shape = x.shape();
  return record_op(y, {x}, "reshape",
                   [in_shape](const Tensor& g) { return std::vector<Tensor>{g.contiguous().view(in_shape)}; });
}

Tensor flatten(const Tensor& x, int64_t start_dim) {
  check_defined(x, "flatten", "input");
  int64_t n = x.dim();
  if (start_dim < 0) start_dim += n;
  TANDEM_CHECK(start_dim >= 0 && start_dim < std::max<int64_t>(n, 1), "flatten: start_dim out of range for ", x.str());
  Shape s(x.shape().begin(), x.shape().begin() + start_dim);
  int64_t rest = 1;
  for (int64_t i = start_dim; i < n; ++i) rest *= x.size(i);
  s.push_back(rest);
  return reshape(x, s);
}

Tensor sum(const Tensor& x) {
  check_floating(x, "sum", "input");
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  be(x).sum(x.contiguous(), out);
  Shape shape = x.shape();
  return record_op(out, {x}, "sum", [shape](const Tensor& g) {
    return std::vector<Tensor>{broadcast_scalar(g, shape)};
  });
}

Tensor mean(const Tensor& x) {
  check_floating(x, "mean", "input");
  TANDEM_CHECK(x.numel() > 0, "mean of the empty tensor ", x.str());
  return scale(sum(x), 1.0 / static_cast<double>(x.numel()));
}

}  // namespace tandem
