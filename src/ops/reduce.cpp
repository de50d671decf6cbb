// Reductions over dimensions (sum, mean, extremes and their positions, variance, log-sum-exp, product),
// cosine similarity and the ranking loss. Each runs one generic backend kernel over an [outer, n, inner]
// view of its input; dimensions reduced that are not adjacent are reduced one run at a time (sums,
// extremes, products) or moved together first (the others).
#include <numeric>
#include <utility>
#include <vector>

#include "ops/op_utils.h"
#include "ops/shape_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;
using ReduceOp = backend::Backend::ReduceOp;

namespace ops {

namespace {
// The reduced dimensions of `shape` moved last: the permutation, the extent of the kept ones (outer) and
// of the reduced ones (n), so that the permuted tensor is rows [outer, n].
struct ReducedLast {
  std::vector<int64_t> perm;
  int64_t outer = 1, n = 1;
};
ReducedLast reduced_last(const Shape& shape, const std::vector<bool>& reduced) {
  ReducedLast r;
  for (bool want_reduced : {false, true})
    for (size_t d = 0; d < shape.size(); ++d)
      if (reduced[d] == want_reduced) {
        r.perm.push_back(static_cast<int64_t>(d));
        (want_reduced ? r.n : r.outer) *= shape[d];
      }
  return r;
}
}  // namespace

ReducePlan plan_reduce(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  const int64_t nd = x.dim();
  ReducePlan p;
  p.reduced.assign(static_cast<size_t>(nd), false);
  p.kept = x.shape();
  for (int64_t dim : dims) {
    const int64_t d = dim < 0 ? dim + nd : dim;
    TANDEM_CHECK(d >= 0 && d < nd, op, ": dimension ", dim, " is out of range for ", x.str(), " (", nd,
                 " dimensions)");
    TANDEM_CHECK(!p.reduced[d], op, ": dimension ", d, " is given twice for ", x.str());
    p.reduced[d] = true;
    p.kept[d] = 1;
    p.count *= x.size(d);
  }
  for (int64_t d = 0; d < nd; ++d)
    if (keepdim || !p.reduced[d]) p.out.push_back(p.kept[d]);
  return p;
}

Tensor reduce_raw(ReduceOp op, const Tensor& x, const std::vector<bool>& reduced, double arg) {
  Tensor xc = x.contiguous();
  const Shape& shape = xc.shape();
  Shape kept = shape;
  // Runs of adjacent dimensions that are all reduced or all kept; extents of 1 belong to neither.
  struct Run {
    int64_t extent;
    bool reduced;
  };
  std::vector<Run> runs;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) kept[d] = 1;
    if (shape[d] == 1) continue;
    if (!runs.empty() && runs.back().reduced == reduced[d])
      runs.back().extent *= shape[d];
    else
      runs.push_back({shape[d], static_cast<bool>(reduced[d])});
  }
  const DType out_dtype = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin ? DType::i64 : xc.dtype();
  auto run_kernel = [&](const Tensor& in, int64_t outer, int64_t n, int64_t inner, double a) {
    Tensor out = Tensor::empty({outer * inner}, out_dtype, in.device());
    be(in).reduce(op, in, outer, n, inner, a, out);
    return out;
  };
  int64_t reduced_runs = 0;
  for (const Run& r : runs) reduced_runs += r.reduced;
  if (reduced_runs <= 1) {
    int64_t outer = 1, n = 1, inner = 1;
    bool seen = false;
    for (const Run& r : runs) {
      if (r.reduced) {
        n = r.extent;
        seen = true;
      } else {
        (seen ? inner : outer) *= r.extent;
      }
    }
    return run_kernel(xc, outer, n, inner, arg).view(kept);
  }
  const bool decomposable = op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::Min || op == ReduceOp::Prod;
  if (decomposable) {
    // The innermost reduced run first; Sum's scale once, at the last.
    Tensor cur = xc;
    for (size_t r = runs.size(); r-- > 0;) {
      if (!runs[r].reduced) continue;
      int64_t outer = 1, inner = 1;
      for (size_t q = 0; q < r; ++q) outer *= runs[q].extent;
      for (size_t q = r + 1; q < runs.size(); ++q) inner *= runs[q].extent;
      const bool last = --reduced_runs == 0;
      cur = run_kernel(cur, outer, runs[r].extent, inner, last ? arg : 1.0);
      runs[r].extent = 1;
    }
    return cur.view(kept);
  }
  // Every reduced dimension moved to the end, then one reduction of rows.
  const ReducedLast r = reduced_last(shape, reduced);
  return run_kernel(permute_raw(xc, r.perm), r.outer, r.n, 1, arg).view(kept);
}

}  // namespace ops

namespace {

// The reductions that need at least one element.
void check_nonempty(const Tensor& x, const ReducePlan& p, const char* op) {
  if (p.count != 0 || shape_numel(p.kept) == 0) return;
  for (size_t d = 0; d < p.reduced.size(); ++d)
    TANDEM_CHECK(!(p.reduced[d] && x.size(static_cast<int64_t>(d)) == 0), op, ": dimension ", d, " of ", x.str(),
                 " is empty; there is no element to reduce");
}

// The gradient of a kept-shape result, spread back over x's shape.
Tensor spread(const Tensor& g, const Shape& kept, const Shape& shape) {
  return expand_raw(g.contiguous().view(kept), shape);
}

Tensor sum_scaled(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool mean, const char* op) {
  check_floating(x, op, "input");
  ReducePlan p = plan_reduce(x, dims, keepdim, op);
  const double scale = mean ? 1.0 / static_cast<double>(p.count) : 1.0;
  Tensor y = reduce_raw(ReduceOp::Sum, x, p.reduced, scale).view(p.out);
  Shape in_shape = x.shape(), kept = p.kept;
  return record_op(y, {x}, op, [in_shape, kept, scale](const Tensor& g) {
    Tensor dx = spread(g, kept, in_shape);
    return std::vector<Tensor>{scale == 1.0 ? dx : affine_raw(dx, scale, 0.0)};
  });
}

Tensor extreme(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool largest) {
  const char* op = largest ? "amax" : "amin";
  check_floating(x, op, "input");
  ReducePlan p = plan_reduce(x, dims, keepdim, op);
  check_nonempty(x, p, op);
  Tensor yk = reduce_raw(largest ? ReduceOp::Max : ReduceOp::Min, x, p.reduced, 0.0);
  Tensor saved_x = x.detach(), saved_y = yk.detach();
  std::vector<bool> reduced = p.reduced;
  return record_op(yk.view(p.out), {x}, op, [saved_x, saved_y, reduced](const Tensor& g) {
    // Every element equal to the extreme takes an even share of its gradient.
    const Shape& shape = saved_x.shape();
    Tensor mask = binary_raw(backend::Binary::Eq, saved_x, expand_raw(saved_y, shape));
    Tensor count = reduce_raw(ReduceOp::Sum, mask, reduced, 1.0);
    Tensor share = binary_raw(backend::Binary::Div, g.contiguous().view(saved_y.shape()), count);
    return std::vector<Tensor>{binary_raw(backend::Binary::Mul, mask, expand_raw(share, shape))};
  });
}

Tensor arg_extreme(const Tensor& x, int64_t dim, bool keepdim, bool largest) {
  const char* op = largest ? "argmax" : "argmin";
  check_floating(x, op, "input");
  TANDEM_CHECK(x.dim() > 0, op, ": a 0-dimensional tensor has no dimension ", dim, " (", x.str(), ")");
  ReducePlan p = plan_reduce(x, {dim}, keepdim, op);
  check_nonempty(x, p, op);
  return reduce_raw(largest ? ReduceOp::ArgMax : ReduceOp::ArgMin, x.detach(), p.reduced, 0.0).view(p.out);
}

// sqrt(max(v, floor)), its gradient zero where v is clamped.
Tensor clamped_sqrt(const Tensor& v, double floor) {
  Tensor lo = Tensor::full({}, floor, v.dtype(), v.device());
  Tensor clamped = binary_raw(backend::Binary::Max, v, expand_raw(lo, v.shape()));
  Tensor y = unary_raw(backend::Unary::Sqrt, clamped);
  Tensor sv = v.detach(), sy = y.detach();
  return record_op(y, {v}, "sqrt", [sv, sy, lo](const Tensor& g) {
    Tensor live = binary_raw(backend::Binary::Gt, sv, expand_raw(lo, sv.shape()));
    Tensor d = binary_raw(backend::Binary::Div, affine_raw(g, 0.5, 0.0), sy);
    return std::vector<Tensor>{binary_raw(backend::Binary::Mul, d, live)};
  });
}

}  // namespace

Tensor sum(const Tensor& x) {
  check_floating(x, "sum", "input");
  std::vector<int64_t> all(static_cast<size_t>(x.dim()));
  std::iota(all.begin(), all.end(), 0);
  return sum_scaled(x, all, false, false, "sum");
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_scaled(x, dims, keepdim, false, "sum");
}

Tensor mean(const Tensor& x) {
  check_floating(x, "mean", "input");
  TANDEM_CHECK(x.numel() > 0, "mean: the empty tensor ", x.str(), " has no mean");
  std::vector<int64_t> all(static_cast<size_t>(x.dim()));
  std::iota(all.begin(), all.end(), 0);
  return sum_scaled(x, all, false, true, "mean");
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_scaled(x, dims, keepdim, true, "mean");
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return extreme(x, dims, keepdim, true); }

Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(x, dims, keepdim, false);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_extreme(x, dim, keepdim, true); }

Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_extreme(x, dim, keepdim, false); }

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  check_floating(x, "var", "input");
  ReducePlan p = plan_reduce(x, dims, keepdim, "var");
  const double correction = unbiased ? 1.0 : 0.0;
  Tensor y = reduce_raw(ReduceOp::Var, x, p.reduced, correction).view(p.out);
  Tensor saved = x.detach();
  std::vector<bool> reduced = p.reduced;
  Shape kept = p.kept;
  const double count = static_cast<double>(p.count);
  return record_op(y, {x}, "var", [saved, reduced, kept, count, correction](const Tensor& g) {
    // d var / dx = 2 (x - mean) / (count - correction)
    const Shape& shape = saved.shape();
    Tensor mu = reduce_raw(ReduceOp::Sum, saved, reduced, 1.0 / count);
    Tensor centred = binary_raw(backend::Binary::Sub, saved, expand_raw(mu, shape));
    Tensor gs = affine_raw(spread(g, kept, shape), 2.0 / std::max(count - correction, 0.0), 0.0);
    return std::vector<Tensor>{binary_raw(backend::Binary::Mul, centred, gs)};
  });
}

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_floating(x, "logsumexp", "input");
  ReducePlan p = plan_reduce(x, dims, keepdim, "logsumexp");
  Tensor yk = reduce_raw(ReduceOp::LogSumExp, x, p.reduced, 0.0);
  Tensor saved_x = x.detach(), saved_y = yk.detach();
  return record_op(yk.view(p.out), {x}, "logsumexp", [saved_x, saved_y](const Tensor& g) {
    // d/dx = exp(x - logsumexp): the softmax over the reduced dimensions.
    const Shape& shape = saved_x.shape();
    Tensor w = unary_raw(backend::Unary::Exp, binary_raw(backend::Binary::Sub, saved_x, expand_raw(saved_y, shape)));
    return std::vector<Tensor>{
        binary_raw(backend::Binary::Mul, w, expand_raw(g.contiguous().view(saved_y.shape()), shape))};
  });
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_floating(x, "prod", "input");
  ReducePlan p = plan_reduce(x, dims, keepdim, "prod");
  Tensor y = reduce_raw(ReduceOp::Prod, x, p.reduced, 0.0).view(p.out);
  Tensor saved = x.detach();
  std::vector<bool> reduced = p.reduced;
  Shape kept = p.kept;
  return record_op(y, {x}, "prod", [saved, reduced, kept](const Tensor& g) {
    // The reduced dimensions moved last: each output's factors form one row [outer, n].
    const Shape& shape = saved.shape();
    const ReducedLast rl = reduced_last(shape, reduced);
    const std::vector<int64_t>& perm = rl.perm;
    const int64_t outer = rl.outer, n = rl.n;
    Tensor xp = permute_raw(saved, perm);
    Tensor dxp = Tensor::empty(xp.shape(), xp.dtype(), xp.device());
    be(xp).prod_backward(xp, g.contiguous(), outer, n, 1, dxp);
    return std::vector<Tensor>{permute_raw(dxp, inverse_permutation(perm))};
  });
}

Tensor cosine_similarity(const Tensor& a, const Tensor& b, int64_t dim, double eps) {
  check_floating(a, "cosine_similarity", "first operand");
  check_floating(b, "cosine_similarity", "second operand");
  check_same(a, b, "cosine_similarity");
  TANDEM_CHECK(a.dim() > 0, "cosine_similarity: 0-dimensional operands ", a.str(), " have no dimension ", dim);
  const int64_t d = dim < 0 ? dim + a.dim() : dim;
  TANDEM_CHECK(d >= 0 && d < a.dim(), "cosine_similarity: dimension ", dim, " is out of range for ", a.str());
  // Each operand divided by its norm clamped below by eps, then the products summed (PyTorch 1.13's).
  Tensor na = clamped_sqrt(sum(mul(a, a), {d}, true), eps * eps);
  Tensor nb = clamped_sqrt(sum(mul(b, b), {d}, true), eps * eps);
  return sum(mul(div(a, na), div(b, nb)), {d});
}

Tensor ranking_loss(const Tensor& pos, const Tensor& neg, double margin) {
  check_floating(pos, "ranking_loss", "pos");
  check_floating(neg, "ranking_loss", "neg");
  check_same(pos, neg, "ranking_loss");
  TANDEM_CHECK(pos.dim() > 0 && pos.size(0) > 0, "ranking_loss: pos ", pos.str(), " holds no batch");
  Tensor hinge = relu(add_scalar(sub(neg, pos), margin));
  return scale(sum(hinge), 1.0 / static_cast<double>(pos.size(0)));
}

}  // namespace tandem
