// cuDNN's fused flash attention (16-bit, through scaled_dot_product_attention) against the f32 math path
// on the same 16-bit-rounded inputs: the output and the three gradients, causal and not, for sequence
// lengths 64, 257, 1024 and 2048 and head sizes 64 and 128. Agreement is measured as the relative L2
// error ||fused - math|| / ||math||, which must stay within 1e-2 (output) and 2e-2 (gradients) in bf16,
// 2e-3 and 5e-3 in f16 (docs/ops.md states the same). Also: a recorded step replays the fused kernels.
#include <cmath>
#include <string>

#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/graph.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

struct Tol {
  double out, grad;
};
Tol tol_for(DType t) { return t == DType::bf16 ? Tol{1e-2, 2e-2} : Tol{2e-3, 5e-3}; }

// Whether the backend fuses this geometry (it says why on stderr when it does not).
bool fused(DType t, int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t d, bool causal) {
  backend::AttentionGeom g;
  g.batch = b;
  g.heads = h;
  g.tq = tq;
  g.tk = tk;
  g.d = d;
  g.dv = d;
  g.causal = causal;
  g.scale = 1.0 / std::sqrt(static_cast<double>(d));
  return backend::backend_for(gpu()).fused_attention_supported(g, t, 0);
}

struct Result {
  Tensor o, dq, dk, dv;  // f32, on the GPU
};

Result attend(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& dout, DType t, bool causal) {
  Tensor q = q0.to(t).clone(), k = k0.to(t).clone(), v = v0.to(t).clone();
  for (Tensor* x : {&q, &k, &v}) x->requires_grad_();
  Tensor o = scaled_dot_product_attention(q, k, v, causal);
  backward(o, {}, dout.to(t));
  return {o.detach().to(DType::f32), q.grad().to(DType::f32), k.grad().to(DType::f32), v.grad().to(DType::f32)};
}

class FusedAttention : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, bool>> {};

TEST_P(FusedAttention, AgreesWithTheF32MathPath) {
  REQUIRE_GPU();
  const auto [t, len, d, causal] = GetParam();
  const int64_t b = 2, h = len >= 1024 ? 2 : 3;
  if (!fused(t, b, h, len, len, d, causal)) GTEST_SKIP() << "cuDNN's fused attention does not take this geometry here";
  const uint64_t seed = static_cast<uint64_t>(len * 131 + d * 7 + (causal ? 1 : 0));
  // Rounded to 16 bits first, so that both paths see the same inputs.
  auto input = [&](uint64_t s) { return rand_cpu({b, h, len, d}, seed + s, -1.0, 1.0).to(t).to(DType::f32).to(gpu()); };
  Tensor q = input(1), k = input(2), v = input(3), dout = input(4);
  Result ref;
  {
    PrecisionScope exact(Precision::f32);
    ref = attend(q, k, v, dout, DType::f32, causal);
  }
  const Result got = attend(q, k, v, dout, t, causal);
  const Tol tol = tol_for(t);
  const std::string tag = std::string(dtype_name(t)) + " T=" + std::to_string(len) + " d=" + std::to_string(d) +
                          (causal ? " causal" : "");
  EXPECT_LE(rel_error(ref.o, got.o), tol.out) << tag << " output";
  EXPECT_LE(rel_error(ref.dq, got.dq), tol.grad) << tag << " dq";
  EXPECT_LE(rel_error(ref.dk, got.dk), tol.grad) << tag << " dk";
  EXPECT_LE(rel_error(ref.dv, got.dv), tol.grad) << tag << " dv";
}

std::string param_name(const ::testing::TestParamInfo<FusedAttention::ParamType>& info) {
  const auto [t, len, d, causal] = info.param;
  return std::string(dtype_name(t)) + "_T" + std::to_string(len) + "_d" + std::to_string(d) + (causal ? "_causal" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedAttention,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Values(int64_t{64}, int64_t{257}, int64_t{1024}, int64_t{2048}),
                                            ::testing::Values(int64_t{64}, int64_t{128}), ::testing::Bool()),
                         param_name);

TEST(FusedAttentionMore, KeysLongerThanQueries) {
  REQUIRE_GPU();
  const int64_t b = 2, h = 2, tq = 96, tk = 320, d = 64;
  if (!fused(DType::bf16, b, h, tq, tk, d, false)) GTEST_SKIP() << "cuDNN's fused attention does not take Tk != Tq here";
  auto input = [&](const Shape& s, uint64_t seed) { return rand_cpu(s, seed).to(DType::bf16).to(DType::f32).to(gpu()); };
  Tensor q = input({b, h, tq, d}, 1), k = input({b, h, tk, d}, 2), v = input({b, h, tk, d}, 3),
         dout = input({b, h, tq, d}, 4);
  Result ref;
  {
    PrecisionScope exact(Precision::f32);
    ref = attend(q, k, v, dout, DType::f32, false);
  }
  const Result got = attend(q, k, v, dout, DType::bf16, false);
  EXPECT_LE(rel_error(ref.o, got.o), 1e-2);
  EXPECT_LE(rel_error(ref.dq, got.dq), 2e-2);
  EXPECT_LE(rel_error(ref.dk, got.dk), 2e-2);
  EXPECT_LE(rel_error(ref.dv, got.dv), 2e-2);
}

// Grouped-query attention (Llama's: 8 query heads per key-value head, and 2 of 4): the fused kernels read the
// key and value heads as they are (no repeated copies) and agree with the f32 math path, which repeats them.
TEST(FusedAttentionMore, GroupedQueryAttention) {
  REQUIRE_GPU();
  for (const auto& [h, hk] : {std::pair<int64_t, int64_t>{16, 2}, {4, 2}, {4, 1}}) {
    const int64_t b = 2, t = 256, d = 64;
    backend::AttentionGeom g;
    g.batch = b, g.heads = h, g.kv_heads = hk, g.tq = g.tk = t, g.d = g.dv = d, g.causal = true;
    g.scale = 1.0 / 8.0;
    ASSERT_TRUE(backend::backend_for(gpu()).fused_attention_supported(g, DType::bf16, 0))
        << "cuDNN's fused attention refuses " << h << " query heads over " << hk << " key-value heads";
    auto input = [&](const Shape& s, uint64_t seed) { return rand_cpu(s, seed).to(DType::bf16).to(DType::f32).to(gpu()); };
    Tensor q = input({b, h, t, d}, 11), k = input({b, hk, t, d}, 12), v = input({b, hk, t, d}, 13),
           dout = input({b, h, t, d}, 14);
    Result ref;
    {
      PrecisionScope exact(Precision::f32);
      ref = attend(q, k, v, dout, DType::f32, true);
    }
    const Result got = attend(q, k, v, dout, DType::bf16, true);
    EXPECT_EQ(got.dk.shape(), (Shape{b, hk, t, d}));
    EXPECT_LE(rel_error(ref.o, got.o), 1e-2) << h << "/" << hk;
    EXPECT_LE(rel_error(ref.dq, got.dq), 2e-2) << h << "/" << hk;
    EXPECT_LE(rel_error(ref.dk, got.dk), 2e-2) << h << "/" << hk;
    EXPECT_LE(rel_error(ref.dv, got.dv), 2e-2) << h << "/" << hk;
  }
}

TEST(FusedAttentionMore, RecordedStepReplaysTheFusedKernels) {
  REQUIRE_GPU();
  const int64_t b = 2, h = 4, len = 128, d = 64;
  if (!fused(DType::bf16, b, h, len, len, d, true)) GTEST_SKIP() << "cuDNN's fused attention does not take this here";
  Tensor q = rand_cpu({b, h, len, d}, 5).to(DType::bf16).to(gpu()), k = rand_cpu({b, h, len, d}, 6).to(DType::bf16).to(gpu()),
         v = rand_cpu({b, h, len, d}, 7).to(DType::bf16).to(gpu());
  for (Tensor* x : {&q, &k, &v}) x->requires_grad_();
  // Eager first (the graphs are built then), then recorded forward and backward.
  Tensor eager = scaled_dot_product_attention(q, k, v, true).detach().clone();
  Tensor o, gq;
  DeviceGraph graph(gpu(), [&] {
    o = scaled_dot_product_attention(q, k, v, true);
    backward(o, {}, Tensor::ones(o.shape(), DType::bf16, gpu()));
    gq = q.grad();
  });
  graph.replay();
  synchronize(gpu());
  expect_same_bytes(eager, o.detach(), "replayed fused attention");
  EXPECT_TRUE(gq.defined());
}

TEST(FusedAttentionMore, DropoutKeepsTheExpectedFraction) {
  REQUIRE_GPU();
  const int64_t b = 1, h = 2, len = 256, d = 64;
  backend::AttentionGeom g;
  g.batch = b;
  g.heads = h;
  g.tq = g.tk = len;
  g.d = g.dv = d;
  g.scale = 0.125;
  g.dropout_p = 0.25;
  if (!backend::backend_for(gpu()).fused_attention_supported(g, DType::bf16, 0))
    GTEST_SKIP() << "cuDNN's fused attention with dropout is not taken here";
  // With v = ones, each output is the kept probabilities' sum / (1 - p): 1 on average.
  Tensor q = rand_cpu({b, h, len, d}, 8).to(DType::bf16).to(gpu()), k = rand_cpu({b, h, len, d}, 9).to(DType::bf16).to(gpu());
  Tensor v = Tensor::ones({b, h, len, d}, DType::bf16, gpu());
  Generator gen(4);
  Tensor o = scaled_dot_product_attention(q, k, v, false, 0.25, 0.125, &gen).to(DType::f32).cpu();
  const std::vector<float> ov = o.to_vector<float>();
  double mean = 0.0;
  for (float x : ov) mean += x;
  mean /= static_cast<double>(ov.size());
  EXPECT_NEAR(mean, 1.0, 0.05);
}

// packed_self_attention on a [B, T, 3C] projection: cuDNN reads the heads in place and writes the gradient of
// the projection as one tensor. Against the f32 math path (same tolerances as above) and against the
// composition it stands for (split, view by head, attend, merge), with and without dropout.
TEST(FusedAttentionMore, PackedProjectionAgreesWithTheComposition) {
  REQUIRE_GPU();
  const int64_t b = 2, h = 3, len = 256, d = 64, c = h * d;
  for (DType t : {DType::bf16, DType::f16}) {
    for (bool causal : {false, true}) {
      if (!fused(t, b, h, len, len, d, causal)) GTEST_SKIP() << "cuDNN's fused attention does not take this here";
      const std::string tag = std::string(dtype_name(t)) + (causal ? " causal" : "");
      const Tensor x0 = rand_cpu({b, len, 3 * c}, 21, -1.0, 1.0).to(t).to(DType::f32).to(gpu());
      const Tensor dout = rand_cpu({b, len, c}, 22, -1.0, 1.0).to(t).to(DType::f32).to(gpu());
      auto composed = [&](const Tensor& qkv, double p, Generator* gen) {
        const std::vector<Tensor> parts = split(qkv, {c, c, c}, 2);
        auto by_head = [&](const Tensor& y) { return permute(reshape(y, {b, len, h, d}), {0, 2, 1, 3}); };
        Tensor a = scaled_dot_product_attention(by_head(parts[0]), by_head(parts[1]), by_head(parts[2]), causal, p,
                                                0.0, gen);
        return reshape(permute(a, {0, 2, 1, 3}), {b, len, c});
      };
      auto run = [&](DType dt, bool packed, double p) {
        Tensor qkv = x0.to(dt).clone();
        qkv.requires_grad_();
        Generator gen(31);
        Tensor y = packed ? packed_self_attention(qkv, h, causal, p, 0.0, p > 0 ? &gen : nullptr)
                          : composed(qkv, p, p > 0 ? &gen : nullptr);
        backward(y, {}, dout.to(dt));
        return std::pair<Tensor, Tensor>{y.detach().to(DType::f32), qkv.grad().to(DType::f32)};
      };
      std::pair<Tensor, Tensor> ref;
      {
        PrecisionScope exact(Precision::f32);
        ref = run(DType::f32, false, 0.0);
      }
      const auto got = run(t, true, 0.0), comp = run(t, false, 0.0);
      const Tol tol = tol_for(t);
      EXPECT_LE(rel_error(ref.first, got.first), tol.out) << tag << " output";
      EXPECT_LE(rel_error(ref.second, got.second), tol.grad) << tag << " d(qkv)";
      EXPECT_LE(rel_error(comp.first, got.first), tol.out / 4) << tag << " output vs the composition";
      EXPECT_LE(rel_error(comp.second, got.second), tol.grad / 4) << tag << " d(qkv) vs the composition";
      // Dropout: the same generator state draws the same mask through either form, run after run.
      const auto pd = run(t, true, 0.2), pd2 = run(t, true, 0.2), cd = run(t, false, 0.2);
      expect_same_bytes(pd.first, pd2.first, tag + " packed dropout repeated");
      EXPECT_LE(rel_error(cd.first, pd.first), tol.out / 4) << tag << " dropout output vs the composition";
      EXPECT_LE(rel_error(cd.second, pd.second), tol.grad / 4) << tag << " dropout d(qkv) vs the composition";
      EXPECT_GT(rel_error(got.first, pd.first), 0.05) << tag << " dropout changed nothing";
    }
  }
}

}  // namespace
}  // namespace tandem
