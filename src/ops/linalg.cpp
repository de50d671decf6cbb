// Matrix products: NumPy's matmul over broadcast leading dimensions (batched GEMM), SINGA's Gemm and the
// linear layer's product over the last dimension.
#include <algorithm>
#include <utility>

#include "core/tensor_impl.h"
#include "ops/layout.h"
#include "autograd/column_sums.h"
#include "ops/op_utils.h"
#include "ops/padded_rows.h"
#include "ops/shape_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

namespace {

// A matrix operand as the GEMM reads it: its buffer, and whether that buffer holds its transpose (a
// transposed view is read where it is, not copied).
struct Operand {
  Tensor buf;
  bool trans;
};

Operand as_operand(const Tensor& t, bool trans) {
  if (t.dim() >= 2 && !t.is_contiguous()) {
    Tensor flipped = t.transpose(-1, -2);
    if (flipped.is_contiguous()) return {flipped, !trans};
  }
  return {t.contiguous(), trans};
}

// [rows, cols] of op(t)'s last two dimensions.
std::pair<int64_t, int64_t> matrix_extents(const Tensor& t, bool trans) {
  const int64_t r = t.size(-2), c = t.size(-1);
  return trans ? std::make_pair(c, r) : std::make_pair(r, c);
}

// c [batch..., m, n] = op(a) op(b) for each batch index, a's and b's leading dimensions broadcast to batch
// (a leading shape of one matrix is read for every batch index; any other is stretched by a copy).
Tensor bmm_raw(const Tensor& a, bool ta, const Tensor& b, bool tb, const Shape& batch) {
  const int64_t count = shape_numel(batch);
  auto prepare = [&](const Tensor& t, bool trans, int64_t& stride) {
    Shape lead(t.shape().begin(), t.shape().end() - 2);
    const int64_t mats = shape_numel(lead), size = t.size(-2) * t.size(-1);
    Shape padded(batch.size() - lead.size(), 1);
    padded.insert(padded.end(), lead.begin(), lead.end());
    if (mats == 1 || padded == batch) {
      Operand o = as_operand(t, trans);
      stride = mats == 1 ? 0 : size;
      return o;
    }
    Shape full = batch;
    full.push_back(t.size(-2));
    full.push_back(t.size(-1));
    stride = size;
    return Operand{expand_raw(t, full), trans};
  };
  int64_t sa = 0, sb = 0;
  Operand oa = prepare(a, ta, sa), ob = prepare(b, tb, sb);
  const auto [m, k] = matrix_extents(a, ta);
  const int64_t n = matrix_extents(b, tb).second;
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor c = Tensor::empty(out_shape, a.dtype(), a.device());
  if (c.numel()) be(a).gemm_batched(oa.trans, ob.trans, count, m, n, k, 1.0, oa.buf, sa, ob.buf, sb, 0.0, c, m * n);
  return c;
}

Tensor matmul_2d(const Tensor& a, const Tensor& b) {
  Tensor sa = b.requires_grad() ? a.detach() : Tensor();
  Tensor sb = a.requires_grad() ? b.detach() : Tensor();
  const Precision prec = current_precision();
  Operand oa = as_operand(a, false), ob = as_operand(b, false);
  Tensor y = gemm_raw(oa.trans, ob.trans, oa.buf, ob.buf);
  return record_op(y, {a, b}, "matmul", [sa, sb, prec](const Tensor& g) {
    PrecisionScope scope(prec);
    Tensor da, db;
    if (sb.defined()) {
      Operand ob = as_operand(sb, true);
      da = gemm_raw(false, ob.trans, g, ob.buf);
    }
    if (sa.defined()) {
      Operand oa = as_operand(sa, true);
      db = gemm_raw(oa.trans, false, oa.buf, g, grad_buffer(1, {sa.size(1), g.size(1)}, sa.dtype(), g.device()));
    }
    return std::vector<Tensor>{da, db};
  });
}

// a [..., m, k] x b [..., k, n], both at least 2-D.
Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  Shape la(a.shape().begin(), a.shape().end() - 2), lb(b.shape().begin(), b.shape().end() - 2);
  // The leading shapes broadcast as elementwise operands do.
  const size_t nl = std::max(la.size(), lb.size());
  Shape batch(nl);
  for (size_t i = 0; i < nl; ++i) {
    const int64_t da = i < la.size() ? la[la.size() - 1 - i] : 1, db = i < lb.size() ? lb[lb.size() - 1 - i] : 1;
    TANDEM_CHECK(da == db || da == 1 || db == 1, "matmul: the leading dimensions of ", a.str(), " and ", b.str(),
                 " do not broadcast (extents ", da, " and ", db, ")");
    batch[nl - 1 - i] = da == 1 ? db : da;
  }
  // One matrix on the right and rows stored one after another on the left: a single GEMM of all rows.
  if (shape_numel(lb) == 1 && lb.size() <= la.size()) {
    Shape rows_view = {shape_numel(la) * a.size(-2), a.size(-1)}, strides;
    if (view_strides(a, rows_view, strides)) {
      Tensor y = matmul_2d(reshape(a, rows_view), reshape(b, {b.size(-2), b.size(-1)}));
      Shape out = batch;
      out.push_back(a.size(-2));
      out.push_back(b.size(-1));
      return reshape(y, out);
    }
  }
  Tensor sa = b.requires_grad() ? a.detach() : Tensor();
  Tensor sb = a.requires_grad() ? b.detach() : Tensor();
  const Precision prec = current_precision();
  Tensor y = bmm_raw(a, false, b, false, batch);
  Shape a_shape = a.shape(), b_shape = b.shape();
  return record_op(y, {a, b}, "matmul", [sa, sb, prec, batch, a_shape, b_shape](const Tensor& g) {
    PrecisionScope scope(prec);
    // dA = g B^T and dB = A^T g, summed over the batch dimensions each operand was broadcast along.
    Tensor da = sb.defined() ? sum_to_raw(bmm_raw(g, false, sb, true, batch), a_shape) : Tensor();
    Tensor db = sa.defined() ? sum_to_raw(bmm_raw(sa, true, g, false, batch), b_shape) : Tensor();
    return std::vector<Tensor>{da, db};
  });
}

// The weight gradient g^T x [out, in] of a layer with output gradient g [n, out] and input x [n, in] (both of
// the compute type), written in the weight's type where the product can write it (the compute type, or f32
// from 16 bits) — into the gradient's destination when the engine offers one; with db defined, the bias
// gradient (g's column sums) is taken by the same product.
// Whether a product of compute type cdt can write a gradient of w_dtype (the same type, or f32 from 16 bits).
bool writes_directly(DType w_dtype, DType cdt) { return w_dtype == cdt || (w_dtype == DType::f32 && is_half(cdt)); }

Tensor weight_grad(const Tensor& g, const Tensor& x, DType w_dtype, size_t index, const Tensor& db) {
  const DType cdt = g.dtype();
  const bool direct = writes_directly(w_dtype, cdt);
  Tensor dw = grad_buffer(index, {g.size(1), x.size(1)}, direct ? w_dtype : cdt, g.device());
  // The bias gradient: g's column sums where the kernel that wrote g took them (see bias_grad_of).
  const Tensor sums = db.defined() ? column_sums_of(g, g.size(1)) : Tensor();
  backend::GemmFusion f;
  if (!sums.defined()) f.a_row_sums = db;
  be(g).gemm_fused(true, false, g.size(1), x.size(1), g.size(0), 1.0, g, x, 0.0, dw, f);
  if (sums.defined()) Tensor(db).copy_(sums);
  return direct ? dw : dw.to(w_dtype);
}

// weight_grad from the input's padded rows xp [n, ld] (padded_rows_of; the first c columns are x): the product
// g^T xp [out, ld] holds the weight gradient in its first c columns and the bias gradient (g's column sums, the
// column of ones) in column c; both are copied out, db defined ([out] of w_dtype).
Tensor weight_grad_padded(const Tensor& g, const Tensor& xp, int64_t c, DType w_dtype, size_t index, Tensor& db) {
  const DType cdt = g.dtype();
  const int64_t out = g.size(1), ld = xp.size(1);
  TANDEM_ASSERT(xp.dtype() == cdt && xp.size(0) == g.size(0) && ld > c && db.defined() && db.numel() == out,
                "weight_grad_padded: ", g.str(), ", ", xp.str(), ", ", c, " columns");
  Tensor full = Tensor::empty({out, ld}, writes_directly(w_dtype, cdt) ? w_dtype : cdt, g.device());
  be(g).gemm_fused(true, false, out, ld, g.size(0), 1.0, g, xp, 0.0, full, backend::GemmFusion{});
  Tensor dw = grad_buffer(index, {out, c}, w_dtype, g.device());
  be(g).copy_strided(as_strided(full, {out, c}, {ld, 1}, 0), dw);
  be(g).copy_strided(as_strided(full, {out}, {ld}, c), db);
  return dw;
}

// y [n, out] = x w^T with the epilogue f (bias, or bias and GELU) fused into the product.
Tensor fused_product(const Tensor& x, const Tensor& w, backend::GemmFusion f) {
  Tensor y = Tensor::empty({x.size(0), w.size(0)}, x.dtype(), x.device());
  if (y.numel()) be(x).gemm_fused(false, true, x.size(0), w.size(0), x.size(1), 1.0, x, w, 0.0, y, f);
  return y;
}

backend::GemmFusion with_bias(const Tensor& b, DType cdt, const Tensor& addend = Tensor()) {
  backend::GemmFusion f;
  if (b.defined()) {
    f.epilogue = backend::GemmEpilogue::Bias;
    // In the compute type: cuBLASLt's fused kernels refuse f32 biases of 16-bit products (measured on an H200).
    f.bias = to_dense(b, cdt, false);
  }
  f.addend = addend;
  return f;
}

// Whether a residual can be the product's C operand: of the compute type, contiguous, [n, out] elements.
bool residual_fuses(const Tensor& r, DType cdt, int64_t n, int64_t out_f) {
  return r.defined() && r.dtype() == cdt && r.is_contiguous() && r.numel() == n * out_f;
}

// x w^T + b (+ residual, when defined: of the compute type, [n, out] elements, added by the product).
Tensor linear_2d(const Tensor& x, const Tensor& w, const Tensor& b, bool relu, const Tensor& residual = Tensor()) {
  const Precision prec = current_precision();
  const DType cdt = compute_dtype(x.device(), prec, x.dtype());
  int64_t n = x.size(0), out_f = w.size(0);
  // x the first columns of padded rows (a layer norm's output, see padded_rows.h): the product reads them in
  // place, and the weight gradient's product takes the bias gradient too.
  const bool need_b = b.defined() && b.requires_grad();
  const Tensor xp = !relu && need_b && w.requires_grad() && x.dtype() == cdt ? padded_rows_of(x) : Tensor();
  Tensor xc = xp.defined() ? x : to_dense(x, cdt, false), wc = to_dense(w, cdt, false);
  Tensor y;
  if (relu) {
    y = gemm_raw(false, true, xc, wc);  // [n, out]
    if (y.numel()) be(y).bias_relu(y, b.defined() ? b.contiguous() : Tensor(), n, out_f, 1, y);
  } else {
    y = fused_product(xc, wc, with_bias(b, cdt, residual.defined() ? residual.view({n, out_f}) : Tensor()));
  }
  Tensor sx = w.requires_grad() ? (xp.defined() ? xp : xc.detach()) : Tensor();
  Tensor sw = x.requires_grad() ? wc.detach() : Tensor();
  Tensor sy = relu ? y.detach() : Tensor();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype();
  const bool with_residual = residual.defined(), padded = xp.defined();
  const int64_t in_f = x.size(1);
  const Shape r_shape = with_residual ? residual.shape() : Shape{};
  return record_op(y, {x, w, b, residual}, with_residual ? "linear_residual" : "linear",
                   [sx, sw, sy, need_b, n, in_f, out_f, prec, cdt, x_dtype, w_dtype, with_residual, padded,
                    r_shape](const Tensor& g) {
    PrecisionScope scope(prec);
    Tensor gc = to_dense(g, cdt, false);
    Tensor db;
    if (need_b) db = grad_buffer(2, {out_f}, w_dtype, gc.device());
    if (sy.defined()) {  // the fused ReLU: mask the gradient (and sum it for the bias on the way)
      Tensor masked = empty_like(gc);
      be(gc).relu_bias_grad(gc, sy, n, out_f, 1, masked, db);
      gc = masked;
    } else if (need_b && !sx.defined()) {
      bias_grad_of(gc, n, out_f, db);
    }
    Tensor dx = sw.defined() ? gemm_raw(false, false, gc, sw) : Tensor();
    // Without the ReLU the weight's product takes the bias gradient too.
    Tensor dw = padded     ? weight_grad_padded(gc, sx, in_f, w_dtype, 1, db)
                : sx.defined() ? weight_grad(gc, sx, w_dtype, 1, sy.defined() ? Tensor() : db)
                               : Tensor();
    if (dx.defined() && x_dtype != cdt) dx = dx.to(x_dtype);
    // The residual's gradient is the output's, handed on as it is (a later op may add its own into it).
    return std::vector<Tensor>{dx, dw, db, with_residual ? g.view(r_shape) : Tensor()};
  });
}

// alpha * op(a) op(b) as one GEMM over 2-D operands (transposed views read in place).
Tensor scaled_product(const Tensor& a, bool ta, const Tensor& b, bool tb, double alpha, Tensor out = Tensor()) {
  Operand oa = as_operand(a, ta), ob = as_operand(b, tb);
  const auto [m, k] = matrix_extents(a, ta);
  const int64_t n = matrix_extents(b, tb).second;
  if (!out.defined()) out = Tensor::empty({m, n}, a.dtype(), a.device());
  if (out.numel()) be(a).gemm(oa.trans, ob.trans, m, n, k, alpha, oa.buf, ob.buf, 0.0, out);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_floating(a, "matmul", "first operand");
  check_floating(b, "matmul", "second operand");
  TANDEM_CHECK(a.dtype() == b.dtype(), "matmul: operands of different dtypes (", a.str(), " and ", b.str(), ")");
  check_same_device(a, b, "matmul");
  TANDEM_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: 0-dimensional operands cannot be multiplied (", a.str(), " and ",
               b.str(), ")");
  // A vector is a one-row (left) or one-column (right) matrix, that extent dropped from the result.
  const bool row = a.dim() == 1, col = b.dim() == 1;
  Tensor a2 = row ? unsqueeze(a, {0}) : a, b2 = col ? unsqueeze(b, {1}) : b;
  TANDEM_CHECK(a2.size(-1) == b2.size(-2), "matmul: ", a.str(), " x ", b.str(), ": inner dimensions differ (",
               a2.size(-1), " and ", b2.size(-2), ")");
  Tensor y = a2.dim() == 2 && b2.dim() == 2 ? matmul_2d(a2, b2) : matmul_nd(a2, b2);
  if (row || col) {
    std::vector<int64_t> drop;
    if (row) drop.push_back(y.dim() - 2);
    if (col) drop.push_back(y.dim() - 1);
    y = squeeze(y, drop);
  }
  return y;
}

Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& c, double alpha, double beta, bool trans_a, bool trans_b) {
  check_dim(a, 2, "gemm", "A");
  check_dim(b, 2, "gemm", "B");
  check_floating(a, "gemm", "A");
  TANDEM_CHECK(a.dtype() == b.dtype(), "gemm: A ", a.str(), " and B ", b.str(), " differ in dtype");
  check_same_device(a, b, "gemm");
  const auto [m, k] = matrix_extents(a, trans_a);
  const auto [kb, n] = matrix_extents(b, trans_b);
  TANDEM_CHECK(k == kb, "gemm: A ", a.str(), trans_a ? " (transposed)" : "", " and B ", b.str(),
               trans_b ? " (transposed)" : "", ": inner dimensions differ (", k, " and ", kb, ")");
  Tensor out;
  if (c.defined()) {
    TANDEM_CHECK(c.dtype() == a.dtype() && c.device() == a.device(), "gemm: C ", c.str(), " differs in dtype or device from A ",
                 a.str());
    TANDEM_CHECK(c.dim() <= 2, "gemm: C ", c.str(), " must broadcast to the product's [", m, ", ", n, "]");
    Shape mn{m, n};
    for (int64_t i = 0; i < c.dim(); ++i) {
      const int64_t e = c.size(-1 - i), want = mn[1 - i];
      TANDEM_CHECK(e == want || e == 1, "gemm: C ", c.str(), " does not broadcast to the product's [", m, ", ", n,
                   "]");
    }
    out = expand_raw(c, mn);
    if (out.is_same(c) || !out.is_contiguous()) out = out.clone();
  }
  const Precision prec = current_precision();
  if (out.defined()) {
    Operand oa = as_operand(a, trans_a), ob = as_operand(b, trans_b);
    if (out.numel()) be(a).gemm(oa.trans, ob.trans, m, n, k, alpha, oa.buf, ob.buf, beta, out);
  } else {
    out = scaled_product(a, trans_a, b, trans_b, alpha);
  }
  Tensor sa = b.requires_grad() ? a.detach() : Tensor();
  Tensor sb = a.requires_grad() ? b.detach() : Tensor();
  Shape c_shape = c.defined() ? c.shape() : Shape{};
  const bool has_c = c.defined();
  return record_op(out, {a, b, c}, "gemm", [sa, sb, alpha, beta, trans_a, trans_b, c_shape, has_c, prec](const Tensor& g) {
    PrecisionScope scope(prec);
    // y = alpha op(A) op(B) + beta C: d op(A) = alpha g op(B)^T, d op(B) = alpha op(A)^T g.
    Tensor da, db, dc;
    if (sb.defined())
      da = trans_a ? scaled_product(sb, trans_b, g, true, alpha) : scaled_product(g, false, sb, !trans_b, alpha);
    if (sa.defined())
      db = trans_b ? scaled_product(g, true, sa, trans_a, alpha) : scaled_product(sa, !trans_a, g, false, alpha);
    if (has_c) dc = affine_raw(sum_to_raw(g, c_shape), beta, 0.0);
    return std::vector<Tensor>{da, db, dc};
  });
}

namespace {
void check_linear(const Tensor& x, const Tensor& w, const Tensor& b, const char* op) {
  check_floating(x, op, "input");
  check_dim(w, 2, op, "weight");
  check_floating(w, op, "weight");
  check_same_device(x, w, op);
  TANDEM_CHECK(x.dim() >= 1, op, ": a 0-dimensional input ", x.str(), " has no features");
  const Precision prec = current_precision();
  const bool mixed = compute_dtype(x.device(), prec, DType::f64) != DType::f64;  // 16-bit copies are made here
  TANDEM_CHECK(x.dtype() == w.dtype() || mixed, op, ": input ", x.str(), " and weight ", w.str(), " differ in dtype");
  TANDEM_CHECK(x.size(-1) == w.size(1), op, ": input ", x.str(), " has ", x.size(-1), " features, the weight ",
               w.str(), " expects ", w.size(1));
  if (b.defined()) {
    check_dim(b, 1, op, "bias");
    TANDEM_CHECK(b.size(0) == w.size(0) && b.dtype() == w.dtype(), op, ": bias ", b.str(), " does not match weight ",
                 w.str());
    check_same_device(x, b, op);
  }
}

Shape linear_shape(const Tensor& x, const Tensor& w) {
  Shape out(x.shape().begin(), x.shape().end() - 1);
  out.push_back(w.size(0));
  return out;
}

// The residual of a product with output shape `out`: checked, and whether the product can add it itself.
bool check_residual(const Tensor& r, const Tensor& x, const Shape& out, DType cdt, const char* op) {
  check_defined(r, op, "residual");
  check_floating(r, op, "residual");
  check_same_device(x, r, op);
  TANDEM_CHECK(r.shape() == out, op, ": residual ", r.str(), " must have the output's shape ", shape_str(out));
  return residual_fuses(r, cdt, shape_numel(out) / std::max<int64_t>(out.back(), 1), out.back());
}

// residual + y, y converted to the residual's type: the composition of a residual connection.
Tensor add_residual(const Tensor& residual, const Tensor& y) {
  return add(residual, y.dtype() == residual.dtype() ? y : cast(y, residual.dtype()));
}
}  // namespace

Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual) {
  const char* op = "linear_residual";
  check_linear(x, w, b, op);
  const Shape out = linear_shape(x, w);
  const DType cdt = compute_dtype(x.device(), current_precision(), x.dtype());
  if (!check_residual(residual, x, out, cdt, op)) return add_residual(residual, linear(x, w, b));
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Tensor y = linear_2d(x.dim() == 2 ? x : reshape(x, {rows, x.size(-1)}), w, b, false, residual);
  return x.dim() == 2 ? y : reshape(y, out);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu) {
  check_linear(x, w, b, "linear");
  if (x.dim() == 2) return linear_2d(x, w, b, relu);
  // Every other dimension of x is a batch dimension: rows of one matrix.
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(w.size(0));
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Tensor y = linear_2d(reshape(x, {rows, x.size(-1)}), w, b, relu);
  return reshape(y, out_shape);
}

Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                const Tensor& residual) {
  const char* op = "gelu_mlp";
  check_floating(x, op, "input");
  check_dim(w1, 2, op, "first weight");
  check_dim(w2, 2, op, "second weight");
  TANDEM_CHECK(x.dim() >= 1 && x.size(-1) == w1.size(1), op, ": input ", x.str(), " must end in the first weight ",
               w1.str(), "'s ", w1.size(1), " features");
  TANDEM_CHECK(w2.size(1) == w1.size(0), op, ": the second weight ", w2.str(), " must take the first's ", w1.size(0),
               " outputs");
  TANDEM_CHECK(b1.defined() == b2.defined(), op, ": give both biases or neither");
  const Precision prec = current_precision();
  const DType cdt = compute_dtype(x.device(), prec, x.dtype());
  const Shape out_shape = linear_shape(x, w2);
  const bool fuse_residual = residual.defined() && check_residual(residual, x, out_shape, cdt, op);
  // Without biases it is the composition.
  if (!b1.defined()) {
    Tensor h = gelu(linear(x, w1, b1), /*tanh_approximation=*/true);
    return residual.defined() ? linear_residual(h, w2, b2, residual) : linear(h, w2, b2);
  }
  if (residual.defined() && !fuse_residual) return add_residual(residual, gelu_mlp(x, w1, b1, w2, b2));
  for (const Tensor* t : {&w1, &b1, &w2, &b2}) check_same_device(x, *t, op);
  const bool mixed = compute_dtype(x.device(), prec, DType::f64) != DType::f64;  // 16-bit copies are made here
  for (const Tensor* t : {&w1, &b1, &w2, &b2})
    TANDEM_CHECK(t->dtype() == x.dtype() || mixed, op, ": input ", x.str(), " and parameter ", t->str(),
                 " differ in dtype");
  TANDEM_CHECK(b1.dim() == 1 && b1.size(0) == w1.size(0) && b2.dim() == 1 && b2.size(0) == w2.size(0), op,
               ": biases ", b1.str(), " and ", b2.str(), " do not match the weights ", w1.str(), " and ", w2.str());
  const int64_t c = x.size(-1), hidden = w1.size(0), out_f = w2.size(0);
  const int64_t n = x.numel() / std::max<int64_t>(c, 1);
  const Tensor x2 = reshape(x, {n, c});
  // x the first columns of padded rows (see linear_2d): the first weight's gradient product takes its bias's.
  const Tensor xp = w1.requires_grad() && b1.requires_grad() && x2.dtype() == cdt ? padded_rows_of(x2) : Tensor();
  Tensor xc = xp.defined() ? x2 : to_dense(x2, cdt, false), w1c = to_dense(w1, cdt, false),
         w2c = to_dense(w2, cdt, false);
  backend::GemmFusion f1;
  f1.epilogue = backend::GemmEpilogue::BiasGelu;
  f1.bias = to_dense(b1, cdt, false);
  f1.aux = Tensor::empty({n, hidden}, cdt, x.device());  // the GELU's input, kept for the backward
  Tensor h = fused_product(xc, w1c, f1);
  Tensor y = fused_product(h, w2c, with_bias(b2, cdt, fuse_residual ? residual.view({n, out_f}) : Tensor()));
  const bool need_x = x.requires_grad(), need_w1 = w1.requires_grad(), need_b1 = b1.requires_grad(),
             need_w2 = w2.requires_grad(), need_b2 = b2.requires_grad();
  const bool through = need_x || need_w1 || need_b1;  // the gradient goes on past the GELU
  Tensor pre = through ? f1.aux.detach() : Tensor(), sh = need_w2 || need_b2 ? h.detach() : Tensor();
  const bool padded = xp.defined();
  Tensor sx = padded ? xp : need_w1 || need_b1 ? xc.detach() : Tensor(), sw1 = need_x ? w1c.detach() : Tensor(),
         sw2 = through ? w2c.detach() : Tensor();
  const DType xdt = x.dtype(), w1dt = w1.dtype(), b1dt = b1.dtype(), w2dt = w2.dtype(), b2dt = b2.dtype();
  const Shape xshape = x.shape();
  const Shape r_shape = fuse_residual ? residual.shape() : Shape{};
  Tensor out = record_op(y, {x, w1, b1, w2, b2, residual}, op,
                         [=](const Tensor& g) {
    PrecisionScope scope(prec);
    Tensor gc = to_dense(g, cdt, false);
    Tensor db2 = need_b2 ? grad_buffer(4, {out_f}, b2dt, gc.device()) : Tensor();
    Tensor dw2, db1, dw1, dx;
    if (sh.defined()) {
      if (need_w2) {
        dw2 = weight_grad(gc, sh, w2dt, 3, db2);
      } else {
        bias_grad_of(gc, n, out_f, db2);
      }
    }
    if (through) {
      // The gradient at the GELU's input: the second product with the GELU's derivative in its epilogue.
      backend::GemmFusion fd;
      fd.epilogue = backend::GemmEpilogue::DGelu;
      fd.aux = pre;
      // The first bias's gradient (the column sums of dpre) taken by the same product, in the product's type
      // (from padded rows: by the first weight's gradient product).
      Tensor sums = need_b1 && !padded ? (b1dt == cdt ? grad_buffer(2, {hidden}, b1dt, gc.device())
                                                      : Tensor::empty({hidden}, cdt, gc.device()))
                                       : Tensor();
      fd.c_col_sums = sums;
      Tensor dpre = Tensor::empty({n, hidden}, cdt, gc.device());
      be(gc).gemm_fused(false, false, n, hidden, out_f, 1.0, gc, sw2, 0.0, dpre, fd);
      if (padded) {
        db1 = grad_buffer(2, {hidden}, b1dt, gc.device());
        dw1 = weight_grad_padded(dpre, sx, c, w1dt, 1, db1);
      } else {
        if (need_b1) db1 = sums.dtype() == b1dt ? sums : sums.to(b1dt);
        if (need_w1) dw1 = weight_grad(dpre, sx, w1dt, 1, Tensor());
      }
      if (need_x) {
        dx = gemm_raw(false, false, dpre, sw1);
        if (xdt != cdt) dx = dx.to(xdt);
        dx = dx.view(xshape);
      }
    }
    return std::vector<Tensor>{dx, dw1, db1, dw2, db2, fuse_residual ? g.view(r_shape) : Tensor()};
  });
  return reshape(out, out_shape);
}

}  // namespace tandem
