// The fused ops of Llama-family blocks on the GPU against the CPU:
// - rotary_packed and swiglu, forward and backward: the backend's kernels in f32 against the CPU backend's (shapes
//   and addresses that take the 16-byte path and ones that take the one-element path, and more rows than one
//   launch's grid covers), and the ops through autograd in bf16 and f16 against the CPU's f32 on the same 16-bit
//   inputs (the GPU computes in f32 and rounds once, so the two differ by the output's rounding);
// - grouped-query packed_self_attention (cuDNN's fused path in 16 bits) against the f32 math path and against
//   scaled_dot_product_attention on the split heads;
// - a Llama whose heads take cuDNN's fused attention, in bf16 on the GPU against f32 on the CPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/nn/llama.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;
using backend::Backend;
using backend::RotaryGeom;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

struct Tol {
  double rtol, atol;
};
// The GPU's 16-bit results are its f32 results rounded once: half an ulp of bf16 (2^-9) or f16 (2^-12) apart from
// the CPU's f32, plus the f32 arithmetic's own differences (fused multiply-adds, expf).
Tol tol_for(DType t) {
  if (t == DType::bf16) return {8e-3, 1e-5};
  if (t == DType::f16) return {1e-3, 1e-5};
  return {1e-5, 1e-6};
}

// A tensor on device d holding x's values (f32) whose first element lies 4 bytes past a 16-byte boundary: the
// kernels must take the one-element path for it.
Tensor misaligned_copy(const Tensor& x, Device d) {
  Tensor buf = Tensor::zeros({x.numel() + 1}, DType::f32, d);
  Tensor v = buf.narrow(0, 1, x.numel());
  v.copy_(reshape(x, {x.numel()}).to(d));
  return v;
}

struct RotaryCase {
  int64_t b, t, heads, kv_heads, d, start;
};

std::string name_of(const RotaryCase& c) {
  return "b " + std::to_string(c.b) + " t " + std::to_string(c.t) + " heads " + std::to_string(c.heads) + "/" +
         std::to_string(c.kv_heads) + " d " + std::to_string(c.d) + " start " + std::to_string(c.start);
}

const RotaryCase kRotaryCases[] = {
    {3, 37, 32, 8, 64, 5},  // Llama 3.2 1B's heads: 16-byte packs
    {2, 7, 4, 1, 6, 0},     // half a head of 3: one element at a time
    {1, 3, 4, 2, 8, 1},     // half a head of 4: packs of f32, single bf16 elements
    {5, 1, 2, 2, 16, 0},    // one position
};

// The backend kernel forward and transposed (f32), on both backends; with `misaligned`, inputs and outputs one
// element past an aligned address.
void compare_rotary_kernel(const RotaryCase& c, bool misaligned, uint64_t seed) {
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.d, n = c.b * c.t * width;
  const Tensor x0 = rand_cpu({c.b, c.t, width}, seed), cos0 = rand_cpu({c.start + c.t, c.d}, seed + 1),
               sin0 = rand_cpu({c.start + c.t, c.d}, seed + 2);
  std::vector<Tensor> out[2];
  int i = 0;
  for (Backend* be : {&cpu_be(), &gpu_be()}) {
    const Device d = i == 0 ? Device::cpu() : gpu();
    const Tensor x = misaligned ? misaligned_copy(x0, d) : x0.to(d).contiguous(), cs = cos0.to(d), sn = sin0.to(d);
    for (bool transpose : {false, true}) {
      RotaryGeom g;
      g.batch = c.b, g.t = c.t, g.rotated = c.heads + c.kv_heads, g.copied = c.kv_heads, g.d = c.d, g.start = c.start;
      g.transpose = transpose;
      Tensor y = misaligned ? misaligned_copy(Tensor::zeros({n}), d) : Tensor::empty({n}, DType::f32, d);
      ASSERT_TRUE(be->rotary_packed(x, cs, sn, g, y)) << name_of(c);
      out[i].push_back(y.cpu());
    }
    ++i;
  }
  const Tol tol = tol_for(DType::f32);
  const std::string tag = name_of(c) + (misaligned ? " misaligned" : "");
  expect_close(out[0][0], out[1][0], tol.rtol, tol.atol, tag + " forward");
  expect_close(out[0][1], out[1][1], tol.rtol, tol.atol, tag + " transposed");
}

TEST(CudaLlamaOps, RotaryPackedKernelMatchesTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (const RotaryCase& c : kRotaryCases)
    for (bool misaligned : {false, true}) compare_rotary_kernel(c, misaligned, seed += 3);
  // More rows than one launch's grid holds (65535 blocks of one row each for this width): the rows loop, and each
  // row's position steps on across T.
  compare_rotary_kernel({2, 35000, 2, 1, 256, 3}, false, 7);
}

// rotary_packed through autograd: y and the gradient of qkv, on the GPU in dt against the CPU in f32 on the same
// dt-rounded qkv, tables and output gradient.
TEST(CudaLlamaOps, RotaryPackedForwardAndBackwardIn16BitsAndF32) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const RotaryCase& c : kRotaryCases) {
      const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
      auto rounded = [&](const Tensor& x) { return x.to(dt).to(DType::f32); };
      const Tensor x0 = rounded(rand_cpu({c.b, c.t, width}, seed += 4, -2.0, 2.0)),
                   dout = rounded(rand_cpu({c.b, c.t, width}, seed + 1));
      auto [cos0, sin0] = rotary_tables(c.d, c.start + c.t, 500000.0, RopeScaling{}, dt, Device::cpu());
      auto run = [&](DType t, Device d) {
        Tensor x = x0.to(t).to(d).clone();
        x.requires_grad_();
        Tensor y = rotary_packed(x, cos0.to(t).to(d), sin0.to(t).to(d), c.heads, c.kv_heads, c.start);
        backward(y, {}, dout.to(t).to(d));
        return std::pair<Tensor, Tensor>{y.detach().to(DType::f32).cpu(), x.grad().to(DType::f32).cpu()};
      };
      const auto want = run(DType::f32, Device::cpu()), got = run(dt, gpu());
      const Tol tol = tol_for(dt);
      const std::string tag = name_of(c) + " " + dtype_name(dt);
      expect_close(want.first, got.first, tol.rtol, tol.atol, tag + " output");
      expect_close(want.second, got.second, tol.rtol, tol.atol, tag + " gradient");
    }
  }
}

void compare_swiglu_kernel(int64_t rows, int64_t hidden, bool misaligned, uint64_t seed) {
  const Tensor x0 = rand_cpu({rows, 2 * hidden}, seed, -4.0, 4.0), dy0 = rand_cpu({rows, hidden}, seed + 1);
  std::vector<Tensor> out[2];
  int i = 0;
  for (Backend* be : {&cpu_be(), &gpu_be()}) {
    const Device d = i == 0 ? Device::cpu() : gpu();
    const Tensor x = misaligned ? misaligned_copy(x0, d) : x0.to(d).contiguous(),
                 dy = misaligned ? misaligned_copy(dy0, d) : dy0.to(d).contiguous();
    Tensor y = misaligned ? misaligned_copy(Tensor::zeros({rows * hidden}), d)
                          : Tensor::empty({rows * hidden}, DType::f32, d);
    Tensor dx = misaligned ? misaligned_copy(Tensor::zeros({rows * 2 * hidden}), d)
                           : Tensor::empty({rows * 2 * hidden}, DType::f32, d);
    ASSERT_TRUE(be->swiglu_forward(x, rows, hidden, y));
    ASSERT_TRUE(be->swiglu_backward(dy, x, rows, hidden, dx));
    out[i] = {y.cpu(), dx.cpu()};
    ++i;
  }
  const std::string tag =
      std::to_string(rows) + " rows of " + std::to_string(hidden) + (misaligned ? " misaligned" : "");
  const Tol tol = tol_for(DType::f32);
  expect_close(out[0][0], out[1][0], tol.rtol, tol.atol, tag + " forward");
  expect_close(out[0][1], out[1][1], tol.rtol, tol.atol, tag + " backward");
}

TEST(CudaLlamaOps, SwiGLUKernelsMatchTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  for (auto [rows, hidden] : {std::pair<int64_t, int64_t>{148, 1376}, {15, 13}, {1, 8192}, {7, 1}, {3, 4}})
    for (bool misaligned : {false, true}) compare_swiglu_kernel(rows, hidden, misaligned, seed += 2);
  compare_swiglu_kernel(70000, 520, false, 9);  // more rows than one launch's grid holds
}

TEST(CudaLlamaOps, SwiGLUForwardAndBackwardIn16BitsAndF32) {
  REQUIRE_GPU();
  uint64_t seed = 400;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape& s : {Shape{4, 37, 2 * 1376}, Shape{3, 5, 26}, Shape{1, 16384}}) {
      Shape ys = s;
      ys.back() /= 2;
      auto rounded = [&](const Tensor& x) { return x.to(dt).to(DType::f32); };
      const Tensor x0 = rounded(rand_cpu(s, seed += 2, -4.0, 4.0)), dout = rounded(rand_cpu(ys, seed + 1));
      auto run = [&](DType t, Device d) {
        Tensor x = x0.to(t).to(d).clone();
        x.requires_grad_();
        Tensor y = swiglu(x);
        backward(y, {}, dout.to(t).to(d));
        return std::pair<Tensor, Tensor>{y.detach().to(DType::f32).cpu(), x.grad().to(DType::f32).cpu()};
      };
      const auto want = run(DType::f32, Device::cpu()), got = run(dt, gpu());
      const Tol tol = tol_for(dt);
      const std::string tag = shape_str(s) + " " + dtype_name(dt);
      expect_close(want.first, got.first, tol.rtol, tol.atol, tag + " output");
      expect_close(want.second, got.second, tol.rtol, tol.atol, tag + " gradient");
    }
  }
}

// Grouped-query attention over a packed [B, T, (heads + 2 kv_heads) d] projection: against the f32 math path (the
// fused attention tests' tolerances) and against scaled_dot_product_attention on the split heads.
TEST(CudaLlamaOps, PackedGroupedQueryAttentionAgreesWithTheSplitHeads) {
  REQUIRE_GPU();
  const int64_t b = 2, len = 128, d = 64;
  for (DType t : {DType::bf16, DType::f16}) {
    for (const auto& [h, hk] : {std::pair<int64_t, int64_t>{8, 2}, {4, 1}, {4, 4}}) {
      const int64_t width = (h + 2 * hk) * d, c = h * d;
      backend::AttentionGeom g;
      g.batch = b, g.heads = h, g.kv_heads = hk, g.tq = g.tk = len, g.d = g.dv = d, g.causal = true;
      g.scale = 1.0 / 8.0;
      g.q_strides = {len * width, d, width, 1};
      g.k_strides = g.v_strides = {len * width, d, width, 1};
      g.grads_like_inputs = true;
      const bool fused = gpu_be().fused_attention_supported(g, t, 0);
      const std::string tag = std::string(dtype_name(t)) + " " + std::to_string(h) + "/" + std::to_string(hk) +
                              (fused ? " (fused)" : " (composed: cuDNN refuses the packed geometry)");
      const Tensor x0 = rand_cpu({b, len, width}, 51).to(t).to(DType::f32).to(gpu());
      const Tensor dout = rand_cpu({b, len, c}, 52).to(t).to(DType::f32).to(gpu());
      auto run = [&](DType dt, bool packed) {
        Tensor qkv = x0.to(dt).clone();
        qkv.requires_grad_();
        Tensor y;
        if (packed) {
          y = packed_self_attention(qkv, h, hk, true);
        } else {
          const std::vector<Tensor> parts = split(qkv, {c, hk * d, hk * d}, 2);
          auto by_head = [&](const Tensor& z, int64_t n) { return permute(reshape(z, {b, len, n, d}), {0, 2, 1, 3}); };
          Tensor a = scaled_dot_product_attention(by_head(parts[0], h), by_head(parts[1], hk), by_head(parts[2], hk),
                                                  true);
          y = reshape(permute(a, {0, 2, 1, 3}), {b, len, c});
        }
        backward(y, {}, dout.to(dt));
        return std::pair<Tensor, Tensor>{y.detach().to(DType::f32), qkv.grad().to(DType::f32)};
      };
      std::pair<Tensor, Tensor> ref;
      {
        PrecisionScope exact(Precision::f32);
        ref = run(DType::f32, false);
      }
      const auto got = run(t, true), split_heads = run(t, false);
      const double out_tol = t == DType::bf16 ? 1e-2 : 2e-3, grad_tol = t == DType::bf16 ? 2e-2 : 5e-3;
      EXPECT_EQ(got.first.shape(), (Shape{b, len, c})) << tag;
      EXPECT_LE(rel_error(ref.first, got.first), out_tol) << tag << " output";
      EXPECT_LE(rel_error(ref.second, got.second), grad_tol) << tag << " d(qkv)";
      EXPECT_LE(rel_error(split_heads.first, got.first), out_tol / 4) << tag << " output vs the split heads";
      EXPECT_LE(rel_error(split_heads.second, got.second), grad_tol / 4) << tag << " d(qkv) vs the split heads";
    }
  }
}

// A Llama whose heads are 64 wide (cuDNN's fused attention takes them) runs rotary_packed, grouped-query packed
// attention and swiglu on the 16-byte paths; in bf16 on the GPU it gives the CPU's f32 logits, loss and gradients
// within bf16's rounding, and in f32 (exact products) within f32's.
TEST(CudaLlamaOps, LlamaWithWideHeadsGivesTheCpusResults) {
  REQUIRE_GPU();
  nn::LlamaConfig c;
  c.layers = 2, c.width = 256, c.heads = 4, c.kv_heads = 2, c.mlp_hidden = 384, c.vocab = 64, c.context = 64;
  Generator gen(5);
  std::vector<int64_t> tv(2 * 48), yv(2 * 48);
  for (int64_t& v : tv) v = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(c.vocab)));
  for (int64_t& v : yv) v = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(c.vocab)));
  const Tensor tokens = Tensor::from_vector(tv, {2, 48}), targets = Tensor::from_vector(yv, {2, 48});
  auto run = [&](Device d, Precision p) {
    nn::Llama m(c, 11);
    m.to(d);
    PrecisionScope scope(p);
    Tensor logits;
    {
      NoGradGuard no_grad;
      logits = m.forward(tokens.to(d)).to(DType::f32).cpu();
    }
    Tensor loss = m.loss(tokens.to(d), targets.to(d));
    backward(loss);
    std::vector<Tensor> grads;
    for (const Tensor& w : m.parameters()) grads.push_back(w.grad().to(DType::f32).cpu());
    return std::make_tuple(logits, loss.detach().to(DType::f32).cpu().item<float>(), grads);
  };
  const auto [cpu_logits, cpu_loss, cpu_grads] = run(Device::cpu(), Precision::f32);
  for (Precision p : {Precision::f32, Precision::bf16}) {
    const bool half = p == Precision::bf16;
    const auto [logits, loss, grads] = run(gpu(), p);
    const std::string tag = half ? "bf16" : "f32";
    expect_norm_close(cpu_logits, logits, half ? 3e-2 : 1e-5, tag + " logits");
    EXPECT_NEAR(cpu_loss, loss, (half ? 3e-2 : 1e-5) * std::fabs(cpu_loss)) << tag;
    ASSERT_EQ(cpu_grads.size(), grads.size());
    for (size_t i = 0; i < grads.size(); ++i)
      expect_norm_close(cpu_grads[i], grads[i], half ? 6e-2 : 1e-4, tag + " gradient " + std::to_string(i));
  }
}

}  // namespace
}  // namespace tandem
