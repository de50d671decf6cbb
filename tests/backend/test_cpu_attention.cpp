// The CPU's fused attention (backend/cpu/cpu_attention.cpp, taken by scaled_dot_product_attention and
// packed_self_attention for f32 and f64) against attention written out with ops in f64: scores, a causal mask,
// softmax, the dropout mask of the same draws, the product with the values, and the gradients of all three
// inputs. Shapes cross the kernel's blocks of 64 queries, its 6 x 16 tiles and the 8 float lanes; inputs are
// packed, transposed and strided (the last dimension not contiguous); results do not depend on the threads.
#include <cmath>

#include "cpu_test_util.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

struct Case {
  int64_t b, h, tq, tk, d, dv;
  bool causal;
  int64_t kvh = 0;  // key-value heads (grouped-query attention); 0: h
};

// The key or value heads repeated for the query heads that read them (head i of h reads head i / (h / kvh)).
Tensor repeat_heads(const Tensor& x, int64_t h) {
  const int64_t kvh = x.size(1);
  if (kvh == h) return x;
  std::vector<Tensor> heads;
  for (int64_t i = 0; i < h; ++i) heads.push_back(slice(x, 1, i / (h / kvh), 1));
  return cat(heads, 1);
}

// softmax(scale q k^T (+ -inf above the diagonal)) (times the dropout mask) v, by ops in the inputs' type.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Tensor& drop_mask) {
  const int64_t tq = q.size(2), tk = k.size(2);
  Tensor s = scale(matmul(q, transpose(k, 2, 3)), 1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (causal) {
    std::vector<double> m(static_cast<size_t>(tq * tk), 0.0);
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = i + 1; j < tk; ++j) m[static_cast<size_t>(i * tk + j)] = -1e300;
    s = add(s, Tensor::from_vector(m, {tq, tk}).to(q.dtype()));
  }
  Tensor p = softmax(s, -1);
  if (drop_mask.defined()) p = mul(p, drop_mask);
  return matmul(p, v);
}

// Output and input gradients of sum(out * w) for attention `f` of (q, k, v).
template <typename F>
std::vector<Tensor> run(F f, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w) {
  Tensor qq = q.detach(), kk = k.detach(), vv = v.detach();
  for (Tensor* t : {&qq, &kk, &vv}) t->requires_grad_();
  Tensor out = f(qq, kk, vv);
  backward(sum(mul(out, w)));
  return {out.detach(), qq.grad(), kk.grad(), vv.grad()};
}

void expect_matches_reference(const Case& c, DType dt, int seed, const std::string& layout) {
  Generator gen(static_cast<uint64_t>(seed));
  Tensor q64 = Tensor::uniform({c.b, c.h, c.tq, c.d}, -2, 2, gen, DType::f64);
  const int64_t kvh = c.kvh > 0 ? c.kvh : c.h;
  Tensor k64 = Tensor::uniform({c.b, kvh, c.tk, c.d}, -2, 2, gen, DType::f64);
  Tensor v64 = Tensor::uniform({c.b, kvh, c.tk, c.dv}, -1, 1, gen, DType::f64);
  Tensor w64 = Tensor::uniform({c.b, c.h, c.tq, c.dv}, -1, 1, gen, DType::f64);
  // The inputs in dt, laid out as asked: contiguous, or views whose last dimension is strided.
  auto lay = [&](const Tensor& x) {
    Tensor y = x.to(dt);
    if (layout == "strided") return transpose(transpose(y, 2, 3).contiguous(), 2, 3);  // last stride != 1
    if (layout == "bthd") return transpose(transpose(y, 1, 2).contiguous(), 1, 2);     // [b, t, h, d] in memory
    return y;
  };
  const bool causal = c.causal;
  auto fused = [causal](const Tensor& q, const Tensor& k, const Tensor& v) {
    return scaled_dot_product_attention(q, k, v, causal);
  };
  // Grouped heads: the reference repeats them by ops, so its key and value gradients are summed over the group.
  auto ref = [causal](const Tensor& q, const Tensor& k, const Tensor& v) {
    return reference(q, repeat_heads(k, q.size(1)), repeat_heads(v, q.size(1)), causal, Tensor());
  };
  const std::vector<Tensor> got = run(fused, lay(q64), lay(k64), lay(v64), w64.to(dt));
  const std::vector<Tensor> want = run(ref, q64, k64, v64, w64);
  const char* names[] = {"output", "query gradient", "key gradient", "value gradient"};
  for (size_t i = 0; i < got.size(); ++i)
    expect_close(got[i], values(want[i]), tol_for(dt, 10),
                 std::string(names[i]) + " " + dtype_name(dt) + " " + layout + (c.causal ? " causal " : " full ") +
                     std::to_string(c.tq) + "x" + std::to_string(c.tk) + " d " + std::to_string(c.d) + " heads " +
                     std::to_string(c.h) + "/" + std::to_string(kvh));
}

TEST(CpuAttention, MatchesOpsInDoubleAcrossShapesAndLayouts) {
  const Case cases[] = {
      {2, 3, 70, 70, 20, 12, true},   // two blocks of queries, a head size that is no multiple of 8
      {2, 3, 70, 70, 20, 12, false},  //
      {1, 2, 5, 9, 7, 5, true},       // fewer queries than keys (each sees keys up to its own index)
      {1, 2, 9, 5, 7, 5, true},       // more queries than keys: the last ones see every key
      {1, 1, 130, 67, 16, 16, false}, // three blocks of queries over fewer keys
      {1, 1, 1, 1, 1, 1, true},
      {2, 4, 70, 70, 16, 8, true, 2},  // grouped-query attention: two query heads per key-value head
      {1, 6, 9, 12, 8, 8, false, 1},   // one key-value head for all six (multi-query)
      {1, 6, 65, 65, 8, 8, true, 3},
  };
  int seed = 40;
  for (const Case& c : cases)
    for (DType dt : float_types())
      for (const char* layout : {"contiguous", "bthd", "strided"}) expect_matches_reference(c, dt, seed++, layout);
}

// packed_self_attention reads the query, key and value where a [b, t, 3 c] projection holds them and writes its
// gradient into one tensor of that shape.
TEST(CpuAttention, PackedProjectionMatchesTheSplitOne) {
  Generator gen(50);
  const int64_t b = 2, t = 67, heads = 4, c = 44, d = c / heads;
  for (bool causal : {true, false}) {
    Tensor qkv64 = Tensor::uniform({b, t, 3 * c}, -2, 2, gen, DType::f64), w64 = Tensor::uniform({b, t, c}, -1, 1, gen, DType::f64);
    Tensor x32 = qkv64.to(DType::f32);
    x32.requires_grad_();
    Tensor y = packed_self_attention(x32, heads, causal);
    backward(sum(mul(y, w64.to(DType::f32))));
    Tensor x64 = qkv64.detach();
    x64.requires_grad_();
    std::vector<Tensor> parts = split(x64, {c, c, c}, 2);
    auto by_head = [&](const Tensor& z) { return permute(reshape(z, {b, t, heads, d}), {0, 2, 1, 3}); };
    Tensor r = reshape(permute(reference(by_head(parts[0]), by_head(parts[1]), by_head(parts[2]), causal, Tensor()),
                               {0, 2, 1, 3}),
                       {b, t, c});
    backward(sum(mul(r, w64)));
    expect_close(y, values(r), tol_for(DType::f32, 10), "packed output");
    expect_close(x32.grad(), values(x64.grad()), tol_for(DType::f32, 10), "packed gradient");
  }
}

// Dropout drops the probabilities the composed path's mask drops: the counter-based draws of the generator,
// [b h, tq, tk] of them from its offset.
TEST(CpuAttention, DropoutDrawsTheComposedMask) {
  for (DType dt : float_types()) {
    Generator gen(60);
    const int64_t b = 2, h = 2, t = 19, d = 10;
    const double p = 0.3;
    Tensor q = Tensor::uniform({b, h, t, d}, -2, 2, gen, dt), k = Tensor::uniform({b, h, t, d}, -2, 2, gen, dt),
           v = Tensor::uniform({b, h, t, d}, -1, 1, gen, dt), w = Tensor::uniform({b, h, t, d}, -1, 1, gen, dt);
    Generator g_op(77), g_ref(77);
    auto fused = [&](const Tensor& x, const Tensor& y, const Tensor& z) {
      return scaled_dot_product_attention(x, y, z, true, p, 0.0, &g_op);
    };
    const uint64_t seed = g_ref.seed(), offset = g_ref.advance(static_cast<uint64_t>(b * h * t * t));
    Tensor mask = Tensor::empty({b, h, t, t}, dt);
    cpu().dropout_mask(mask, seed, offset, p);
    auto ref = [&](const Tensor& x, const Tensor& y, const Tensor& z) { return reference(x, y, z, true, mask); };
    const std::vector<Tensor> got = run(fused, q, k, v, w), want = run(ref, q, k, v, w);
    for (size_t i = 0; i < got.size(); ++i)
      expect_close(got[i], values(want[i]), tol_for(dt, 10), std::string("dropout ") + dtype_name(dt) + " part " + std::to_string(i));
  }
}

// Each (batch, head) is one task whatever the thread count: the same bits on one or two threads.
TEST(CpuAttention, SameBitsOnOneOrTwoThreads) {
  Generator gen(70);
  Tensor qkv = Tensor::uniform({3, 90, 3 * 48}, -2, 2, gen), w = Tensor::uniform({3, 90, 48}, -1, 1, gen);
  std::vector<std::vector<float>> out, grad;
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    Tensor x = qkv.detach();
    x.requires_grad_();
    Tensor y = packed_self_attention(x, 3, true);
    backward(sum(mul(y, w)));
    out.push_back(y.to_vector<float>());
    grad.push_back(x.grad().to_vector<float>());
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(grad[0], grad[1]);
}

}  // namespace
}  // namespace tandem::testing
