// Products with fused epilogues on the GPU (cuBLASLt): each epilogue — bias, bias and GELU (its input kept),
// the GELU's derivative, the bias gradient taken with a weight gradient written in f32 — against the same
// steps run as separate kernels (the backend's composed default) on the same 16-bit inputs, for shapes
// cuBLASLt takes and one it may refuse (extents not a multiple of 8, which then falls back); a residual as the
// product's C operand, f32 biases of 16-bit products, the GELU's derivative with its bias gradient; and the ops
// that use them (gelu_mlp, linear_residual beside a layer norm of the same input) against the CPU's f32
// composition, values and every gradient.
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;
using backend::GemmEpilogue;
using backend::GemmFusion;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

double rel_tol(DType t) { return t == DType::bf16 ? 1e-2 : 2e-3; }

Tensor on_gpu(const Shape& s, uint64_t seed, DType t) { return rand_cpu(s, seed).to(t).to(gpu()); }

// Runs the product both ways: the backend's (fused where cuBLASLt takes it) and the composed default.
struct Both {
  Tensor fused, composed, fused_aux, composed_aux, fused_sums, composed_sums, fused_cols, composed_cols;
};

Both run_both(bool ta, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b, DType c_type,
              GemmEpilogue ep, const Tensor& bias, const Tensor& aux_in, bool sums, const Tensor& addend = Tensor(),
              bool col_sums = false) {
  Both r;
  for (int pass = 0; pass < 2; ++pass) {
    Tensor c = Tensor::empty({m, n}, c_type, gpu());
    GemmFusion f;
    f.epilogue = ep;
    f.bias = bias;
    f.addend = addend;
    if (ep == GemmEpilogue::BiasGelu) f.aux = Tensor::empty({m, n}, a.dtype(), gpu());
    if (ep == GemmEpilogue::DGelu) f.aux = aux_in;
    if (sums) f.a_row_sums = Tensor::empty({m}, DType::f32, gpu());
    if (col_sums) f.c_col_sums = Tensor::empty({n}, DType::f32, gpu());
    if (pass == 0)
      gpu_be().gemm_fused(ta, false, m, n, k, 1.0, a, b, 0.0, c, f);
    else
      gpu_be().backend::Backend::gemm_fused(ta, false, m, n, k, 1.0, a, b, 0.0, c, f);
    (pass == 0 ? r.fused : r.composed) = c.to(DType::f32).cpu();
    if (ep == GemmEpilogue::BiasGelu) (pass == 0 ? r.fused_aux : r.composed_aux) = f.aux.to(DType::f32).cpu();
    if (sums) (pass == 0 ? r.fused_sums : r.composed_sums) = f.a_row_sums.cpu();
    if (col_sums) (pass == 0 ? r.fused_cols : r.composed_cols) = f.c_col_sums.cpu();
  }
  return r;
}

TEST(CudaGemmFused, EveryEpilogueAgreesWithTheComposedKernels) {
  REQUIRE_GPU();
  for (DType t : {DType::bf16, DType::f16}) {
    // [m, n, k]: extents cuBLASLt takes, and n = 100 (not a multiple of 8: GELU's auxiliary output refuses it).
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{256, 384, 128}, {96, 100, 64}}) {
      const std::string tag = std::string(dtype_name(t)) + " " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                              std::to_string(k);
      const Tensor a = on_gpu({m, k}, 1, t), b = on_gpu({k, n}, 2, t), bias = on_gpu({n}, 3, t),
                   aux = on_gpu({m, n}, 4, t);
      const double tol = rel_tol(t);
      Both bias_r = run_both(false, m, n, k, a, b, t, GemmEpilogue::Bias, bias, Tensor(), false);
      expect_norm_close(bias_r.composed, bias_r.fused, tol, tag + " bias");
      Both gelu_r = run_both(false, m, n, k, a, b, t, GemmEpilogue::BiasGelu, bias, Tensor(), false);
      expect_norm_close(gelu_r.composed, gelu_r.fused, tol, tag + " bias + gelu");
      expect_norm_close(gelu_r.composed_aux, gelu_r.fused_aux, tol, tag + " bias + gelu: the gelu's input");
      Both dgelu_r = run_both(false, m, n, k, a, b, t, GemmEpilogue::DGelu, Tensor(), aux, false);
      expect_norm_close(dgelu_r.composed, dgelu_r.fused, tol, tag + " gelu derivative");
      // A weight gradient g^T x in f32 with g's column sums: g [k, m] (transposed), x [k, n].
      const Tensor g = on_gpu({k, m}, 5, t);
      Both wg = run_both(true, m, n, k, g, b, DType::f32, GemmEpilogue::None, Tensor(), Tensor(), true);
      expect_norm_close(wg.composed, wg.fused, tol, tag + " weight gradient in f32");
      expect_norm_close(wg.composed_sums, wg.fused_sums, 1e-5, tag + " bias gradient");
      // A residual as C, with a bias of the product's type, an f32 bias, and none.
      const Tensor res = on_gpu({m, n}, 6, t), bias32 = bias.to(DType::f32);
      Both add_r = run_both(false, m, n, k, a, b, t, GemmEpilogue::Bias, bias, Tensor(), false, res);
      expect_norm_close(add_r.composed, add_r.fused, tol, tag + " residual + bias");
      Both add32 = run_both(false, m, n, k, a, b, t, GemmEpilogue::Bias, bias32, Tensor(), false, res);
      expect_norm_close(add_r.composed, add32.fused, tol, tag + " residual + f32 bias");
      expect_norm_close(add32.composed, add32.fused, tol, tag + " residual + f32 bias, composed");
      Both add0 = run_both(false, m, n, k, a, b, t, GemmEpilogue::None, Tensor(), Tensor(), false, res);
      expect_norm_close(add0.composed, add0.fused, tol, tag + " residual, no bias");
      Both b32 = run_both(false, m, n, k, a, b, t, GemmEpilogue::Bias, bias32, Tensor(), false);
      expect_norm_close(bias_r.composed, b32.fused, tol, tag + " f32 bias");
      Both g32 = run_both(false, m, n, k, a, b, t, GemmEpilogue::BiasGelu, bias32, Tensor(), false);
      expect_norm_close(gelu_r.composed, g32.fused, tol, tag + " bias + gelu, f32 bias");
      expect_norm_close(gelu_r.composed_aux, g32.fused_aux, tol, tag + " bias + gelu, f32 bias: the gelu's input");
      // The GELU's derivative with the column sums of the result (the first bias's gradient) in f32.
      Both dcols = run_both(false, m, n, k, a, b, t, GemmEpilogue::DGelu, Tensor(), aux, false, Tensor(), true);
      expect_norm_close(dgelu_r.composed, dcols.fused, tol, tag + " gelu derivative with column sums");
      expect_norm_close(dcols.composed_cols, dcols.fused_cols, tol, tag + " gelu derivative's column sums");
    }
  }
}

// A block's residual path on the GPU against the CPU in f32: y = linear_residual(layer_norm(x), w, b, x), the
// norm's input gradient added into the residual's by its backward kernel, then gelu_mlp with a residual.
TEST(CudaGemmFused, ResidualProductsAndTheNormsGradientMatchTheCpu) {
  REQUIRE_GPU();
  const int64_t c = 64, hidden = 256;
  const Tensor x0 = rand_cpu({2, 24, c}, 21), w = rand_cpu({c, c}, 22, -0.2, 0.2), b = rand_cpu({c}, 23),
               g0 = rand_cpu({c}, 24, 0.5, 1.5), be0 = rand_cpu({c}, 25), w1 = rand_cpu({hidden, c}, 26, -0.2, 0.2),
               b1 = rand_cpu({hidden}, 27), w2 = rand_cpu({c, hidden}, 28, -0.1, 0.1), b2 = rand_cpu({c}, 29),
               dy = rand_cpu({2, 24, c}, 30);
  for (Precision p : {Precision::bf16, Precision::f16}) {
    const DType t = p == Precision::bf16 ? DType::bf16 : DType::f16;
    auto run = [&](Device d) {
      std::vector<Tensor> v;
      for (const Tensor& s : {x0, w, b, g0, be0, w1, b1, w2, b2})
        v.push_back(s.to(t).to(DType::f32).to(d).clone().requires_grad_());
      Tensor y;
      {
        PrecisionScope scope(d.is_cuda() ? p : Precision::f32);
        Tensor x = d.is_cuda() ? cast(v[0], t) : v[0];  // the residual stream in the compute type on the GPU
        Tensor h = linear_residual(layer_norm(x, {c}, v[3], v[4]), v[1], v[2], x);
        y = gelu_mlp(layer_norm(h, {c}, v[3], v[4]), v[5], v[6], v[7], v[8], h);
      }
      backward(y, {}, dy.to(t).to(y.dtype()).to(d));
      std::vector<Tensor> out{y.detach().to(DType::f32).cpu()};
      for (const Tensor& s : v) out.push_back(s.grad().cpu());
      return out;
    };
    const auto ref = run(Device::cpu()), got = run(gpu());
    const char* names[] = {"output", "d x", "d w", "d b", "d gamma", "d beta", "d w1", "d b1", "d w2", "d b2"};
    for (size_t i = 0; i < ref.size(); ++i)
      expect_norm_close(ref[i], got[i], 3 * rel_tol(t), std::string(dtype_name(t)) + " residual block " + names[i]);
  }
}

TEST(CudaGemmFused, GeluMlpMatchesTheCpuComposition) {
  REQUIRE_GPU();
  const int64_t c = 64, hidden = 256;
  const Tensor x0 = rand_cpu({2, 24, c}, 11), w1 = rand_cpu({hidden, c}, 12, -0.2, 0.2), b1 = rand_cpu({hidden}, 13),
               w2 = rand_cpu({c, hidden}, 14, -0.1, 0.1), b2 = rand_cpu({c}, 15), dy = rand_cpu({2, 24, c}, 16);
  for (Precision p : {Precision::bf16, Precision::f16}) {
    const DType t = p == Precision::bf16 ? DType::bf16 : DType::f16;
    auto run = [&](Device d, bool fused) {
      std::vector<Tensor> v;
      // 16-bit rounded inputs, f32 parameters (as mixed-precision training keeps them).
      for (const Tensor& s : {x0, w1, b1, w2, b2}) v.push_back(s.to(t).to(DType::f32).to(d).clone().requires_grad_());
      Tensor x = d.is_cuda() ? cast(v[0], t) : v[0];
      Tensor y;
      {
        PrecisionScope scope(d.is_cuda() ? p : Precision::f32);
        y = fused ? gelu_mlp(x, v[1], v[2], v[3], v[4])
                  : linear(gelu(linear(x, v[1], v[2]), true), v[3], v[4]);
      }
      backward(y, {}, dy.to(t).to(y.dtype()).to(d));
      std::vector<Tensor> out{y.detach().to(DType::f32).cpu()};
      for (const Tensor& s : v) out.push_back(s.grad().cpu());
      return out;
    };
    const auto ref = run(Device::cpu(), false), got = run(gpu(), true), composed = run(gpu(), false);
    const char* names[] = {"output", "d input", "d w1", "d b1", "d w2", "d b2"};
    for (size_t i = 0; i < ref.size(); ++i) {
      expect_norm_close(ref[i], got[i], 3 * rel_tol(t), std::string(dtype_name(t)) + " gelu_mlp " + names[i]);
      expect_norm_close(composed[i], got[i], 3 * rel_tol(t), std::string(dtype_name(t)) + " vs composed " + names[i]);
    }
  }
}

}  // namespace
}  // namespace tandem
