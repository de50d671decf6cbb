// Reshaping, reordering, joining and slicing, and reductions.
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

Tensor expand(const Tensor& x, const Shape& shape) {
  check_defined(x, "expand", "input");
  if (x.shape() == shape) return x;
  Tensor y = expand_raw(x, shape);
  Shape in_shape = x.shape();
  return record_op(y, {x}, "expand",
                   [in_shape](const Tensor& g) { return std::vector<Tensor>{sum_to_raw(g, in_shape)}; });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  check_defined(x, "permute", "input");
  std::vector<int64_t> p = check_permutation(perm, x.dim(), "permute");
  std::vector<int64_t> inv = inverse_permutation(p);
  return record_op(permute_raw(x, p), {x}, "permute",
                   [inv](const Tensor& g) { return std::vector<Tensor>{permute_raw(g, inv)}; });
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  TANDEM_CHECK(!xs.empty(), "concat: no tensors to join");
  const Tensor& first = xs[0];
  check_defined(first, "concat", "first tensor");
  const int64_t nd = first.dim();
  TANDEM_CHECK(nd > 0, "concat: 0-dimensional tensors cannot be joined (", first.str(), ")");
  const int64_t d = dim < 0 ? dim + nd : dim;
  TANDEM_CHECK(d >= 0 && d < nd, "concat: dimension ", dim, " is out of range for ", first.str());
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    check_defined(x, "concat", "tensor");
    TANDEM_CHECK(x.device() == first.device() && x.dtype() == first.dtype(), "concat: tensor ", i, " ", x.str(),
                 " differs in dtype or device from tensor 0 ", first.str());
    bool fits = x.dim() == nd;
    for (int64_t k = 0; fits && k < nd; ++k) fits = k == d || x.size(k) == first.size(k);
    TANDEM_CHECK(fits, "concat: tensor ", i, " ", x.str(), " does not match tensor 0 ", first.str(),
                 " outside dimension ", d);
    lengths.push_back(x.size(d));
  }
  if (xs.size() == 1) return xs[0];
  return record_op(concat_raw(xs, d), xs, "concat", [lengths, d](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t at = 0;
    for (int64_t len : lengths) {
      grads.push_back(g.narrow(d, at, len).contiguous());
      at += len;
    }
    return grads;
  });
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) { return concat(xs, dim); }

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  check_defined(x, "slice", "input");
  const int64_t nd = x.dim();
  const int64_t d = dim < 0 ? dim + nd : dim;
  TANDEM_CHECK(d >= 0 && d < nd, "slice: dimension ", dim, " is out of range for ", x.str());
  const int64_t extent = x.size(d);
  TANDEM_CHECK(start >= 0 && length >= 0 && start + length <= extent, "slice: elements [", start, ", ", start + length,
               ") are outside dimension ", d, " of ", x.str(), " (extent ", extent, ")");
  if (start == 0 && length == extent) return x;
  Tensor y = x.narrow(d, start, length).contiguous();
  Shape in_shape = x.shape();
  return record_op(y, {x}, "slice", [in_shape, d, start, length](const Tensor& g) {
    // Zeros around the slice's gradient, joined along the sliced dimension.
    std::vector<Tensor> parts;
    Shape before = in_shape, after = in_shape;
    before[d] = start;
    after[d] = in_shape[d] - start - length;
    if (start > 0) parts.push_back(Tensor::zeros(before, g.dtype(), g.device()));
    parts.push_back(g.contiguous());
    if (after[d] > 0) parts.push_back(Tensor::zeros(after, g.dtype(), g.device()));
    return std::vector<Tensor>{parts.size() == 1 ? parts[0] : concat_raw(parts, d)};
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

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_floating(x, "sum", "input");
  const int64_t nd = x.dim();
  Shape kept = x.shape();
  std::vector<bool> reduced(nd, false);
  for (int64_t dim : dims) {
    const int64_t d = dim < 0 ? dim + nd : dim;
    TANDEM_CHECK(d >= 0 && d < nd, "sum: dimension ", dim, " is out of range for ", x.str());
    TANDEM_CHECK(!reduced[d], "sum: dimension ", d, " is given twice");
    reduced[d] = true;
    kept[d] = 1;
  }
  Shape out_shape;
  for (int64_t d = 0; d < nd; ++d)
    if (keepdim || !reduced[d]) out_shape.push_back(kept[d]);
  Tensor y = sum_to_raw(x.detach(), kept).contiguous().view(out_shape);
  Shape in_shape = x.shape();
  return record_op(y, {x}, "sum", [in_shape, kept](const Tensor& g) {
    return std::vector<Tensor>{expand_raw(g.contiguous().view(kept), in_shape)};
  });
}

Tensor mean(const Tensor& x) {
  check_floating(x, "mean", "input");
  TANDEM_CHECK(x.numel() > 0, "mean of the empty tensor ", x.str());
  return scale(sum(x), 1.0 / static_cast<double>(x.numel()));
}

}  // namespace tandem
