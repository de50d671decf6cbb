// Scaled dot-product attention. 16-bit inputs on a GPU go through the backend's fused kernels (cuDNN's
// flash attention) when it takes the geometry, and so do f32 and f64 inputs on the CPU (the CPU backend's
// kernel per batch and head, which reads and writes the operands in place); every other case computes the
// math: batched products, a scaled and masked softmax, dropout with the counter-based generator, and the
// products again, with a backward written from the same kernels (so it runs on every backend and
// gradchecks in f64).
#include <array>
#include <cmath>
#include <cstdint>

#include "core/tensor_impl.h"
#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {

using namespace ops;
using backend::AttentionGeom;
using backend::Binary;

namespace {

// The fused path reads an operand in place when it is of the compute type with its last dimension
// contiguous and 16-byte aligned strides and address (the query, key and value of a [b, t, 3 h d]
// projection, split and viewed as [b, h, t, d], qualify); others are copied to contiguous [b, h, t, d].
bool fused_reads_in_place(const Tensor& x, DType cdt) {
  const Shape& st = x.strides();
  if (x.dtype() != cdt || st.size() != 4 || st[3] != 1 || reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0)
    return false;
  for (int i = 0; i < 3; ++i)
    if (st[i] % 8 != 0 || st[i] <= 0) return false;
  return true;
}

Tensor fused_operand(const Tensor& x, DType cdt) { return fused_reads_in_place(x, cdt) ? x : to_dense(x, cdt, false); }

// Whether the fused kernels may take inputs of compute type cdt on x's device: 16-bit ones on a GPU; f32 and
// f64 ones on the CPU, whose kernel reads any strides.
bool fused_kind(const Tensor& x, DType cdt) {
  return x.device().is_cuda() ? is_half(cdt) : (cdt == DType::f32 || cdt == DType::f64);
}

// The log-sum-exp statistics' type: f64 for f64 attention, f32 otherwise.
DType stats_dtype(DType cdt) { return cdt == DType::f64 ? DType::f64 : DType::f32; }

std::array<int64_t, 4> strides_of(const Tensor& x) {
  const Shape& st = x.strides();
  return {st[0], st[1], st[2], st[3]};
}

// A new [b, h, t, d] tensor laid out as [b, t, h, d]: the fused path's outputs and gradients.
Tensor empty_bthd(int64_t b, int64_t h, int64_t t, int64_t d, DType dtype, Device dev) {
  return Tensor::empty({b, t, h, d}, dtype, dev).transpose(1, 2);
}

// x ([b, h, t, d], any layout) as a [b, t, h, d]-laid-out tensor of type dtype (x itself when it is one).
Tensor as_bthd(const Tensor& x, DType dtype) {
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  const Shape& st = x.strides();
  if (x.dtype() == dtype && st[3] == 1 && st[2] == h * d && st[1] == d && st[0] == t * h * d) return x;
  Tensor out = Tensor::empty({b, t, h, d}, dtype, x.device());
  out.copy_(x.transpose(1, 2));
  return out.transpose(1, 2);
}

// q, k and v as the user gave them (the op's inputs in the autograd graph); qf, kf and vf as the fused
// path reads them (fused_operand), their strides in g.
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qf, const Tensor& kf,
                       const Tensor& vf, const AttentionGeom& g, DType cdt, uint64_t seed, uint64_t offset) {
  Tensor o = empty_bthd(g.batch, g.heads, g.tq, g.dv, cdt, q.device());
  Tensor stats = Tensor::empty({g.batch, g.heads, g.tq}, stats_dtype(cdt), q.device());
  be(q).fused_attention_forward(qf, kf, vf, g, seed, offset, o, stats);
  Tensor so = o.detach(), qc = qf.detach(), kc = kf.detach(), vc = vf.detach();
  const DType qt = q.dtype(), kt = k.dtype(), vt = v.dtype();
  return record_op(o, {q, k, v}, "scaled_dot_product_attention",
                   [qc, kc, vc, so, stats, g, seed, offset, cdt, qt, kt, vt](const Tensor& grad) {
    // The CPU's kernel reads the gradient in any layout; the GPU's wants [b, t, h, d].
    Tensor dout = grad.device().is_cuda() ? as_bthd(grad, cdt) : grad.dtype() == cdt ? grad : grad.to(cdt);
    const Device dev = qc.device();
    const int64_t hk = g.kv_heads > 0 ? g.kv_heads : g.heads;
    Tensor dq = empty_bthd(g.batch, g.heads, g.tq, g.d, cdt, dev), dk = empty_bthd(g.batch, hk, g.tk, g.d, cdt, dev),
           dv = empty_bthd(g.batch, hk, g.tk, g.dv, cdt, dev);
    be(dout).fused_attention_backward(qc, kc, vc, so, dout, stats, g, seed, offset, dq, dk, dv);
    return std::vector<Tensor>{qt == cdt ? dq : dq.to(qt), kt == cdt ? dk : dk.to(kt), vt == cdt ? dv : dv.to(vt)};
  });
}

Tensor math_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeom& g, DType out_dtype,
                      uint64_t seed, uint64_t offset) {
  // Scores, probabilities and products in f32 (f64 for f64 inputs).
  const DType ct = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const int64_t bh = g.batch * g.heads, tq = g.tq, tk = g.tk, d = g.d, dv = g.dv;
  Tensor qm = to_dense(q, ct, false), km = to_dense(k, ct, false), vm = to_dense(v, ct, false);
  Tensor p = Tensor::empty({bh, tq, tk}, ct, q.device());
  Tensor o = Tensor::empty({g.batch, g.heads, tq, dv}, ct, q.device());
  Tensor mask, pd;
  if (o.numel() > 0) {
    backend::Backend& b = be(q);
    b.gemm_batched(false, true, bh, tq, tk, d, 1.0, qm, tq * d, km, tk * d, 0.0, p, tq * tk);
    if (p.numel() && g.doc_pos.defined()) b.attention_mask_documents(p, g.heads, g.doc_pos);
    if (p.numel()) b.attention_softmax(p, bh, tq, tk, g.scale, g.causal, p);
    pd = p;
    if (g.dropout_p > 0.0 && p.numel()) {
      mask = Tensor::empty(p.shape(), ct, q.device());
      b.dropout_mask(mask, seed, offset, g.dropout_p);
      pd = binary_raw(Binary::Mul, p, mask);
    }
    b.gemm_batched(false, false, bh, tq, dv, tk, 1.0, pd, tq * tk, vm, tk * dv, 0.0, o, tq * dv);
  }
  Tensor out = o.to(out_dtype);
  const bool need_q = q.requires_grad(), need_k = k.requires_grad(), need_v = v.requires_grad();
  const DType qt = q.dtype(), kt = k.dtype(), vt = v.dtype();
  const Precision prec = current_precision();
  Tensor sq = qm.detach(), sk = km.detach(), sv = vm.detach(), sp = p.detach();
  Tensor spd = pd.defined() ? pd.detach() : Tensor(), smask = mask.defined() ? mask.detach() : Tensor();
  return record_op(out, {q, k, v}, "scaled_dot_product_attention",
                   [sq, sk, sv, sp, spd, smask, g, ct, need_q, need_k, need_v, qt, kt, vt, prec](const Tensor& grad) {
    PrecisionScope scope(prec);
    const int64_t bh = g.batch * g.heads, tq = g.tq, tk = g.tk, d = g.d, dv = g.dv;
    Tensor dq = Tensor::zeros(sq.shape(), ct, sq.device()), dk = Tensor::zeros(sk.shape(), ct, sq.device()),
           dvv = Tensor::zeros(sv.shape(), ct, sq.device());
    if (bh * tq * tk > 0) {
      Tensor dout = to_dense(grad, ct, false);
      backend::Backend& b = be(dout);
      if (need_v) b.gemm_batched(true, false, bh, tk, dv, tq, 1.0, spd, tq * tk, dout, tq * dv, 0.0, dvv, tk * dv);
      if (need_q || need_k) {
        Tensor dp = Tensor::empty(sp.shape(), ct, sq.device());
        b.gemm_batched(false, true, bh, tq, tk, dv, 1.0, dout, tq * dv, sv, tk * dv, 0.0, dp, tq * tk);
        if (smask.defined()) b.binary(Binary::Mul, dp, smask, dp);
        // The scores' gradient; the mask needs nothing more: masked probabilities are 0, and so is their share.
        b.softmax_backward(dp, sp, bh * tq, tk, 1, false, dp);
        if (need_q) b.gemm_batched(false, false, bh, tq, d, tk, g.scale, dp, tq * tk, sk, tk * d, 0.0, dq, tq * d);
        if (need_k) b.gemm_batched(true, false, bh, tk, d, tq, g.scale, dp, tq * tk, sq, tq * d, 0.0, dk, tk * d);
      }
    }
    return std::vector<Tensor>{need_q ? dq.to(qt) : Tensor(), need_k ? dk.to(kt) : Tensor(),
                               need_v ? dvv.to(vt) : Tensor()};
  });
}

// Packed documents' positions (AttentionGeom::doc_pos) checked against the attention's batch b and t queries
// and keys; undefined stays undefined.
Tensor document_positions(const Tensor& pos, int64_t b, int64_t tq, int64_t tk, bool causal, const Tensor& like,
                          const char* op) {
  if (!pos.defined()) return pos;
  TANDEM_CHECK(causal && tq == tk, op, ": document positions need causal self-attention (as many keys as queries), ",
               "got ", tq, " queries and ", tk, " keys", causal ? "" : " without the causal mask");
  TANDEM_CHECK(pos.dtype() == DType::i32 && pos.dim() == 2 && pos.size(0) == b && pos.size(1) == tq, op,
               ": document positions must be i32 [", b, ", ", tq, "] (each token's position in its document), got ",
               pos.str());
  check_same_device(like, pos, op);
  return pos.is_contiguous() ? pos.detach() : pos.contiguous().detach();
}

// The [b, h, t, d] view of the h heads that start `first` heads into each row of a packed [b, t, w] tensor.
Tensor packed_part(const Tensor& qkv, int64_t h, int64_t first, int64_t d) {
  const int64_t b = qkv.size(0), t = qkv.size(1), w = qkv.size(2);
  return as_strided(qkv, {b, h, t, d}, {t * w, d, w, 1}, qkv.storage_offset() + first * d);
}

}  // namespace

Tensor packed_self_attention(const Tensor& qkv, int64_t heads, bool causal, double dropout_p, double scale,
                             Generator* gen, const Tensor& doc_positions) {
  const char* op = "packed_self_attention";
  check_dim(qkv, 3, op, "qkv");
  check_floating(qkv, op, "qkv");
  TANDEM_CHECK(heads > 0 && qkv.size(2) % (3 * heads) == 0, op, ": qkv ", qkv.str(), " must hold the query, key and ",
               "value of ", heads, " heads side by side along dimension 2 (its extent a multiple of 3 x ", heads, ")");
  return packed_self_attention(qkv, heads, heads, causal, dropout_p, scale, gen, doc_positions);
}

Tensor packed_self_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal, double dropout_p,
                             double scale, Generator* gen, const Tensor& doc_positions) {
  const char* op = "packed_self_attention";
  check_dim(qkv, 3, op, "qkv");
  check_floating(qkv, op, "qkv");
  TANDEM_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, op, ": kv_heads ", kv_heads,
               " must be a positive divisor of heads ", heads);
  const int64_t parts = heads + 2 * kv_heads;
  TANDEM_CHECK(qkv.size(2) % parts == 0, op, ": qkv ", qkv.str(), " must hold ", heads, " query, ", kv_heads,
               " key and ", kv_heads, " value heads side by side along dimension 2 (its extent a multiple of ", parts,
               ")");
  const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / parts, c = heads * d;
  const Tensor doc_pos = document_positions(doc_positions, b, t, t, causal, qkv, op);
  auto composed = [&] {
    std::vector<Tensor> qkv_parts = split(qkv, {c, kv_heads * d, kv_heads * d}, 2);
    auto by_head = [&](const Tensor& y, int64_t h) { return permute(reshape(y, {b, t, h, d}), {0, 2, 1, 3}); };
    Tensor a = scaled_dot_product_attention(by_head(qkv_parts[0], heads), by_head(qkv_parts[1], kv_heads),
                                            by_head(qkv_parts[2], kv_heads), causal, dropout_p, scale, gen, doc_pos);
    return reshape(permute(a, {0, 2, 1, 3}), {b, t, c});
  };
  const DType cdt = compute_dtype(qkv.device(), current_precision(), qkv.dtype());
  if (!fused_kind(qkv, cdt) || qkv.dtype() != cdt || !qkv.is_contiguous() || b * t * d == 0) return composed();
  TANDEM_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout probability ", dropout_p, " outside [0, 1)");
  TANDEM_CHECK(dropout_p == 0.0 || gen != nullptr, op, ": dropout_p ", dropout_p, " needs a generator");
  Tensor base = qkv.detach();
  Tensor q = packed_part(base, heads, 0, d), k = packed_part(base, kv_heads, heads, d),
         v = packed_part(base, kv_heads, heads + kv_heads, d);
  if (qkv.device().is_cuda() &&
      (!fused_reads_in_place(q, cdt) || !fused_reads_in_place(k, cdt) || !fused_reads_in_place(v, cdt)))
    return composed();
  AttentionGeom g;
  g.batch = b;
  g.heads = heads;
  g.kv_heads = kv_heads;
  g.tq = g.tk = t;
  g.d = g.dv = d;
  g.causal = causal;
  g.scale = scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(d));
  g.dropout_p = dropout_p;
  g.q_strides = strides_of(q);
  g.k_strides = strides_of(k);
  g.v_strides = strides_of(v);
  g.grads_like_inputs = true;
  g.doc_pos = doc_pos;
  if (!be(qkv).fused_attention_supported(g, cdt, qkv.device().index)) return composed();
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0.0) {  // the draws scaled_dot_product_attention would take
    seed = gen->seed();
    offset = gen->advance(static_cast<uint64_t>(b * heads * t * t));
  }
  Tensor y = Tensor::empty({b, t, c}, cdt, qkv.device());
  Tensor o = as_strided(y, {b, heads, t, d}, {t * c, d, c, 1}, 0);  // [b, t, h, d] in memory
  Tensor stats = Tensor::empty({b, heads, t}, stats_dtype(cdt), qkv.device());
  be(qkv).fused_attention_forward(q, k, v, g, seed, offset, o, stats);
  Tensor so = o.detach();
  return record_op(y, {qkv}, op,
                   [base, q, k, v, so, stats, g, seed, offset, cdt, heads, kv_heads, b, t, d](const Tensor& grad) {
    const int64_t c = heads * d;
    Tensor gd = to_dense(grad, cdt, false);
    Tensor dout = as_strided(gd, {b, heads, t, d}, {t * c, d, c, 1}, gd.storage_offset());
    Tensor dqkv = Tensor::empty(base.shape(), cdt, base.device());
    Tensor dq = packed_part(dqkv, heads, 0, d), dk = packed_part(dqkv, kv_heads, heads, d),
           dv = packed_part(dqkv, kv_heads, heads + kv_heads, d);
    be(dout).fused_attention_backward(q, k, v, so, dout, stats, g, seed, offset, dq, dk, dv);
    return std::vector<Tensor>{dqkv};
  });
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    double scale, Generator* gen, const Tensor& doc_positions) {
  const char* op = "scaled_dot_product_attention";
  check_dim(q, 4, op, "query");
  check_dim(k, 4, op, "key");
  check_dim(v, 4, op, "value");
  check_floating(q, op, "query");
  TANDEM_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op, ": query ", q.str(), ", key ", k.str(),
               " and value ", v.str(), " differ in dtype");
  check_same_device(q, k, op);
  check_same_device(q, v, op);
  TANDEM_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && v.size(1) == k.size(1) && k.size(1) > 0 &&
                   q.size(1) % k.size(1) == 0,
               op, ": query ", q.str(), ", key ", k.str(), " and value ", v.str(),
               " must agree in batch, and the key's and value's heads must be the same number, dividing the "
               "query's (dimensions 0 and 1 of [B, H, T, d])");
  TANDEM_CHECK(k.size(3) == q.size(3), op, ": key ", k.str(), " has head size ", k.size(3), ", the query ", q.str(),
               " ", q.size(3), " (dimension 3)");
  TANDEM_CHECK(v.size(2) == k.size(2), op, ": value ", v.str(), " has ", v.size(2), " positions, the key ", k.str(), " ",
               k.size(2), " (dimension 2)");
  TANDEM_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout probability ", dropout_p, " outside [0, 1)");
  TANDEM_CHECK(dropout_p == 0.0 || gen != nullptr, op, ": dropout_p ", dropout_p, " needs a generator");
  AttentionGeom g;
  g.batch = q.size(0);
  g.heads = q.size(1);
  g.tq = q.size(2);
  g.tk = k.size(2);
  g.d = q.size(3);
  g.dv = v.size(3);
  g.kv_heads = k.size(1);
  g.causal = causal;
  g.scale = scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(g.d, 1)));
  g.dropout_p = dropout_p;
  g.doc_pos = document_positions(doc_positions, g.batch, g.tq, g.tk, causal, q, op);
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0.0) {
    seed = gen->seed();
    offset = gen->advance(static_cast<uint64_t>(g.batch * g.heads * g.tq * g.tk));
  }
  // Under a 16-bit precision on CUDA, f32 inputs are taken in 16-bit (as linear and conv2d take theirs).
  const DType cdt = compute_dtype(q.device(), current_precision(), q.dtype());
  const bool fusable = fused_kind(q, cdt) && g.batch * g.heads * g.tq * g.tk * g.d * g.dv > 0;
  if (fusable) {
    // The operands as the fused path reads them: in place where their layout allows (fused_operand; the CPU's
    // kernel reads any layout of the compute type).
    auto operand = [&](const Tensor& x) {
      return q.device().is_cuda() ? fused_operand(x, cdt) : x.dtype() == cdt ? x : to_dense(x, cdt, false);
    };
    Tensor qf = operand(q), kf = operand(k), vf = operand(v);
    g.q_strides = strides_of(qf);
    g.k_strides = strides_of(kf);
    g.v_strides = strides_of(vf);
    if (be(q).fused_attention_supported(g, cdt, q.device().index)) return fused_attention(q, k, v, qf, kf, vf, g, cdt, seed, offset);
    g.q_strides = g.k_strides = g.v_strides = {};
  }
  if (g.kv_heads != g.heads) {
    // Grouped-query attention by products: each key and value head repeated for the query heads of its group (the
    // gradient of a repeat adds the group's up).
    const int64_t groups = g.heads / g.kv_heads;
    auto repeat_heads = [&](const Tensor& x) {
      Tensor e = expand(unsqueeze(x, {2}), {x.size(0), x.size(1), groups, x.size(2), x.size(3)});
      return reshape(e, {x.size(0), x.size(1) * groups, x.size(2), x.size(3)});
    };
    g.kv_heads = g.heads;
    return math_attention(q, repeat_heads(k), repeat_heads(v), g, is_half(cdt) ? cdt : q.dtype(), seed, offset);
  }
  return math_attention(q, k, v, g, is_half(cdt) ? cdt : q.dtype(), seed, offset);
}

}  // namespace tandem
