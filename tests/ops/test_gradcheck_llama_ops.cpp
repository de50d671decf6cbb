// The fused ops of Llama-family blocks on the CPU: rotary_packed (rotary position embeddings on the query and key
// heads of a packed projection), swiglu (silu(gate) * up) and grouped-query packed_self_attention. Each against
// finite differences in f64 (grouped-query shapes with 2 and 1 key-value heads, odd batch and time extents, a
// start offset into the tables, tables whose halves differ) and against the composition it stands for, in f64
// and f32, values and gradients.
#include <algorithm>
#include <cmath>

#include "ops/gradcheck.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

struct RotaryCase {
  int64_t b, t, heads, kv_heads, d, start;
};

const RotaryCase kRotaryCases[] = {
    {3, 5, 4, 2, 4, 0},  // grouped-query, two query heads per key-value head
    {1, 3, 4, 1, 6, 2},  // one key-value head, a start offset into the tables
    {2, 1, 2, 2, 2, 0},  // multi-head, one position, head size 2
    {1, 7, 3, 3, 8, 1},
};

// The composition rotary_packed stands for: the query and key heads split off, viewed as [B, H, T, d],
// rotated by rotary_embedding with the tables' rows start .. start + T - 1, and put back.
Tensor rotary_composed(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const RotaryCase& c) {
  const Tensor cs = cos.narrow(0, c.start, c.t), sn = sin.narrow(0, c.start, c.t);
  const std::vector<Tensor> parts = split(qkv, {c.heads * c.d, c.kv_heads * c.d, c.kv_heads * c.d}, 2);
  auto rotate = [&](const Tensor& y, int64_t h) {
    Tensor r = rotary_embedding(permute(reshape(y, {c.b, c.t, h, c.d}), {0, 2, 1, 3}), cs, sn);
    return reshape(permute(r, {0, 2, 1, 3}), {c.b, c.t, h * c.d});
  };
  return concat({rotate(parts[0], c.heads), rotate(parts[1], c.kv_heads), parts[2]}, 2);
}

std::string name_of(const RotaryCase& c) {
  return "b " + std::to_string(c.b) + " t " + std::to_string(c.t) + " heads " + std::to_string(c.heads) + "/" +
         std::to_string(c.kv_heads) + " d " + std::to_string(c.d) + " start " + std::to_string(c.start);
}

TEST(GradcheckLlamaOps, RotaryPackedGradient) {
  Generator gen(11);
  for (const RotaryCase& c : kRotaryCases) {
    const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
    Tensor qkv = leaf({c.b, c.t, width}, gen);
    auto [cos, sin] = rotary_tables(c.d, c.start + c.t + 1, 10000.0, RopeScaling{}, DType::f64, Device::cpu());
    EXPECT_TRUE(gradcheck1([&](const Tensor& x) { return rotary_packed(x, cos, sin, c.heads, c.kv_heads, c.start); },
                           qkv))
        << name_of(c);
    // Tables whose two halves differ (not a rotation): the backward is the transpose of the forward's map all
    // the same.
    const Tensor rc = Tensor::uniform({c.start + c.t, c.d}, -1.0, 1.0, gen, DType::f64),
                 rs = Tensor::uniform({c.start + c.t, c.d}, -1.0, 1.0, gen, DType::f64);
    EXPECT_TRUE(gradcheck1([&](const Tensor& x) { return rotary_packed(x, rc, rs, c.heads, c.kv_heads, c.start); },
                           qkv))
        << name_of(c) << ", random tables";
  }
}

// The values and the gradient of the composition, in f64 and f32; the value heads are copied as they are.
TEST(GradcheckLlamaOps, RotaryPackedEqualsRotaryEmbeddingOnTheSplitHeads) {
  Generator gen(12);
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-14 : 2e-6;
    for (const RotaryCase& c : kRotaryCases) {
      const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
      const Tensor x0 = Tensor::uniform({c.b, c.t, width}, -2.0, 2.0, gen, dt),
                   w = Tensor::uniform({c.b, c.t, width}, -1.0, 1.0, gen, dt);
      auto [cos, sin] = rotary_tables(c.d, c.start + c.t, 500000.0, RopeScaling{}, dt, Device::cpu());
      Tensor x1 = x0.clone(), x2 = x0.clone();
      x1.requires_grad_();
      x2.requires_grad_();
      const Tensor got = rotary_packed(x1, cos, sin, c.heads, c.kv_heads, c.start);
      const Tensor want = rotary_composed(x2, cos, sin, c);
      EXPECT_LE(max_abs_diff(got.detach(), want.detach()), tol) << name_of(c) << " " << dtype_name(dt);
      const int64_t v0 = (c.heads + c.kv_heads) * c.d;
      EXPECT_EQ(got.detach().narrow(2, v0, c.kv_heads * c.d).contiguous().to_vector<double>(),
                x0.narrow(2, v0, c.kv_heads * c.d).contiguous().to_vector<double>())
          << name_of(c) << ": the value heads are copied";
      backward(sum(mul(got, w)));
      backward(sum(mul(want, w)));
      EXPECT_LE(max_abs_diff(x1.grad(), x2.grad()), tol) << name_of(c) << " " << dtype_name(dt) << " gradient";
    }
  }
}

TEST(GradcheckLlamaOps, RotaryPackedOnAStridedInputAndTablesThatTakeAGradient) {
  Generator gen(13);
  const RotaryCase c{2, 3, 2, 1, 4, 0};
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
  auto [cos, sin] = rotary_tables(c.d, c.t, 10000.0, RopeScaling{}, DType::f64, Device::cpu());
  // A transposed leaf: the op reads it through a contiguous copy.
  Tensor xt = leaf({c.b, width, c.t}, gen);
  EXPECT_TRUE(gradcheck1(
      [&](const Tensor& x) { return rotary_packed(permute(x, {0, 2, 1}), cos, sin, c.heads, c.kv_heads); }, xt));
  // Tables that take a gradient go through the composition, which gives them theirs.
  Tensor ct = cos.clone(), st = sin.clone();
  ct.requires_grad_();
  st.requires_grad_();
  Tensor x = leaf({c.b, c.t, width}, gen);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return rotary_packed(in[0], in[1], in[2], c.heads, c.kv_heads); },
      {x, ct, st}));
}

TEST(GradcheckLlamaOps, RotaryPackedRefusesWhatDoesNotFit) {
  auto [cos, sin] = rotary_tables(4, 6, 10000.0, RopeScaling{}, DType::f64, Device::cpu());
  const Tensor qkv = Tensor::zeros({2, 5, 32}, DType::f64);  // (4 + 2 x 2) heads of 4
  EXPECT_NO_THROW(rotary_packed(qkv, cos, sin, 4, 2, 1));
  EXPECT_THROW(rotary_packed(qkv, cos, sin, 4, 2, 2), Error);  // rows 2 .. 6 of a 6-row table
  EXPECT_THROW(rotary_packed(qkv, cos, sin, 3, 2), Error);     // 32 is no multiple of 7 heads
  EXPECT_THROW(rotary_packed(qkv, cos, sin, 4, 2, -1), Error);
  EXPECT_THROW(rotary_packed(qkv, cos.to(DType::f32), sin.to(DType::f32), 4, 2), Error);
  auto [c8, s8] = rotary_tables(8, 6, 10000.0, RopeScaling{}, DType::f64, Device::cpu());
  EXPECT_THROW(rotary_packed(qkv, c8, s8, 4, 2), Error);  // tables of another head size
  const Tensor odd = Tensor::zeros({2, 5, 24}, DType::f64);  // (6 + 2 x 1) heads of 3: an odd head size
  EXPECT_THROW(rotary_packed(odd, cos, sin, 6, 1), Error);
  try {
    rotary_packed(qkv, cos, sin, 3, 2);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rotary_packed"), std::string::npos) << m;
    EXPECT_NE(m.find("multiple of 2 x 7"), std::string::npos) << m;
  }
}

TEST(GradcheckLlamaOps, SwiGLUGradient) {
  Generator gen(21);
  for (const Shape& s : {Shape{3, 5, 8}, Shape{7, 2}, Shape{2, 1, 3, 6}, Shape{10}}) {
    Tensor x = leaf(s, gen, -3.0, 3.0);
    EXPECT_TRUE(gradcheck1([](const Tensor& t) { return swiglu(t); }, x)) << shape_str(s);
  }
  // A transposed input (the op reads a contiguous copy).
  Tensor xt = leaf({6, 3}, gen, -3.0, 3.0);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return swiglu(permute(t, {1, 0})); }, xt));
}

TEST(GradcheckLlamaOps, SwiGLUEqualsSiluOfTheGateTimesUp) {
  Generator gen(22);
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-14 : 2e-6;
    for (const Shape& s : {Shape{3, 5, 8}, Shape{7, 2}, Shape{4, 2, 22}}) {
      const int64_t h = s.back() / 2;
      Shape ys = s;
      ys.back() = h;
      const Tensor x0 = Tensor::uniform(s, -4.0, 4.0, gen, dt), w = Tensor::uniform(ys, -1.0, 1.0, gen, dt);
      Tensor x1 = x0.clone(), x2 = x0.clone();
      x1.requires_grad_();
      x2.requires_grad_();
      const Tensor got = swiglu(x1);
      const std::vector<Tensor> gate_up = split(x2, {h, h}, x2.dim() - 1);
      const Tensor want = mul(silu(gate_up[0]), gate_up[1]);
      EXPECT_LE(max_abs_diff(got.detach(), want.detach()), tol) << shape_str(s) << " " << dtype_name(dt);
      backward(sum(mul(got, w)));
      backward(sum(mul(want, w)));
      EXPECT_LE(max_abs_diff(x1.grad(), x2.grad()), tol) << shape_str(s) << " " << dtype_name(dt) << " gradient";
    }
  }
  EXPECT_THROW(swiglu(Tensor::zeros({3, 5})), Error);  // an odd last extent
  EXPECT_THROW(swiglu(Tensor::zeros({4}, DType::i32)), Error);
}

struct GqaCase {
  int64_t b, t, heads, kv_heads, d;
};

// packed_self_attention over [B, T, (heads + 2 kv_heads) d]: finite differences, causal and not, with dropout too,
// and the same values and gradient as scaled_dot_product_attention on the split parts viewed by head.
TEST(GradcheckLlamaOps, PackedGroupedQueryAttention) {
  Generator gen(31);
  for (const GqaCase& c : {GqaCase{3, 5, 4, 2, 2}, GqaCase{1, 3, 4, 1, 3}, GqaCase{2, 4, 2, 2, 2}}) {
    const std::string tag = std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads";
    const int64_t width = (c.heads + 2 * c.kv_heads) * c.d, cq = c.heads * c.d, ckv = c.kv_heads * c.d;
    Tensor qkv = leaf({c.b, c.t, width}, gen);
    for (bool causal : {false, true}) {
      EXPECT_TRUE(gradcheck1(
          [&](const Tensor& x) { return packed_self_attention(x, c.heads, c.kv_heads, causal); }, qkv))
          << tag << " causal " << causal;
      for (DType dt : {DType::f64, DType::f32}) {
        const double tol = dt == DType::f64 ? 1e-13 : 1e-5;
        const Tensor w = Tensor::uniform({c.b, c.t, cq}, -1.0, 1.0, gen, dt);
        Tensor x1 = qkv.detach().to(dt).clone(), x2 = x1.clone();
        x1.requires_grad_();
        x2.requires_grad_();
        const Tensor got = packed_self_attention(x1, c.heads, c.kv_heads, causal);
        const std::vector<Tensor> parts = split(x2, {cq, ckv, ckv}, 2);
        auto by_head = [&](const Tensor& y, int64_t h) {
          return permute(reshape(y, {c.b, c.t, h, c.d}), {0, 2, 1, 3});
        };
        const Tensor want = reshape(permute(scaled_dot_product_attention(by_head(parts[0], c.heads),
                                                                          by_head(parts[1], c.kv_heads),
                                                                          by_head(parts[2], c.kv_heads), causal),
                                            {0, 2, 1, 3}),
                                    {c.b, c.t, cq});
        EXPECT_LE(max_abs_diff(got.detach(), want.detach()), tol) << tag << " " << dtype_name(dt);
        backward(sum(mul(got, w)));
        backward(sum(mul(want, w)));
        EXPECT_LE(max_abs_diff(x1.grad(), x2.grad()), tol) << tag << " " << dtype_name(dt) << " gradient";
      }
    }
    EXPECT_TRUE(gradcheck1(
        [&](const Tensor& x) {
          Generator g(79);
          return packed_self_attention(x, c.heads, c.kv_heads, true, 0.3, 0.0, &g);
        },
        qkv))
        << tag << " dropout";
  }
  // kv_heads = heads is the three-part overload.
  Tensor qkv = Tensor::uniform({2, 4, 18}, -1.0, 1.0, gen, DType::f64);
  EXPECT_EQ(packed_self_attention(qkv, 2, 2, true).to_vector<double>(),
            packed_self_attention(qkv, 2, true).to_vector<double>());
  // Key-value heads that do not divide the query heads, and extents that do not hold the heads, are refused.
  EXPECT_THROW(packed_self_attention(Tensor::zeros({2, 4, 7 * 2}), 4, 3, true), Error);
  EXPECT_THROW(packed_self_attention(Tensor::zeros({2, 4, 13}), 4, 2, true), Error);
}

// A rotary projection attended as Llama's layers do it: rotary_packed then grouped-query packed attention, against
// the split heads rotated by rotary_embedding and attended by scaled_dot_product_attention (finite differences
// through both ops at once).
TEST(GradcheckLlamaOps, RotaryThenPackedAttention) {
  Generator gen(41);
  const int64_t b = 3, t = 5, heads = 4, kv = 2, d = 4;
  Tensor qkv = leaf({b, t, (heads + 2 * kv) * d}, gen);
  auto [cos, sin] = rotary_tables(d, t, 10000.0, RopeScaling{}, DType::f64, Device::cpu());
  EXPECT_TRUE(gradcheck1(
      [&](const Tensor& x) { return packed_self_attention(rotary_packed(x, cos, sin, heads, kv), heads, kv, true); },
      qkv));
  const Tensor got = packed_self_attention(rotary_packed(qkv.detach(), cos, sin, heads, kv), heads, kv, true);
  const std::vector<Tensor> parts = split(qkv.detach(), {heads * d, kv * d, kv * d}, 2);
  auto by_head = [&](const Tensor& y, int64_t h) { return permute(reshape(y, {b, t, h, d}), {0, 2, 1, 3}); };
  const Tensor q = rotary_embedding(by_head(parts[0], heads), cos, sin),
               k = rotary_embedding(by_head(parts[1], kv), cos, sin);
  const Tensor a = scaled_dot_product_attention(q, k, by_head(parts[2], kv), true);
  const Tensor want = reshape(permute(a, {0, 2, 1, 3}), {b, t, heads * d});
  EXPECT_LE(max_abs_diff(got, want), 1e-13);
}

}  // namespace
}  // namespace tandem::testing
