// FP8 ops: the scaled casts, the maximum, and the linear layer's product from FP8 operands (tandem/fp8.h).
#include "tandem/fp8.h"

#include <vector>

#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

namespace {

void check_cast_source(const Tensor& x, const char* op) {
  check_defined(x, op, "input");
  TANDEM_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16 || x.dtype() == DType::f16, op, ": input ",
               x.str(), " is not f32, bf16 or f16");
}

void check_scalar(const Tensor& s, const Tensor& x, const char* op, const char* what) {
  check_defined(s, op, what);
  TANDEM_CHECK(s.dtype() == DType::f32 && s.numel() == 1 && s.is_contiguous(), op, ": ", what,
               " must be one f32 value, got ", s.str());
  check_same_device(x, s, op);
}

// A contiguous tensor of dtype: t itself when it is one already.
Tensor dense_as(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t.detach();
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  be(t).copy_strided(t, out);
  return out;
}

}  // namespace

Tensor fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& amax) {
  const char* op = "fp8_quantize";
  check_cast_source(x, op);
  check_scalar(scale, x, op, "the scale");
  if (amax.defined()) check_scalar(amax, x, op, "amax");
  Tensor xc = x.contiguous();
  Tensor q = Tensor::empty(x.shape(), DType::u8, x.device());
  Tensor a = amax;
  be(x).fp8_quantize(xc, scale, format, q, a);
  return q;
}

Tensor fp8_quantize_transposed(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& amax) {
  const char* op = "fp8_quantize_transposed";
  check_cast_source(x, op);
  check_dim(x, 2, op, "input");
  check_scalar(scale, x, op, "the scale");
  if (amax.defined()) check_scalar(amax, x, op, "amax");
  Tensor xc = x.contiguous();
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor qt = Tensor::empty({cols, rows}, DType::u8, x.device());
  Tensor none, a = amax;
  be(x).fp8_quantize_transposed(xc, scale, format, rows, cols, none, qt, a);
  return qt;
}

Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype) {
  const char* op = "fp8_dequantize";
  check_defined(q, op, "codes");
  TANDEM_CHECK(q.dtype() == DType::u8, op, ": codes ", q.str(), " are not u8");
  check_scalar(scale_inv, q, op, "scale_inv");
  TANDEM_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op, ": output dtype ",
               dtype_name(dtype), " is not f32, bf16 or f16");
  Tensor qc = q.contiguous();
  Tensor y = Tensor::empty(q.shape(), dtype, q.device());
  be(q).fp8_dequantize(qc, scale_inv, format, y);
  return y;
}

void fp8_amax(const Tensor& x, const Tensor& amax) {
  const char* op = "fp8_amax";
  check_cast_source(x, op);
  check_scalar(amax, x, op, "amax");
  Tensor xc = x.contiguous(), a = amax;
  be(x).fp8_amax(xc, a);
}

Fp8LinearState::Fp8LinearState(const Fp8Recipe& r, Device device)
    : recipe(r),
      forward(r, r.forward_format, 2, device),
      backward(r, r.backward_format, 1, device),
      verdict(Tensor::zeros({1}, DType::f32, device)) {}

void Fp8LinearState::update() const {
  TANDEM_CHECK(forward.defined(), "Fp8LinearState::update on a state that was never made");
  if (recipe.scaling != Fp8Scaling::delayed) return;
  forward.update(verdict);
  backward.update(verdict);
}

void Fp8LinearState::reset_verdict() const {
  TANDEM_CHECK(verdict.defined(), "Fp8LinearState::reset_verdict on a state that was never made");
  Tensor v = verdict;
  be(v).fill(v, 0.0);
}

Tensor fp8_linear(const Tensor& x, const Tensor& w, const Tensor& b, const Fp8LinearState& state) {
  const char* op = "fp8_linear";
  check_defined(x, op, "input");
  check_defined(w, op, "weight");
  for (const Tensor* t : {&x, &w})
    TANDEM_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16, op, ": ", t->str(), " is not f32 or bf16");
  check_dim(w, 2, op, "weight");
  check_same_device(x, w, op);
  TANDEM_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), op, ": input ", x.str(), " does not end in the weight ",
               w.str(), "'s ", w.size(1), " features");
  if (b.defined()) {
    check_dim(b, 1, op, "bias");
    TANDEM_CHECK(b.size(0) == w.size(0), op, ": bias ", b.str(), " for weight ", w.str());
    check_floating(b, op, "bias");
    check_same_device(x, b, op);
  }
  TANDEM_CHECK(state.forward.defined() && state.backward.defined() && state.forward.count() == 2 &&
                   state.forward.device() == x.device(),
               op, ": the state must be an Fp8LinearState made for ", x.device().str());

  const int64_t in_f = w.size(1), out_f = w.size(0), rows = in_f ? x.numel() / in_f : 0;
  const Fp8Format ff = state.recipe.forward_format, bf = state.recipe.backward_format;
  const bool current = state.recipe.scaling == Fp8Scaling::current;
  const Fp8ScaleState fw = state.forward, bw = state.backward;
  const Tensor verdict = state.verdict;
  backend::Backend& bk = be(x);
  Tensor x2 = x.contiguous().detach().view({rows, in_f}), wc = w.contiguous().detach();
  const bool grads = grad_enabled();
  const bool need_dx = grads && x.requires_grad(), need_dw = grads && w.requires_grad();
  const bool need_db = grads && b.defined() && b.requires_grad();

  // Scales: current scaling from the tensors' own maxima now; delayed scaling as they are, the maxima recorded
  // by the casts for the step's update.
  Tensor amax_x = fw.amax(0), amax_w = fw.amax(1);
  if (current) {
    bk.fp8_amax(x2, amax_x);
    bk.fp8_amax(wc, amax_w);
    fw.update(verdict);
    amax_x = amax_w = Tensor();
  }
  // The codes, and the transposed codes a gradient's product reads (dw reads x^T, dx reads w^T).
  Tensor qx = Tensor::empty({rows, in_f}, DType::u8, x.device());
  Tensor qw = Tensor::empty({out_f, in_f}, DType::u8, x.device());
  Tensor qxt = need_dw ? Tensor::empty({in_f, rows}, DType::u8, x.device()) : Tensor();
  Tensor qwt = need_dx ? Tensor::empty({in_f, out_f}, DType::u8, x.device()) : Tensor();
  if (need_dw)
    bk.fp8_quantize_transposed(x2, fw.scale(0), ff, rows, in_f, qx, qxt, amax_x);
  else
    bk.fp8_quantize(x2, fw.scale(0), ff, qx, amax_x);
  if (need_dx)
    bk.fp8_quantize_transposed(wc, fw.scale(1), ff, out_f, in_f, qw, qwt, amax_w);
  else
    bk.fp8_quantize(wc, fw.scale(1), ff, qw, amax_w);
  // The inverse scales as they are now: a later cast (the layer used again) may change the state's.
  Tensor sx_inv = fw.scale_inv(0).clone(), sw_inv = fw.scale_inv(1).clone();

  Tensor y32 = Tensor::empty({rows, out_f}, DType::f32, x.device());
  bk.fp8_gemm(qx, ff, sx_inv, qw, ff, sw_inv, rows, out_f, in_f, y32);
  if (b.defined() && y32.numel()) bk.bias_add(y32, dense_as(b, DType::f32), rows, out_f, 1, y32);
  Tensor y = dense_as(y32, x.dtype());

  const DType x_dtype = x.dtype(), w_dtype = w.dtype(), b_dtype = b.defined() ? b.dtype() : DType::f32;
  const Shape x_shape = x.shape();
  y = record_op(y, {x, w, b}, op,
                [=](const Tensor& g) {
                  backend::Backend& gb = be(g);
                  Tensor g2 = g.contiguous().view({rows, out_f});
                  Tensor amax_g = bw.amax(0);
                  if (current) {
                    gb.fp8_amax(g2, amax_g);
                    bw.update(verdict);
                    amax_g = Tensor();
                  }
                  Tensor qg = Tensor::empty({rows, out_f}, DType::u8, g.device());
                  Tensor qgt = need_dw ? Tensor::empty({out_f, rows}, DType::u8, g.device()) : Tensor();
                  if (need_dw)
                    gb.fp8_quantize_transposed(g2, bw.scale(0), bf, rows, out_f, qg, qgt, amax_g);
                  else
                    gb.fp8_quantize(g2, bw.scale(0), bf, qg, amax_g);
                  const Tensor sg_inv = bw.scale_inv(0);
                  Tensor dx, dw, db;
                  if (need_dx) {  // dx [rows, in] = g [rows, out] w [out, in]: w's transposed codes as the TN B
                    Tensor d = Tensor::empty({rows, in_f}, DType::f32, g.device());
                    gb.fp8_gemm(qg, bf, sg_inv, qwt, ff, sw_inv, rows, in_f, out_f, d);
                    dx = dense_as(d, x_dtype).view(x_shape);
                  }
                  if (need_dw) {  // dw [out, in] = g^T [out, rows] x [rows, in]
                    Tensor d = Tensor::empty({out_f, in_f}, DType::f32, g.device());
                    gb.fp8_gemm(qgt, bf, sg_inv, qxt, ff, sx_inv, out_f, in_f, rows, d);
                    dw = dense_as(d, w_dtype);
                  }
                  if (need_db) {  // the sums of the uncast gradient
                    Tensor d = Tensor::empty({out_f}, DType::f32, g.device());
                    gb.bias_grad(dense_as(g2, DType::f32), rows, out_f, 1, d);
                    db = dense_as(d, b_dtype);
                  }
                  return std::vector<Tensor>{dx, dw, db};
                });
  if (x.dim() == 2) return y;
  Shape out_shape(x_shape.begin(), x_shape.end() - 1);
  out_shape.push_back(out_f);
  return reshape(y, out_shape);
}

}  // namespace tandem
