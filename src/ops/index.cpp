// Indexing: slices at indices (ONNX's Gather), element gathers and scatters along a dimension, one-hot
// rows and nonzero positions. Gradients that meet one position twice are summed in a fixed order.
#include <vector>

#include "core/tensor_impl.h"
#include "ops/op_utils.h"
#include "ops/shape_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

namespace {

void check_index(const Tensor& index, const Tensor& x, const char* op) {
  check_defined(index, op, "index");
  TANDEM_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, op, ": indices must be i32 or i64, got ",
               index.str());
  check_same_device(x, index, op);
}

// A kernel's complaint about an index, with the op, dimension and tensor it indexed.
template <typename F>
void in_context(const char* op, const Tensor& x, int64_t dim, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (e.kind() != Error::Kind::Input) throw;
    detail::throw_error(Error::Kind::Input, detail::cat(op, " along dimension ", dim, " of ", x.str(), ": ", e.what()));
  }
}

// Checks that index (of x's rank) fits x outside dim; returns x narrowed to index's extents there (a view).
Tensor fitted(const Tensor& x, const Tensor& index, int64_t dim, const char* op) {
  TANDEM_CHECK(index.dim() == x.dim(), op, ": index ", index.str(), " must have the ", x.dim(), " dimensions of ",
               x.str());
  Tensor v = x;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == dim) continue;
    TANDEM_CHECK(index.size(d) <= x.size(d), op, ": index ", index.str(), " is larger than ", x.str(),
                 " in dimension ", d, " (only dimension ", dim, " may differ)");
    if (index.size(d) < x.size(d)) v = v.narrow(d, 0, index.size(d));
  }
  return v;
}

// dst (a view of any strides) += or = src's elements scattered at index along dim; dst's other extents are
// index's. Errors name the tensor x that dst is part of.
void scatter_into(Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate, const char* op,
                  const Tensor& x) {
  int64_t outer, n, inner;
  split_extents(dst.shape(), dim, outer, n, inner);
  Tensor work = dst.is_contiguous() ? dst : dst.contiguous();
  in_context(op, x, dim, [&] { be(dst).scatter_elements(src.contiguous(), index.contiguous(), outer, n, inner, accumulate, work); });
  if (!work.is_same(dst)) be(dst).copy_into_strided(work, dst);
}

// x's element gather along dim at index (x already narrowed to index's extents outside dim; errors name ctx).
Tensor gather_raw(const Tensor& x, int64_t dim, const Tensor& index, const char* op, const Tensor& ctx) {
  int64_t outer, n, inner;
  split_extents(x.shape(), dim, outer, n, inner);
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  in_context(op, ctx, dim, [&] { be(x).gather_elements(x.contiguous(), index.contiguous(), outer, n, inner, out); });
  return out;
}

// The gradient of a gather: g scattered (added) at index into zeros of x's shape.
Tensor gather_backward(const Tensor& g, const Shape& x_shape, int64_t dim, const Tensor& index, const char* op) {
  Tensor dx = grad_buffer(0, x_shape, g.dtype(), g.device());
  dx.zero_();
  Tensor part = dx;
  for (int64_t d = 0; d < dx.dim(); ++d)
    if (d != dim && index.size(d) < dx.size(d)) part = part.narrow(d, 0, index.size(d));
  scatter_into(part, dim, index, g, true, op, dx);
  return dx;
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "gather", "input");
  check_index(index, x, "gather");
  TANDEM_CHECK(x.dim() > 0, "gather: a 0-dimensional tensor ", x.str(), " has no dimension to index");
  const int64_t d = normalize_dim(dim, x.dim(), x, "gather");
  int64_t outer, n, inner;
  split_extents(x.shape(), d, outer, n, inner);
  Shape out_shape(x.shape().begin(), x.shape().begin() + d);
  out_shape.insert(out_shape.end(), index.shape().begin(), index.shape().end());
  out_shape.insert(out_shape.end(), x.shape().begin() + d + 1, x.shape().end());
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor idx = index.contiguous();
  TANDEM_CHECK(n > 0 || idx.numel() == 0 || outer * inner == 0, "gather: dimension ", d, " of ", x.str(),
               " is empty; there is nothing to index");
  in_context("gather", x, d, [&] { be(x).index_select(x.contiguous(), idx, outer, n, inner, out); });
  if (!is_floating(x.dtype())) return out;
  Shape in_shape = x.shape();
  return record_op(out, {x}, "gather", [idx, in_shape, outer, n, inner, d](const Tensor& g) {
    Tensor dx = grad_buffer(0, in_shape, g.dtype(), g.device());
    in_context("gather", dx, d, [&] { be(g).index_add(g.contiguous(), idx, outer, n, inner, dx); });
    return std::vector<Tensor>{dx};
  });
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "gather_elements", "input");
  check_index(index, x, "gather_elements");
  TANDEM_CHECK(x.dim() > 0, "gather_elements: a 0-dimensional tensor ", x.str(), " has no dimension to index");
  const int64_t d = normalize_dim(dim, x.dim(), x, "gather_elements");
  Tensor xs = fitted(x, index, d, "gather_elements");
  TANDEM_CHECK(x.size(d) > 0 || index.numel() == 0, "gather_elements: dimension ", d, " of ", x.str(),
               " is empty; there is nothing to index");
  Tensor idx = index.contiguous();
  Tensor out = gather_raw(xs, d, idx, "gather_elements", x);
  if (!is_floating(x.dtype())) return out;
  Shape in_shape = x.shape();
  return record_op(out, {x}, "gather_elements", [idx, in_shape, d](const Tensor& g) {
    return std::vector<Tensor>{gather_backward(g, in_shape, d, idx, "gather_elements")};
  });
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_floating(x, "scatter_add", "input");
  check_index(index, x, "scatter_add");
  check_floating(src, "scatter_add", "source");
  TANDEM_CHECK(src.dtype() == x.dtype() && src.device() == x.device(), "scatter_add: source ", src.str(),
               " differs in dtype or device from the input ", x.str());
  TANDEM_CHECK(src.shape() == index.shape(), "scatter_add: source ", src.str(), " and index ", index.str(),
               " differ in shape");
  TANDEM_CHECK(x.dim() > 0, "scatter_add: a 0-dimensional tensor ", x.str(), " has no dimension to index");
  const int64_t d = normalize_dim(dim, x.dim(), x, "scatter_add");
  Tensor out = x.clone();
  Tensor part = fitted(out, index, d, "scatter_add");
  Tensor idx = index.contiguous();
  scatter_into(part, d, idx, src, true, "scatter_add", x);
  return record_op(out, {x, src}, "scatter_add", [idx, d](const Tensor& g) {
    Tensor gs = gather_raw(fitted(g, idx, d, "scatter_add"), d, idx, "scatter_add", g);
    return std::vector<Tensor>{g, gs};
  });
}

Tensor scatter_elements(const Tensor& x, const Tensor& index, const Tensor& updates, int64_t dim) {
  check_defined(x, "scatter_elements", "input");
  check_index(index, x, "scatter_elements");
  check_defined(updates, "scatter_elements", "updates");
  TANDEM_CHECK(updates.dtype() == x.dtype() && updates.device() == x.device(), "scatter_elements: updates ",
               updates.str(), " differ in dtype or device from the input ", x.str());
  TANDEM_CHECK(updates.shape() == index.shape(), "scatter_elements: updates ", updates.str(), " and index ",
               index.str(), " differ in shape");
  TANDEM_CHECK(x.dim() > 0, "scatter_elements: a 0-dimensional tensor ", x.str(), " has no dimension to index");
  const int64_t d = normalize_dim(dim, x.dim(), x, "scatter_elements");
  Tensor out = x.clone();
  Tensor part = fitted(out, index, d, "scatter_elements");
  Tensor idx = index.contiguous();
  scatter_into(part, d, idx, updates, false, "scatter_elements", x);
  if (!is_floating(x.dtype())) return out;
  return record_op(out, {x, updates}, "scatter_elements", [idx, d](const Tensor& g) {
    // x's gradient: g with the overwritten positions zeroed; the updates': g at their positions.
    Tensor dx = g.clone();
    Tensor zeros = Tensor::zeros(idx.shape(), g.dtype(), g.device());
    Tensor dpart = fitted(dx, idx, d, "scatter_elements");
    scatter_into(dpart, d, idx, zeros, false, "scatter_elements", dx);
    Tensor du = gather_raw(fitted(g, idx, d, "scatter_elements"), d, idx, "scatter_elements", g);
    return std::vector<Tensor>{dx, du};
  });
}

Tensor one_hot(const Tensor& index, int64_t depth, int64_t axis, double off, double on, DType dtype) {
  check_defined(index, "one_hot", "index");
  TANDEM_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, "one_hot: indices must be i32 or i64, got ",
               index.str());
  TANDEM_CHECK(depth >= 0, "one_hot: negative depth ", depth);
  TANDEM_CHECK(is_floating(dtype), "one_hot: the result's dtype must be floating, got ", dtype_name(dtype));
  const int64_t rank = index.dim() + 1;
  const int64_t a = axis < 0 ? axis + rank : axis;
  TANDEM_CHECK(a >= 0 && a < rank, "one_hot: axis ", axis, " is out of range for a result of ", rank,
               " dimensions from ", index.str());
  Shape out_shape = index.shape();
  out_shape.insert(out_shape.begin() + a, depth);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < a; ++d) outer *= index.size(d);
  for (int64_t d = a; d < index.dim(); ++d) inner *= index.size(d);
  Tensor out = Tensor::empty(out_shape, dtype, index.device());
  be(index).one_hot(index.contiguous(), outer, depth, inner, off, on, out);
  return out;
}

Tensor nonzero(const Tensor& x) {
  check_defined(x, "nonzero", "input");
  return be(x).nonzero(x.contiguous());
}

}  // namespace tandem
