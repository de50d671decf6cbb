// Losses with reductions: softmax cross-entropy and negative log-likelihood over the last axis of N-D
// inputs against class indices (with an ignored index), squared error and binary cross-entropy per
// element. A kernel computes the loss of each position (in f32 for 16-bit inputs, f64 for f64) and the op
// reduces it; the backward kernel takes one weight per position, or one for all, so that a reduction's
// gradient needs no tensor of the input's size.
#include <cstdlib>

#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {

using namespace ops;
using backend::Binary;
using backend::PointLoss;

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None: return "none";
    case Reduction::Mean: return "mean";
    case Reduction::Sum: return "sum";
  }
  return "?";
}

Reduction parse_reduction(const std::string& name, const char* op) {
  if (name == "none") return Reduction::None;
  if (name == "mean") return Reduction::Mean;
  if (name == "sum") return Reduction::Sum;
  TANDEM_CHECK(false, op, ": reduction '", name, "' is not one of 'none', 'mean', 'sum'");
  return Reduction::Mean;
}

namespace {

DType stat_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// The one-element sum of a loss vector (0 for an empty one).
Tensor sum_all(const Tensor& v) {
  Tensor out = Tensor::empty({}, v.dtype(), v.device());
  if (v.numel() == 0)
    out.zero_();
  else
    be(v).sum(v, out);
  return out;
}

// Checks logits-like x [..., C] against class indices targets [...] and returns C.
int64_t check_class_targets(const Tensor& x, const Tensor& targets, const char* op, const char* what) {
  check_floating(x, op, what);
  check_defined(targets, op, "targets");
  TANDEM_CHECK(x.dim() >= 1, op, ": ", what, " ", x.str(), " need a class dimension (the last)");
  TANDEM_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64, op,
               ": targets must be class indices (i32 or i64), got ", targets.str());
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  TANDEM_CHECK(targets.shape() == lead, op, ": targets ", targets.str(), " do not fit ", what, " ", x.str(),
               ": the targets' shape must be the ", what, "' without the last (class) dimension, ", shape_str(lead));
  check_same_device(x, targets, op);
  return x.size(-1);
}

// The reduced loss of per-position losses `per` (reshaped to `shape` for None); count is the number of
// positions that count (one element), used by Mean.
Tensor reduce(const Tensor& per, const Tensor& count, Reduction r, const Shape& shape) {
  switch (r) {
    case Reduction::None: return per.view(shape);
    case Reduction::Sum: return sum_all(per);
    case Reduction::Mean: {
      Tensor s = sum_all(per);
      return binary_raw(Binary::Div, s, count.view({}));
    }
  }
  return per;
}

// The per-position weights of a reduced loss's gradient g: g itself for None (one per position), g for
// Sum and g / count for Mean (one for all).
Tensor position_weights(const Tensor& g, const Tensor& count, Reduction r, DType st) {
  Tensor gc = g.contiguous().to(st);
  if (r == Reduction::Mean) return binary_raw(Binary::Div, gc.view({1}), count.view({1}));
  return r == Reduction::None ? gc.view({gc.numel()}) : gc.view({1});
}

// Softmax cross-entropy of logits (nll false) or the negative log-likelihood of log-probabilities (nll true)
// over the last axis.
Tensor class_loss(const Tensor& x, const Tensor& targets, Reduction r, int64_t ignore_index, bool nll) {
  const char* op = nll ? "nll_loss" : "softmax_cross_entropy";
  const int64_t c = check_class_targets(x, targets, op, nll ? "log-probabilities" : "logits");
  const int64_t n = targets.numel();
  TANDEM_CHECK(c > 0 || n == 0, op, ": ", x.str(), " has no classes");
  const DType st = stat_dtype(x.dtype());
  Tensor xc = x.contiguous().view({n, c}), tc = targets.contiguous().view({n});
  Tensor per = Tensor::empty({n}, st, x.device()), valid = Tensor::empty({n}, st, x.device());
  Tensor lse = nll ? Tensor() : Tensor::empty({n}, st, x.device());
  if (n > 0) {
    if (nll)
      be(x).nll_rows_forward(xc, tc, ignore_index, per, valid);
    else
      be(x).xent_rows_forward(xc, tc, ignore_index, per, lse, valid);
  }
  // Mean divides by the positions not ignored, counted on the device.
  Tensor count = r == Reduction::Mean ? sum_all(valid) : Tensor();
  Tensor out = reduce(per, count, r, targets.shape());
  Tensor sx = nll ? Tensor() : xc.detach();
  const Shape xshape = x.shape();
  const DType xdt = x.dtype();
  return record_op(out, {x}, op, [sx, tc, lse, count, r, st, ignore_index, nll, n, c, xshape, xdt](const Tensor& g) {
    Tensor w = position_weights(g, count, r, st);
    Tensor dx = Tensor::empty({n, c}, xdt, g.device());
    if (n > 0) {
      if (nll)
        be(dx).nll_rows_backward(tc, w, ignore_index, dx);
      else
        be(dx).xent_rows_backward(sx, tc, lse, w, ignore_index, dx);
    }
    return std::vector<Tensor>{dx.view(xshape)};
  });
}

// An elementwise loss of x against a target of x's shape; with target_grad the target takes the negated
// gradient (squared error is symmetric in its operands).
Tensor point_loss(PointLoss kind, const Tensor& x, const Tensor& target, Reduction r, const char* op,
                  bool target_grad) {
  check_floating(x, op, "input");
  check_floating(target, op, "target");
  check_same_device(x, target, op);
  TANDEM_CHECK(x.shape() == target.shape(), op, ": input ", x.str(), " and target ", target.str(),
               " differ in shape (give the target the input's shape)");
  const int64_t n = x.numel();
  const DType st = stat_dtype(x.dtype());
  Tensor xc = x.contiguous(), tc = target.detach().contiguous().to(x.dtype());
  Tensor per = Tensor::empty({n}, st, x.device());
  if (n > 0) be(x).pointwise_loss_forward(kind, xc, tc, per);
  Tensor count = r == Reduction::Mean ? Tensor::full({}, static_cast<double>(n), st, x.device()) : Tensor();
  Tensor out = reduce(per, count, r, x.shape());
  Tensor sx = xc.detach();
  const bool need_x = x.requires_grad(), need_t = target_grad && target.requires_grad();
  const DType tdt = target.dtype();
  auto fn = [sx, tc, count, r, st, kind, n, need_x, need_t, target_grad, tdt](const Tensor& g) {
    Tensor w = position_weights(g, count, r, st);
    Tensor dx = Tensor::empty(sx.shape(), sx.dtype(), sx.device());
    if (n > 0) be(dx).pointwise_loss_backward(kind, sx, tc, w, dx);
    if (!target_grad) return std::vector<Tensor>{need_x ? dx : Tensor()};
    Tensor dt = need_t ? affine_raw(dx, -1.0, 0.0).to(tdt) : Tensor();
    return std::vector<Tensor>{need_x ? dx : Tensor(), dt};
  };
  if (target_grad) return record_op(out, {x, target}, op, fn);
  return record_op(out, {x}, op, fn);
}

}  // namespace

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction, int64_t ignore_index) {
  return class_loss(logits, targets, reduction, ignore_index, false);
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets, Reduction reduction,
                            int64_t ignore_index, int64_t chunk_rows, int64_t classes) {
  const char* op = "linear_cross_entropy";
  check_floating(x, op, "input");
  check_dim(weight, 2, op, "weight");
  check_floating(weight, op, "weight");
  check_same_device(x, weight, op);
  TANDEM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), op, ": input ", x.str(), " must end in the weight ",
               weight.str(), "'s ", weight.size(1), " features");
  check_defined(targets, op, "targets");
  TANDEM_CHECK(chunk_rows >= 0, op, ": chunk_rows ", chunk_rows, " must not be negative (0: chosen by size)");
  TANDEM_CHECK(classes >= 0 && classes <= weight.size(0), op, ": classes ", classes, " must be in [1, ",
               weight.size(0), "], the weight ", weight.str(), "'s rows (0: all of them)");
  const int64_t used = classes > 0 ? classes : weight.size(0);
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  TANDEM_CHECK(targets.shape() == lead, op, ": targets ", targets.str(), " do not fit the input ", x.str(),
               ": the targets' shape must be the input's without the last (feature) dimension, ", shape_str(lead));
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  // Without a gradient to take, or with a loss per position, the logits are the classifier's output.
  // (The padding rows left out of the weight: a view of its first rows.)
  if (reduction == Reduction::None || !grad_enabled() || !(need_x || need_w))
    return softmax_cross_entropy(linear(x, slice(weight, 0, 0, used), Tensor()), targets, reduction, ignore_index);
  TANDEM_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64, op,
               ": targets must be class indices (i32 or i64), got ", targets.str());
  check_same_device(x, targets, op);
  const Precision prec = current_precision();
  const DType cdt = compute_dtype(x.device(), prec, x.dtype());
  TANDEM_CHECK(x.dtype() == weight.dtype() || compute_dtype(x.device(), prec, DType::f64) != DType::f64, op, ": input ", x.str(), " and weight ",
               weight.str(), " differ in dtype");
  const int64_t n = targets.numel(), c = x.size(-1), v = weight.size(0);
  Tensor xc = to_dense(reshape(x, {n, c}), cdt, false), wc = to_dense(weight, cdt, false);
  Tensor tc = targets.contiguous().view({n});
  const DType st = stat_dtype(cdt);
  const DType xdt = x.dtype(), wdt = weight.dtype();
  Tensor per = Tensor::empty({n}, st, x.device()), valid = Tensor::empty({n}, st, x.device());
  // The gradients at unit weight per position, made chunk by chunk: dx's rows, and dw summed over the chunks
  // in the weight's type where the product writes it (f32 from 16 bits).
  const bool direct_w = wdt == cdt || (wdt == DType::f32 && is_half(cdt));
  Tensor dx = need_x ? Tensor::empty({n, c}, cdt, x.device()) : Tensor();
  Tensor dw = need_w ? Tensor::empty({v, c}, direct_w ? wdt : cdt, x.device()) : Tensor();
  // TANDEM_LOGIT_CHUNK_MB sets the automatic chunks' size (default 1024 MiB of logits).
  static const int64_t kChunkBytes = [] {
    const char* e = std::getenv("TANDEM_LOGIT_CHUNK_MB");
    const long long mb = e ? std::atoll(e) : 0;
    return (mb > 0 ? static_cast<int64_t>(mb) : int64_t(1024)) << 20;
  }();
  const int64_t row_bytes = std::max<int64_t>(v * static_cast<int64_t>(dtype_size(cdt)), 1);
  int64_t rows = std::max<int64_t>(1, std::min(n, chunk_rows > 0 ? chunk_rows : kChunkBytes / row_bytes));
  if (chunk_rows == 0 && n > 0) {  // chunks of equal size, a multiple of 64 rows
    const int64_t chunks = (n + rows - 1) / rows;
    rows = std::min(n, ((n + chunks - 1) / chunks + 63) / 64 * 64);
  }
  Tensor buf = Tensor::empty({std::min(rows, n), v}, cdt, x.device());
  if (n == 0 && dw.defined()) dw.zero_();
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t m = std::min(rows, n - r0);
    Tensor xs = xc.narrow(0, r0, m);
    // The logits, overwritten by the gradient of each position's loss (at unit weight) as the loss is taken.
    Tensor logits = buf.narrow(0, 0, m);
    gemm_raw(false, true, xs, wc, logits);
    Tensor per_s = per.narrow(0, r0, m), valid_s = valid.narrow(0, r0, m);
    be(x).xent_rows_forward_grad(logits, tc.narrow(0, r0, m), ignore_index, per_s, valid_s, used);
    if (dx.defined()) gemm_raw(false, false, logits, wc, dx.narrow(0, r0, m));
    if (dw.defined())
      be(x).gemm_fused(true, false, v, c, m, 1.0, logits, xs, r0 == 0 ? 0.0 : 1.0, dw, backend::GemmFusion{});
  }
  buf = Tensor();
  Tensor count = reduction == Reduction::Mean ? sum_all(valid) : Tensor();
  Tensor out = reduce(per, count, reduction, targets.shape());
  const Shape xshape = x.shape();
  return record_op(out, {x, weight}, op, [dx, dw, count, reduction, st, prec, xshape, xdt, wdt](const Tensor& g) {
    PrecisionScope scope(prec);
    // d loss / d logits = w (softmax - onehot): w the reduction's weight, applied to the two products.
    const Tensor w = position_weights(g, count, reduction, st);
    auto weighted = [&](const Tensor& t, DType dt) {
      Tensor u = t.dtype() == dt ? t : t.to(dt);
      return binary_raw(Binary::Mul, u, w.to(dt));
    };
    Tensor gx = dx.defined() ? weighted(dx, xdt).view(xshape) : Tensor();
    Tensor gw = dw.defined() ? weighted(dw, wdt) : Tensor();
    return std::vector<Tensor>{gx, gw};
  });
}

Tensor nll_loss(const Tensor& logp, const Tensor& targets, Reduction reduction, int64_t ignore_index) {
  return class_loss(logp, targets, reduction, ignore_index, true);
}

Tensor mse_loss(const Tensor& x, const Tensor& target, Reduction reduction) {
  return point_loss(PointLoss::SquaredError, x, target, reduction, "mse_loss", true);
}

Tensor binary_cross_entropy(const Tensor& p, const Tensor& target, Reduction reduction) {
  return point_loss(PointLoss::BinaryCrossEntropy, p, target, reduction, "binary_cross_entropy", false);
}

Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& target, Reduction reduction) {
  return point_loss(PointLoss::BinaryCrossEntropyWithLogits, x, target, reduction,
                    "binary_cross_entropy_with_logits", false);
}

}  // namespace tandem
