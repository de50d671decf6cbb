// Reshaping, joining and reductions.
#include <utility>
#include <vector>

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

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  TANDEM_CHECK(!xs.empty(), "cat: no tensors to join");
  check_defined(xs[0], "cat", "first tensor");
  const Tensor& first = xs[0];
  const int64_t nd = first.dim();
  TANDEM_CHECK(nd >= 1, "cat: cannot join zero-dimensional tensors such as ", first.str());
  TANDEM_CHECK(dim >= -nd && dim < nd, "cat: dimension ", dim, " is out of range for ", first.str());
  if (dim < 0) dim += nd;
  Shape shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    check_defined(x, "cat", "tensor");
    TANDEM_CHECK(x.device() == first.device() && x.dtype() == first.dtype(), "cat: tensor ", i, " ", x.str(),
                 " differs from the first, ", first.str(), ", in device or dtype");
    bool fits = x.dim() == nd;
    for (int64_t d = 0; fits && d < nd; ++d) fits = d == dim || x.size(d) == first.size(d);
    TANDEM_CHECK(fits, "cat: tensor ", i, " ", x.str(), " does not match ", first.str(), " outside dimension ", dim);
    total += x.size(dim);
  }
  shape[dim] = total;
  // Filled with `dim` swapped to the front, where each input is one contiguous block.
  Shape front = shape;
  std::swap(front[0], front[dim]);
  Tensor buf = Tensor::empty(front, first.dtype(), first.device());
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const int64_t n = x.size(dim);
    sizes.push_back(n);
    if (n > 0 && x.numel() > 0) buf.narrow(0, offset, n).copy_(dim == 0 ? x : x.transpose(0, dim));
    offset += n;
  }
  Tensor y = dim == 0 ? buf : buf.transpose(0, dim).contiguous();
  return record_op(y, xs, "cat", [sizes, dim](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t at = 0;
    for (int64_t n : sizes) {
      grads.push_back(g.narrow(dim, at, n).contiguous());
      at += n;
    }
    return grads;
  });
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
