// CPU backend: scaled dot-product attention fused per (batch, head), f32 and f64.
//
// The composed path (batched products, a masked softmax, products again) copies the query, key and value
// out of a packed projection into [b, h, t, d] tensors, keeps the probabilities of every head, and copies
// its gradients back through the permutes and splits: on a small model those copies took more time than
// the attention's arithmetic. Here each (batch, head) task reads its rows of q, k and v where they are
// (any strides), works on blocks of 64 queries in per-thread buffers (scores, probabilities and their
// gradients stay in the cache) and writes its rows of the output and of the gradients in place. The
// forward keeps each query's log-sum-exp; the backward recomputes the probabilities from it. A causal
// mask is aligned at the top left (query i sees keys 0..i), as the composed path's; dropout draws the
// same counter-based numbers as the composed path's mask ([b h, tq, tk] elements from (seed, offset)).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_sgemm.h"
#include "backend/cpu/cpu_vec_math.h"
#include "core/counter_rng.h"

namespace tandem::backend {

namespace {

constexpr int64_t kQueryBlock = 64;

// Element strides of a 4-D [b, h, t, d] tensor and its typed base pointer.
template <typename T>
struct Rows {
  T* base;
  int64_t s0, s1, s2, s3;
  Rows(const Tensor& t)  // NOLINT: a view of the tensor
      : base(static_cast<T*>(const_cast<void*>(t.data_ptr()))),
        s0(t.strides()[0]),
        s1(t.strides()[1]),
        s2(t.strides()[2]),
        s3(t.strides()[3]) {}
  T* row(int64_t b, int64_t h, int64_t i) const { return base + b * s0 + h * s1 + i * s2; }
};

// rows [i0, i0 + n) of (b, h), d wide, into dst [n, d].
template <typename T>
void gather(const Rows<const T>& r, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t d, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const T* s = r.row(b, h, i0 + i);
    T* o = dst + i * d;
    if (r.s3 == 1)
      for (int64_t j = 0; j < d; ++j) o[j] = s[j];
    else
      for (int64_t j = 0; j < d; ++j) o[j] = s[j * r.s3];
  }
}

// src [n, d] into rows [i0, i0 + n) of (b, h).
template <typename T>
void scatter(const T* src, int64_t n, int64_t d, const Rows<T>& r, int64_t b, int64_t h, int64_t i0) {
  for (int64_t i = 0; i < n; ++i) {
    T* o = r.row(b, h, i0 + i);
    const T* s = src + i * d;
    if (r.s3 == 1)
      for (int64_t j = 0; j < d; ++j) o[j] = s[j];
    else
      for (int64_t j = 0; j < d; ++j) o[j * r.s3] = s[j];
  }
}

// One small row-major product on the calling thread: the own kernel for f32 where it runs, else OpenBLAS
// (serial: ensure_blas_serial ran before the tasks).
// With a causal mask the own kernel skips the triangle tri (cpu::SgemmEpilogue::Triangle) of diagonal `diag`;
// OpenBLAS computes the whole product (the skipped part is zero or unused).
using Tri = cpu::SgemmEpilogue::Triangle;
template <typename T>
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
             int64_t ldb, T beta, T* c, int64_t ldc, Tri tri = Tri::None, int64_t diag = 0) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (cpu::sgemm_fits(m, n)) {
      cpu::SgemmEpilogue e;
      e.triangle = tri;
      e.diagonal = diag;
      cpu::sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, e);
      return;
    }
  }
  cpu::blas_gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// A per-thread buffer of T, grown as needed.
template <typename T>
T* buffer(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

template <typename T>
struct Scratch {
  std::vector<T> q, k, v, s, p, dout, dk, dv, dq;  // gathered operands, scores, probabilities, gradients
};

template <typename T>
Scratch<T>& scratch() {
  thread_local Scratch<T> s;
  return s;
}

// Keys query i of a causal (top-left) or full attention sees.
inline int64_t visible(bool causal, int64_t i, int64_t tk) { return causal ? std::min<int64_t>(tk, i + 1) : tk; }

// The first key query i of batch row b sees: 0, or with packed documents (doc_pos: [batch, tq]) its document's
// first token, i - doc_pos[b, i] (clamped to [0, valid]).
inline int64_t first_key(const int32_t* doc_pos, int64_t b, int64_t tq, int64_t i, int64_t valid) {
  if (!doc_pos) return 0;
  return std::min<int64_t>(valid, std::max<int64_t>(0, i - doc_pos[b * tq + i]));
}

// The dropout factor of probability (bh, i, j): the composed path's mask element.
struct Dropout {
  bool on;
  uint64_t seed, offset;
  float p;
  double keep;
  int64_t tq, tk;
  template <typename T>
  T factor(int64_t bh, int64_t i, int64_t j) const {
    return rng::uniform_f(seed, offset + static_cast<uint64_t>((bh * tq + i) * tk + j)) >= p ? static_cast<T>(keep)
                                                                                               : T(0);
  }
};

// x[j] = e^(scale x[j] - shift) for j < n (the vector exp of cpu_vec_math.h where the target has AVX2).
inline void exp_affine_f32(float* x, int64_t n, float scale, float shift) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 sc = _mm256_set1_ps(scale), sh = _mm256_set1_ps(shift);
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, cpu::exp256(_mm256_fmsub_ps(sc, _mm256_loadu_ps(x + j), sh)));
#endif
  for (; j < n; ++j) x[j] = cpu::exp_f32(scale * x[j] - shift);
}

// Row r of the scores s (kv long) into probabilities over its entries [first, valid) (the rest 0), scaled by
// `scale` first; returns the row's log-sum-exp of the scaled scores (-inf for an empty row).
template <typename T>
T softmax_row(T* s, int64_t kv, int64_t first, int64_t valid, T scale) {
  if (valid <= first) {
    for (int64_t j = 0; j < kv; ++j) s[j] = T(0);
    return -std::numeric_limits<T>::infinity();
  }
  for (int64_t j = 0; j < first; ++j) s[j] = T(0);
  T* sv = s + first;
  const int64_t n = valid - first;
  T lse;
  if constexpr (std::is_same_v<T, float>) {
    float lo, mx;
    cpu::min_max_f32(sv, n, lo, mx);
    if (std::isinf(mx) && mx < 0) mx = 0.0f;
    const double sum = cpu::exp_sum_f32<true>(sv, sv, n, scale, mx, lo);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) sv[j] *= inv;
    lse = static_cast<float>(scale * mx + std::log(sum));
  } else {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, scale * sv[j]);
    if (std::isinf(mx) && mx < 0) mx = 0.0;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += (sv[j] = std::exp(scale * sv[j] - mx));
    const double inv = 1.0 / sum;
    for (int64_t j = 0; j < n; ++j) sv[j] *= inv;
    lse = static_cast<T>(mx + std::log(sum));
  }
  for (int64_t j = valid; j < kv; ++j) s[j] = T(0);
  return lse;
}

// Rows [i0, i0 + n) of (b, h) as a row-major matrix for the products: in place (rows s2 apart) where the last
// dimension is contiguous, else gathered into buf.
template <typename T>
struct Mat {
  const T* p;
  int64_t ld;
};
template <typename T>
Mat<T> operand(const Rows<const T>& r, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t d, std::vector<T>& buf) {
  if (r.s3 == 1) return {r.row(b, h, i0), r.s2};
  T* dst = buffer(buf, n * d);
  gather(r, b, h, i0, n, d, dst);
  return {dst, d};
}

// Where a product writes rows [i0, i0 + n) of (b, h) of an output: in place where the last dimension is
// contiguous, else into buf (then `out` says to scatter it).
template <typename T>
struct Out {
  T* p;
  int64_t ld;
  bool scatter;
};
template <typename T>
Out<T> output(const Rows<T>& r, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t d, std::vector<T>& buf) {
  if (r.s3 == 1) return {r.row(b, h, i0), r.s2, false};
  return {buffer(buf, n * d), d, true};
}

// The key and value heads (grouped-query attention: a divisor of the query heads; 0 in the geometry: as many).
int64_t kv_heads_of(const AttentionGeom& g) { return g.kv_heads > 0 ? g.kv_heads : g.heads; }
// Query heads per key-value head (0 when there are no heads).
int64_t group_of(const AttentionGeom& g) { return kv_heads_of(g) > 0 ? g.heads / kv_heads_of(g) : 0; }

template <typename T>
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeom& g, const Dropout& drop, Tensor& o,
             Tensor& stats) {
  const Rows<const T> rq(q), rk(k), rv(v);
  const Rows<T> ro(o);
  T* lse = static_cast<T*>(stats.data_ptr());  // [b, h, tq], contiguous
  const int64_t tq = g.tq, tk = g.tk, d = g.d, dv = g.dv;
  const T scale = static_cast<T>(g.scale);
  const int64_t kv_all = g.causal ? std::min(tk, tq) : tk;  // keys any query sees
  const int64_t group = group_of(g);  // query heads per key-value head
  const int32_t* doc_pos = g.doc_pos.defined() ? g.doc_pos.data<int32_t>() : nullptr;
  cpu::parallel_tasks(g.batch * g.heads, cpu::max_threads(), [&](int64_t bh, int) {
    const int64_t b = bh / g.heads, h = bh % g.heads, kh = h / group;
    Scratch<T>& sc = scratch<T>();
    const Mat<T> km = operand(rk, b, kh, 0, kv_all, d, sc.k), vm = operand(rv, b, kh, 0, kv_all, dv, sc.v);
    for (int64_t q0 = 0; q0 < tq; q0 += kQueryBlock) {
      const int64_t br = std::min(kQueryBlock, tq - q0);
      const int64_t kv = g.causal ? std::min(tk, q0 + br) : tk;
      const Mat<T> qm = operand(rq, b, h, q0, br, d, sc.q);
      const Out<T> om = output(ro, b, h, q0, br, dv, sc.dq);
      T* s = buffer(sc.s, br * std::max<int64_t>(kv, 1));
      // Causal: query q0 + r sees keys up to q0 + r; the scores past that are not computed, the probabilities
      // there are zero (set by softmax_row) and skipped by the product with the values.
      const Tri upper = g.causal ? Tri::UpperC : Tri::None, lower = g.causal ? Tri::LowerA : Tri::None;
      product<T>(false, true, br, kv, d, T(1), qm.p, qm.ld, km.p, km.ld, T(0), s, kv, upper, q0);
      for (int64_t r = 0; r < br; ++r) {
        const int64_t i = q0 + r, valid = visible(g.causal, i, tk), first = first_key(doc_pos, b, tq, i, valid);
        T* row = s + r * kv;
        lse[bh * tq + i] = softmax_row<T>(row, kv, first, valid, scale);
        if (drop.on)
          for (int64_t j = first; j < valid; ++j) row[j] *= drop.factor<T>(bh, i, j);
      }
      if (kv > 0) {
        product<T>(false, false, br, dv, kv, T(1), s, kv, vm.p, vm.ld, T(0), om.p, om.ld, lower, q0);
      } else {
        for (int64_t r = 0; r < br; ++r)
          for (int64_t j = 0; j < dv; ++j) om.p[r * om.ld + j] = T(0);
      }
      if (om.scatter) scatter(om.p, br, dv, ro, b, h, q0);
    }
  });
}

template <typename T>
void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& stats,
              const AttentionGeom& g, const Dropout& drop, Tensor& dq, Tensor& dk, Tensor& dvt) {
  const Rows<const T> rq(q), rk(k), rv(v), rg(dout);
  const Rows<T> rdq(dq), rdk(dk), rdv(dvt);
  const T* lse = static_cast<const T*>(stats.data_ptr());
  const int64_t tq = g.tq, tk = g.tk, d = g.d, dv = g.dv;
  const T scale = static_cast<T>(g.scale);
  const int64_t kv_all = g.causal ? std::min(tk, tq) : tk;
  // One task per key-value head: it owns that head's key and value gradients, summed over the query heads
  // that read it (grouped-query attention: heads / kv_heads of them, one after the other).
  const int64_t kvh = kv_heads_of(g), group = group_of(g);
  const int32_t* doc_pos = g.doc_pos.defined() ? g.doc_pos.data<int32_t>() : nullptr;
  cpu::parallel_tasks(g.batch * kvh, cpu::max_threads(), [&](int64_t bkh, int) {
    const int64_t b = bkh / kvh, kh = bkh % kvh;
    Scratch<T>& sc = scratch<T>();
    const Mat<T> km = operand(rk, b, kh, 0, kv_all, d, sc.k), vm = operand(rv, b, kh, 0, kv_all, dv, sc.v);
    // The key and value gradients are accumulated over the blocks of queries, from zero: keys no query sees
    // keep a zero gradient.
    const Out<T> dkm = output(rdk, b, kh, 0, tk, d, sc.dk), dvm = output(rdv, b, kh, 0, tk, dv, sc.dv);
    for (int64_t r = 0; r < tk; ++r) {
      for (int64_t j = 0; j < d; ++j) dkm.p[r * dkm.ld + j] = T(0);
      for (int64_t j = 0; j < dv; ++j) dvm.p[r * dvm.ld + j] = T(0);
    }
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
    const int64_t bh = b * g.heads + h;
    for (int64_t q0 = 0; q0 < tq; q0 += kQueryBlock) {
      const int64_t br = std::min(kQueryBlock, tq - q0);
      const int64_t kv = g.causal ? std::min(tk, q0 + br) : tk;
      const Mat<T> qm = operand(rq, b, h, q0, br, d, sc.q), gm = operand(rg, b, h, q0, br, dv, sc.dout);
      const Out<T> dqm = output(rdq, b, h, q0, br, d, sc.dq);
      if (kv == 0) {
        for (int64_t r = 0; r < br; ++r)
          for (int64_t j = 0; j < d; ++j) dqm.p[r * dqm.ld + j] = T(0);
        if (dqm.scatter) scatter(dqm.p, br, d, rdq, b, h, q0);
        continue;
      }
      T* p = buffer(sc.p, br * kv);
      T* ds = buffer(sc.s, br * kv);
      // The probabilities again, from the scores and the forward's log-sum-exp. Causal, the products skip
      // what is zero or unused as the forward's do: above the diagonal of P, dP and dS (q0 + r sees keys up
      // to q0 + r), and the matching triangles of their transposes.
      const Tri upper_c = g.causal ? Tri::UpperC : Tri::None, lower_a = g.causal ? Tri::LowerA : Tri::None,
                upper_a = g.causal ? Tri::UpperA : Tri::None;
      product<T>(false, true, br, kv, d, T(1), qm.p, qm.ld, km.p, km.ld, T(0), p, kv, upper_c, q0);
      for (int64_t r = 0; r < br; ++r) {
        const int64_t i = q0 + r, valid = visible(g.causal, i, tk), first = first_key(doc_pos, b, tq, i, valid);
        const T l = lse[bh * tq + i];
        T* row = p + r * kv;
        for (int64_t j = 0; j < first; ++j) row[j] = T(0);
        if constexpr (std::is_same_v<T, float>) {
          exp_affine_f32(row + first, valid - first, scale, l);
        } else {
          for (int64_t j = first; j < valid; ++j) row[j] = std::exp(scale * row[j] - l);
        }
        for (int64_t j = valid; j < kv; ++j) row[j] = T(0);
      }
      // dV += (P with dropout)^T dO. With dropout the dropped probabilities go to ds for the product.
      const T* pd = p;
      if (drop.on) {
        for (int64_t r = 0; r < br; ++r)
          for (int64_t j = 0; j < kv; ++j) ds[r * kv + j] = p[r * kv + j] * drop.factor<T>(bh, q0 + r, j);
        pd = ds;
      }
      product<T>(true, false, kv, dv, br, T(1), pd, kv, gm.p, gm.ld, T(1), dvm.p, dvm.ld, upper_a, -q0);
      // dP = dO V^T (times the dropout mask), then dS = P (dP - the row's sum of P dP), in ds; zero past the
      // keys each query sees (the product may have left those entries unwritten).
      product<T>(false, true, br, kv, dv, T(1), gm.p, gm.ld, vm.p, vm.ld, T(0), ds, kv, upper_c, q0);
      for (int64_t r = 0; r < br; ++r) {
        T* dr = ds + r * kv;
        const T* pr = p + r * kv;
        const int64_t valid = visible(g.causal, q0 + r, tk), first = first_key(doc_pos, b, tq, q0 + r, valid);
        if (drop.on)
          for (int64_t j = first; j < valid; ++j) dr[j] *= drop.factor<T>(bh, q0 + r, j);
        T dot;
        if constexpr (std::is_same_v<T, float>) {
          dot = static_cast<float>(cpu::dot_f32(dr + first, pr + first, valid - first));
        } else {
          double acc = 0.0;
          for (int64_t j = first; j < valid; ++j) acc += dr[j] * pr[j];
          dot = acc;
        }
        for (int64_t j = 0; j < first; ++j) dr[j] = T(0);
        for (int64_t j = first; j < valid; ++j) dr[j] = pr[j] * (dr[j] - dot);
        for (int64_t j = valid; j < kv; ++j) dr[j] = T(0);
      }
      // dQ = scale dS K; dK += scale dS^T Q.
      product<T>(false, false, br, d, kv, scale, ds, kv, km.p, km.ld, T(0), dqm.p, dqm.ld, lower_a, q0);
      if (dqm.scatter) scatter(dqm.p, br, d, rdq, b, h, q0);
      product<T>(true, false, kv, d, br, scale, ds, kv, qm.p, qm.ld, T(1), dkm.p, dkm.ld, upper_a, -q0);
    }
    }
    if (dkm.scatter) scatter(dkm.p, tk, d, rdk, b, kh, 0);
    if (dvm.scatter) scatter(dvm.p, tk, dv, rdv, b, kh, 0);
  });
}

Dropout dropout_of(const AttentionGeom& g, uint64_t seed, uint64_t offset) {
  return Dropout{g.dropout_p > 0.0, seed, offset, static_cast<float>(g.dropout_p), 1.0 / (1.0 - g.dropout_p), g.tq,
                 g.tk};
}

void check_geometry(const AttentionGeom& g, const Tensor& q, const Tensor& k, const Tensor& v, const char* what) {
  TANDEM_ASSERT(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.dtype() == k.dtype() && q.dtype() == v.dtype() &&
                    q.size(0) == g.batch && q.size(1) == g.heads && q.size(2) == g.tq && q.size(3) == g.d &&
                    k.size(0) == g.batch && k.size(1) == kv_heads_of(g) && v.size(1) == kv_heads_of(g) &&
                    k.size(2) == g.tk && k.size(3) == g.d && v.size(2) == g.tk && v.size(3) == g.dv,
                what, ": ", q.str(), ", ", k.str(), ", ", v.str(), " for the geometry");
}

}  // namespace

bool CpuBackend::fused_attention_supported(const AttentionGeom& g, DType dtype, int) {
  // TANDEM_ATTENTION_MATH=1 keeps every attention on the math path, as on CUDA (comparisons, benchmarks).
  static const bool math_only = [] {
    const char* v = std::getenv("TANDEM_ATTENTION_MATH");
    return v && std::string(v) == "1";
  }();
  const bool grouping = g.kv_heads == 0 || (g.kv_heads > 0 && g.heads % g.kv_heads == 0);
  return !math_only && grouping && (dtype == DType::f32 || dtype == DType::f64) && g.batch >= 0 &&
         g.heads >= 0 && g.tq >= 0 && g.tk >= 0 && g.d > 0 && g.dv > 0;
}

void CpuBackend::fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeom& g,
                                         uint64_t seed, uint64_t offset, Tensor& o, Tensor& stats) {
  check_geometry(g, q, k, v, "fused_attention_forward");
  TANDEM_ASSERT(o.dim() == 4 && o.dtype() == q.dtype() && stats.dtype() == q.dtype() && stats.is_contiguous() &&
                    stats.numel() == g.batch * g.heads * g.tq,
                "fused_attention_forward: output ", o.str(), ", statistics ", stats.str());
  if (g.batch * g.heads * g.tq == 0) return;
  cpu::ensure_blas_serial();
  const Dropout drop = dropout_of(g, seed, offset);
  dispatch_float(q.dtype(), "scaled_dot_product_attention",
                 [&](auto tag) { forward<decltype(tag)>(q, k, v, g, drop, o, stats); });
}

void CpuBackend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
                                          const Tensor& dout, const Tensor& stats, const AttentionGeom& g,
                                          uint64_t seed, uint64_t offset, Tensor& dq, Tensor& dk, Tensor& dv) {
  check_geometry(g, q, k, v, "fused_attention_backward");
  TANDEM_ASSERT(dout.dim() == 4 && dq.dim() == 4 && dk.dim() == 4 && dv.dim() == 4 && stats.is_contiguous() &&
                    stats.dtype() == q.dtype(),
                "fused_attention_backward: gradients ", dout.str(), ", ", dq.str(), ", ", dk.str(), ", ", dv.str());
  if (g.batch * g.heads == 0) return;
  cpu::ensure_blas_serial();
  const Dropout drop = dropout_of(g, seed, offset);
  dispatch_float(q.dtype(), "scaled_dot_product_attention backward",
                 [&](auto tag) { backward<decltype(tag)>(q, k, v, dout, stats, g, drop, dq, dk, dv); });
}

}  // namespace tandem::backend
