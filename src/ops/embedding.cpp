// Embedding lookups: rows of a table picked by integer indices.
#include "ops/op_utils.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {

using namespace ops;

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_dim(weight, 2, "embedding", "weight");
  check_floating(weight, "embedding", "weight");
  check_defined(indices, "embedding", "indices");
  TANDEM_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64, "embedding: indices must be i32 or i64, got ",
               indices.str());
  TANDEM_CHECK(weight.device() == indices.device(), "embedding: weight ", weight.str(), " and indices ", indices.str(),
               " are on different devices");
  const int64_t v = weight.size(0), d = weight.size(1), n = indices.numel();
  Shape out_shape = indices.shape();
  out_shape.push_back(d);
  Tensor idx = indices.contiguous().view({n});
  Tensor y = Tensor::empty({n, d}, weight.dtype(), weight.device());
  if (n > 0 && d > 0) be(weight).embedding_forward(weight.contiguous(), idx, y);
  y = y.view(out_shape);
  const bool deterministic = deterministic_algorithms();
  const DType dt = weight.dtype();
  const Device dev = weight.device();
  return record_op(y, {weight}, "embedding", [idx, v, d, n, dt, dev, deterministic](const Tensor& g) {
    Tensor gc = g.contiguous().view({n, d});
    // Where the table's gradient from its other readers has arrived (a tied output layer's), the rows are
    // added into it: no zeroed table of its own, and no pass adding two tables.
    Tensor acc = grad_add_target(0);
    if (acc.defined() && acc.dtype() == dt && acc.shape() == Shape({v, d}) && acc.is_contiguous() &&
        be(acc).embedding_backward_add(gc, idx, deterministic, acc))
      return std::vector<Tensor>{acc};
    Tensor dw = grad_buffer(0, {v, d}, dt, dev);
    if (dw.numel() > 0) be(dw).embedding_backward(gc, idx, deterministic, dw);
    return std::vector<Tensor>{dw};
  });
}

}  // namespace tandem
