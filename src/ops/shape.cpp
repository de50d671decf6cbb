// Reshaping, reordering, joining, splitting, slicing, repeating and padding. Views (reshape where the
// strides allow, permute, transpose, squeeze, unsqueeze, slices of positive step, split) share x's storage;
// the gradients they return are contiguous.
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "core/tensor_impl.h"
#include "ops/op_utils.h"
#include "ops/shape_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;
using ReduceOp = backend::Backend::ReduceOp;

namespace ops {

int64_t normalize_dim(int64_t dim, int64_t rank, const Tensor& x, const char* op) {
  const int64_t d = dim < 0 ? dim + rank : dim;
  TANDEM_CHECK(d >= 0 && d < rank, op, ": dimension ", dim, " is out of range for ", x.str(), " (", rank,
               " dimensions)");
  return d;
}

bool view_strides(const Tensor& x, const Shape& shape, Shape& strides) {
  const Shape& old = x.shape();
  const Shape& st = x.strides();
  strides.assign(shape.size(), 1);
  if (x.numel() == 0 || old.empty()) {
    strides = contiguous_strides(shape);
    return true;
  }
  // Groups of x's dimensions that are contiguous with each other can be cut anew; a new dimension may
  // not straddle two groups.
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t base = st.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old.size()) - 1; d >= 0; --d) {
    tensor_numel *= old[d];
    if (d == 0 || (old[d - 1] != 1 && st[d - 1] != tensor_numel * base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * base;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        base = st[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

void split_extents(const Shape& shape, int64_t dim, int64_t& outer, int64_t& n, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  n = shape[dim];
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
}

}  // namespace ops

namespace {

// shape with its -1 resolved against numel elements, checked.
Shape infer_shape(const Tensor& x, const Shape& shape, const char* op) {
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TANDEM_CHECK(infer < 0, op, ": more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      TANDEM_CHECK(s[i] >= 0, op, ": invalid extent ", s[i], " in ", shape_str(shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TANDEM_CHECK(known > 0 && x.numel() % known == 0, op, ": cannot infer the -1 of ", shape_str(shape), " for ",
                 x.str());
    s[static_cast<size_t>(infer)] = x.numel() / known;
  }
  TANDEM_CHECK(shape_numel(s) == x.numel(), op, ": shape ", shape_str(shape), " does not hold the ", x.numel(),
               " elements of ", x.str());
  return s;
}

// A view of x recorded by autograd; its gradient is g in x's shape (made contiguous).
Tensor reshaped_view(const Tensor& x, const Tensor& view, const char* op) {
  Shape in_shape = x.shape();
  return record_op(view, {x}, op, [in_shape](const Tensor& g) { return std::vector<Tensor>{g.contiguous().view(in_shape)}; });
}

// The gradient of a view that picks part of x: zeros around g, written through the same view of them.
Tensor scatter_into_zeros(const Tensor& g, const Shape& in_shape, int64_t dim, int64_t start, int64_t len,
                          int64_t step) {
  Tensor dx = grad_buffer(0, in_shape, g.dtype(), g.device());
  dx.zero_();
  if (g.numel() == 0) return dx;
  Shape shape = in_shape, strides = dx.strides();
  shape[dim] = len;
  const int64_t offset = dx.storage_offset() + start * strides[dim];
  strides[dim] *= step;
  Tensor part = as_strided(dx, shape, strides, offset);
  be(dx).copy_into_strided(g.contiguous(), part);
  return dx;
}

// x with an extent of reps[d] placed beside each dimension d (before it, for tile's order of whole blocks;
// after it, for upsample's element by element), stretched without copying, then merged into one copy.
Tensor repeat_dims(const Tensor& x, const std::vector<int64_t>& reps, bool blocks, const char* op) {
  const int64_t nd = x.dim();
  Shape pairs, pair_strides, merged;
  std::vector<bool> reduced;
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t r = reps[d], s = x.size(d);
    TANDEM_CHECK(r >= 0, op, ": negative repeat count ", r, " for dimension ", d, " of ", x.str());
    if (blocks) {
      pairs.insert(pairs.end(), {r, s});
      pair_strides.insert(pair_strides.end(), {0, x.strides()[d]});
      reduced.insert(reduced.end(), {true, false});
    } else {
      pairs.insert(pairs.end(), {s, r});
      pair_strides.insert(pair_strides.end(), {x.strides()[d], 0});
      reduced.insert(reduced.end(), {false, true});
    }
    merged.push_back(r * s);
  }
  Tensor y = as_strided(x, pairs, pair_strides, x.storage_offset()).contiguous().view(merged);
  Shape in_shape = x.shape();
  return record_op(y, {x}, op, [pairs, reduced, in_shape](const Tensor& g) {
    return std::vector<Tensor>{reduce_raw(ReduceOp::Sum, g.contiguous().view(pairs), reduced, 1.0).view(in_shape)};
  });
}

// Padding of one dimension by repeating or mirroring its edge.
Tensor pad_edge_dim(const Tensor& x, int64_t dim, int64_t before, int64_t after, bool reflect) {
  int64_t outer, n, inner;
  split_extents(x.shape(), dim, outer, n, inner);
  Shape out_shape = x.shape();
  out_shape[dim] = before + n + after;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  be(x).pad_axis(x.contiguous(), outer, n, inner, before, after, reflect, y);
  Shape in_shape = x.shape();
  return record_op(y, {x}, "pad", [in_shape, outer, n, inner, before, after, reflect](const Tensor& g) {
    Tensor dx = grad_buffer(0, in_shape, g.dtype(), g.device());
    be(g).pad_axis_backward(g.contiguous(), outer, n, inner, before, after, reflect, dx);
    return std::vector<Tensor>{dx};
  });
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "reshape", "input");
  const Shape s = infer_shape(x, shape, "reshape");
  if (s == x.shape()) return x;
  Shape strides;
  Tensor y = view_strides(x, s, strides) ? as_strided(x, s, strides, x.storage_offset()) : x.contiguous().view(s);
  return reshaped_view(x, y, "reshape");
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
  Shape shape(p.size()), strides(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    shape[i] = x.shape()[p[i]];
    strides[i] = x.strides()[p[i]];
  }
  return record_op(as_strided(x, shape, strides, x.storage_offset()), {x}, "permute",
                   [inv](const Tensor& g) { return std::vector<Tensor>{permute_raw(g, inv)}; });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  check_defined(x, "transpose", "input");
  const int64_t a = normalize_dim(d0, x.dim(), x, "transpose"), b = normalize_dim(d1, x.dim(), x, "transpose");
  std::vector<int64_t> perm(static_cast<size_t>(x.dim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[a], perm[b]);
  return permute(x, perm);
}

Tensor squeeze(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined(x, "squeeze", "input");
  const int64_t nd = x.dim();
  std::vector<bool> drop(static_cast<size_t>(nd), dims.empty());
  if (dims.empty()) {
    for (int64_t d = 0; d < nd; ++d) drop[d] = x.size(d) == 1;
  } else {
    for (int64_t dim : dims) {
      const int64_t d = normalize_dim(dim, nd, x, "squeeze");
      TANDEM_CHECK(x.size(d) == 1, "squeeze: dimension ", d, " of ", x.str(), " has extent ", x.size(d), ", not 1");
      drop[d] = true;
    }
  }
  Shape shape, strides;
  for (int64_t d = 0; d < nd; ++d)
    if (!drop[d]) {
      shape.push_back(x.size(d));
      strides.push_back(x.strides()[d]);
    }
  if (shape == x.shape()) return x;
  return reshaped_view(x, as_strided(x, shape, strides, x.storage_offset()), "squeeze");
}

Tensor unsqueeze(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined(x, "unsqueeze", "input");
  const int64_t rank = x.dim() + static_cast<int64_t>(dims.size());
  std::vector<bool> added(static_cast<size_t>(rank), false);
  for (int64_t dim : dims) {
    const int64_t d = dim < 0 ? dim + rank : dim;
    TANDEM_CHECK(d >= 0 && d < rank, "unsqueeze: position ", dim, " is out of range for a result of ", rank,
                 " dimensions from ", x.str());
    TANDEM_CHECK(!added[d], "unsqueeze: position ", d, " is given twice for ", x.str());
    added[d] = true;
  }
  Shape shape, strides;
  int64_t src = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (added[d]) {
      shape.push_back(1);
      strides.push_back(1);
    } else {
      shape.push_back(x.size(src));
      strides.push_back(x.strides()[src]);
      ++src;
    }
  }
  if (dims.empty()) return x;
  return reshaped_view(x, as_strided(x, shape, strides, x.storage_offset()), "unsqueeze");
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
  Shape in_shape = x.shape();
  return record_op(x.narrow(d, start, length), {x}, "slice", [in_shape, d, start, length](const Tensor& g) {
    return std::vector<Tensor>{scatter_into_zeros(g, in_shape, d, start, length, 1)};
  });
}

Tensor strided_slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  check_defined(x, "slice", "input");
  TANDEM_CHECK(x.dim() > 0, "slice: a 0-dimensional tensor ", x.str(), " has no dimension to slice");
  const int64_t d = normalize_dim(dim, x.dim(), x, "slice");
  TANDEM_CHECK(step != 0, "slice: the step along dimension ", d, " of ", x.str(), " is 0");
  const int64_t n = x.size(d);
  // Python's slice.indices: ends clipped to [0, n] going forwards, to [-1, n - 1] going backwards.
  auto clip = [&](int64_t v, int64_t open) {
    if (v == kOpen) return open;
    if (v < 0) v += n;
    return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
  };
  const int64_t s = clip(start, step > 0 ? 0 : n - 1), e = clip(end, step > 0 ? n : -1);
  const int64_t len = step > 0 ? std::max<int64_t>(0, (e - s + step - 1) / step)
                               : std::max<int64_t>(0, (s - e + (-step) - 1) / (-step));
  if (step == 1) return slice(x, d, len > 0 ? s : 0, len);
  Shape shape = x.shape(), strides = x.strides();
  shape[d] = len;
  const int64_t offset = x.storage_offset() + (len > 0 ? s * strides[d] : 0);
  strides[d] *= step;
  Tensor y = as_strided(x, shape, strides, offset);
  if (step < 0) y = y.clone();  // no tensor with negative strides escapes
  Shape in_shape = x.shape();
  const int64_t first = len > 0 ? s : 0;
  return record_op(y, {x}, "slice", [in_shape, d, first, len, step](const Tensor& g) {
    return std::vector<Tensor>{scatter_into_zeros(g, in_shape, d, first, len, step)};
  });
}

Tensor slice_ranges(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                    const std::vector<int64_t>& axes, const std::vector<int64_t>& steps) {
  check_defined(x, "slice", "input");
  const size_t k = starts.size();
  TANDEM_CHECK(ends.size() == k && (axes.empty() || axes.size() == k) && (steps.empty() || steps.size() == k),
               "slice: starts, ends, axes and steps must have one entry per sliced axis (", starts.size(), ", ",
               ends.size(), ", ", axes.size(), ", ", steps.size(), ") for ", x.str());
  std::vector<bool> seen(static_cast<size_t>(x.dim()), false);
  Tensor y = x;
  for (size_t i = 0; i < k; ++i) {
    const int64_t axis = normalize_dim(axes.empty() ? static_cast<int64_t>(i) : axes[i], x.dim(), x, "slice");
    TANDEM_CHECK(!seen[axis], "slice: axis ", axis, " is given twice for ", x.str());
    seen[axis] = true;
    y = strided_slice(y, axis, starts[i], ends[i], steps.empty() ? 1 : steps[i]);
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& lengths, int64_t dim) {
  check_defined(x, "split", "input");
  TANDEM_CHECK(x.dim() > 0, "split: a 0-dimensional tensor ", x.str(), " cannot be split");
  const int64_t d = normalize_dim(dim, x.dim(), x, "split");
  int64_t total = 0;
  for (int64_t len : lengths) {
    TANDEM_CHECK(len >= 0, "split: negative length ", len, " for dimension ", d, " of ", x.str());
    total += len;
  }
  TANDEM_CHECK(total == x.size(d), "split: lengths ", shape_str(lengths), " sum to ", total, ", not to the extent ",
               x.size(d), " of dimension ", d, " of ", x.str());
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t len : lengths) {
    out.push_back(slice(x, d, at, len));
    at += len;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t parts, int64_t dim) {
  check_defined(x, "chunk", "input");
  TANDEM_CHECK(x.dim() > 0, "chunk: a 0-dimensional tensor ", x.str(), " cannot be split");
  const int64_t d = normalize_dim(dim, x.dim(), x, "chunk");
  TANDEM_CHECK(parts > 0, "chunk: ", parts, " parts asked of dimension ", d, " of ", x.str());
  const int64_t n = x.size(d), size = std::max<int64_t>(1, (n + parts - 1) / parts);
  std::vector<int64_t> lengths;
  for (int64_t at = 0; at < n; at += size) lengths.push_back(std::min(size, n - at));
  if (lengths.empty()) lengths.push_back(0);
  return split(x, lengths, d);
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& repeats) {
  check_defined(x, "tile", "input");
  const int64_t nd = std::max<int64_t>(x.dim(), static_cast<int64_t>(repeats.size()));
  std::vector<int64_t> reps(static_cast<size_t>(nd - static_cast<int64_t>(repeats.size())), 1);
  reps.insert(reps.end(), repeats.begin(), repeats.end());
  Tensor xs = x;
  if (x.dim() < nd) {
    std::vector<int64_t> lead(static_cast<size_t>(nd - x.dim()));
    std::iota(lead.begin(), lead.end(), 0);
    xs = unsqueeze(x, lead);
  }
  return repeat_dims(xs, reps, true, "tile");
}

Tensor upsample_nearest(const Tensor& x, const std::vector<int64_t>& scales) {
  check_defined(x, "upsample", "input");
  TANDEM_CHECK(static_cast<int64_t>(scales.size()) == x.dim(), "upsample: ", scales.size(), " scales for ", x.str(),
               ", which has ", x.dim(), " dimensions");
  for (size_t d = 0; d < scales.size(); ++d)
    TANDEM_CHECK(scales[d] >= 1, "upsample: scale ", scales[d], " of dimension ", d, " of ", x.str(),
                 " is not a positive integer");
  return repeat_dims(x, scales, false, "upsample");
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode, double value) {
  check_defined(x, "pad", "input");
  const int64_t nd = x.dim();
  TANDEM_CHECK(static_cast<int64_t>(pads.size()) == 2 * nd, "pad: ", pads.size(), " pads for ", x.str(), ", which needs ",
               2 * nd, " (before each dimension, then after each)");
  Shape out_shape = x.shape();
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t before = pads[d], after = pads[d + nd], n = x.size(d);
    TANDEM_CHECK(before >= 0 && after >= 0, "pad: negative pads (", before, ", ", after, ") for dimension ", d, " of ",
                 x.str());
    if (mode == PadMode::Reflect)
      TANDEM_CHECK(before < n && after < n, "pad: reflect pads (", before, ", ", after, ") of dimension ", d, " of ",
                   x.str(), " must be smaller than its extent ", n);
    if (mode == PadMode::Edge)
      TANDEM_CHECK(n > 0 || before + after == 0, "pad: dimension ", d, " of ", x.str(),
                   " is empty: it has no edge to repeat");
    out_shape[d] += before + after;
  }
  if (out_shape == x.shape()) return x;
  if (mode != PadMode::Constant) {
    Tensor y = x;
    for (int64_t d = 0; d < nd; ++d)
      if (pads[d] || pads[d + nd]) y = pad_edge_dim(y, d, pads[d], pads[d + nd], mode == PadMode::Reflect);
    return y;
  }
  // The value everywhere, then x written into the middle.
  Tensor y = Tensor::full(out_shape, value, x.dtype(), x.device());
  Shape strides = y.strides();
  int64_t offset = 0;
  for (int64_t d = 0; d < nd; ++d) offset += pads[d] * strides[d];
  if (x.numel()) {
    Tensor middle = as_strided(y, x.shape(), strides, offset);
    be(x).copy_into_strided(x.contiguous(), middle);
  }
  Shape in_shape = x.shape();
  std::vector<int64_t> before(pads.begin(), pads.begin() + nd);
  return record_op(y, {x}, "pad", [in_shape, before](const Tensor& g) {
    Tensor gc = g.contiguous();
    int64_t off = gc.storage_offset();
    for (size_t d = 0; d < before.size(); ++d) off += before[d] * gc.strides()[d];
    return std::vector<Tensor>{as_strided(gc, in_shape, gc.strides(), off).contiguous()};
  });
}

Tensor constant_of_shape(const Shape& shape, double value, DType dtype, Device device) {
  for (size_t d = 0; d < shape.size(); ++d)
    TANDEM_CHECK(shape[d] >= 0, "constant_of_shape: negative extent ", shape[d], " in ", shape_str(shape));
  return Tensor::full(shape, value, dtype, device);
}

Tensor depth_to_space(const Tensor& x, int64_t blocksize, bool crd) {
  check_dim(x, 4, "depth_to_space", "input");
  const int64_t b = blocksize, n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  TANDEM_CHECK(b > 0 && c % (b * b) == 0, "depth_to_space: the channels of ", x.str(), " (", c,
               ") do not divide into blocks of ", b, " x ", b);
  const int64_t co = c / (b * b);
  Tensor t = crd ? permute(reshape(x, {n, co, b, b, h, w}), {0, 1, 4, 2, 5, 3})
                 : permute(reshape(x, {n, b, b, co, h, w}), {0, 3, 4, 1, 5, 2});
  return reshape(t, {n, co, h * b, w * b});
}

Tensor space_to_depth(const Tensor& x, int64_t blocksize, bool crd) {
  check_dim(x, 4, "space_to_depth", "input");
  const int64_t b = blocksize, n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  TANDEM_CHECK(b > 0 && h % b == 0 && w % b == 0, "space_to_depth: the height and width of ", x.str(),
               " do not divide into blocks of ", b, " x ", b);
  Tensor t = reshape(x, {n, c, h / b, b, w / b, b});
  t = crd ? permute(t, {0, 1, 3, 5, 2, 4}) : permute(t, {0, 3, 5, 1, 2, 4});
  return reshape(t, {n, c * b * b, h / b, w / b});
}

}  // namespace tandem
