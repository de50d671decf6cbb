// Softmax, log-softmax, layer / RMS normalisation, the N-D losses and attention's math path on the GPU
// against the CPU: forward values and every gradient, in f32, f16 and bf16. 16-bit runs are compared with
// the CPU's f32 result on the same (16-bit rounded) inputs; shapes cover the warp-per-row kernels (with and
// without 16-byte accesses), the block-per-row kernels and axes that are not last.
#include <algorithm>
#include <cmath>
#include <functional>

#include "cuda/cuda_test_util.h"
#include "ops/padded_rows.h"
#include "tandem/autograd.h"
#include "tandem/graph.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Tol {
  double rtol, atol, grad_rel;  // elementwise for outputs, relative L2 norm for gradients
};

Tol tol_for(DType t) {
  switch (t) {
    case DType::f16: return {4e-3, 4e-3, 5e-3};
    case DType::bf16: return {2e-2, 2e-2, 3e-2};
    default: return {2e-5, 2e-6, 1e-5};
  }
}

struct Run {
  Tensor y;
  std::vector<Tensor> grads;
};

// f on leaves made from the inputs (as dtype on device d; differentiable inputs require a gradient),
// back-propagating dy; the output and gradients come back as CPU f32.
Run run_on(const std::vector<Tensor>& inputs, const std::vector<bool>& diff, DType dtype, Device d, const Fn& f,
           const Tensor& dy) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i];
    if (is_floating(t.dtype())) t = t.to(dtype);
    t = t.to(d).clone();
    if (diff[i]) t.requires_grad_();
    leaves.push_back(t);
  }
  Run r;
  Tensor y = f(leaves);
  backward(y, {}, dy.to(y.dtype()).to(d));
  r.y = y.detach().cpu().to(DType::f32);
  for (size_t i = 0; i < leaves.size(); ++i)
    r.grads.push_back(diff[i] ? leaves[i].grad().cpu().to(DType::f32) : Tensor());
  return r;
}

// Runs f on the CPU in f32 and on the GPU in dtype from the same inputs (16-bit rounded first) and compares.
// forward_in_norm: the output is compared as products are (relative L2 norm, expect_norm_close), for functions
// whose outputs come from long sums, which round differently element by element.
void compare(const std::vector<Tensor>& inputs, const std::vector<bool>& diff, DType dtype, const Fn& f,
             const std::string& what, double scale_tol = 1.0, bool forward_in_norm = false) {
  std::vector<Tensor> rounded;
  for (const Tensor& t : inputs) rounded.push_back(is_floating(t.dtype()) ? t.to(dtype).to(DType::f32) : t);
  Tensor y0;
  {
    std::vector<Tensor> probe = rounded;
    NoGradGuard ng;
    y0 = f(probe);
  }
  Tensor dy = rand_cpu(y0.shape(), 999);
  const Tol tol = tol_for(dtype);
  Run c = run_on(rounded, diff, DType::f32, Device::cpu(), f, dy);
  Run g = run_on(rounded, diff, dtype, gpu(), f, dy.to(dtype).to(DType::f32));
  const std::string tag = what + " " + dtype_name(dtype);
  if (forward_in_norm)
    expect_norm_close(c.y, g.y, tol.grad_rel * scale_tol, tag + " forward");
  else
    expect_close(c.y, g.y, tol.rtol * scale_tol, tol.atol * scale_tol, tag + " forward");
  for (size_t i = 0; i < inputs.size(); ++i)
    if (diff[i]) expect_norm_close(c.grads[i], g.grads[i], tol.grad_rel * scale_tol, tag + " gradient " + std::to_string(i));
}

const DType kTypes[] = {DType::f32, DType::f16, DType::bf16};

TEST(CudaNorm, SoftmaxAndLogSoftmaxRowsOfEveryKernel) {
  REQUIRE_GPU();
  // 10, 64: one vector per lane; 768, 1000: several; 7 and 33: no 16-byte accesses; 3000, 50257: a block per row.
  for (int64_t c : {1, 7, 10, 33, 64, 768, 1000, 3000, 50257}) {
    const int64_t n = c > 10000 ? 3 : 37;
    Tensor x = rand_cpu({n, c}, 10 + c, -4.0, 4.0);
    for (DType t : kTypes) {
      compare({x}, {true}, t, [](const std::vector<Tensor>& v) { return softmax(v[0], -1); },
              "softmax c=" + std::to_string(c));
      compare({x}, {true}, t, [](const std::vector<Tensor>& v) { return log_softmax(v[0], 1); },
              "log_softmax c=" + std::to_string(c));
    }
  }
}

TEST(CudaNorm, SoftmaxAlongLeadingAndMiddleAxes) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({4, 33, 5}, 3, -3.0, 3.0);
  for (DType t : kTypes)
    for (int64_t dim : {0, 1}) {
      compare({x}, {true}, t, [dim](const std::vector<Tensor>& v) { return softmax(v[0], dim); },
              "softmax dim " + std::to_string(dim));
      compare({x}, {true}, t, [dim](const std::vector<Tensor>& v) { return log_softmax(v[0], dim); },
              "log_softmax dim " + std::to_string(dim));
    }
}

TEST(CudaNorm, LayerNormAndRmsNorm) {
  REQUIRE_GPU();
  // 8, 768 (GPT-2), 1000, 1536, 2048: a warp per row (1, 3, 4, 6 and 8 vectors per lane in 16 bits; 2048 takes
  // more than the default shared memory in the backward); 777: unaligned rows; 4096: a block per row.
  for (int64_t c : {8, 768, 777, 1000, 1536, 2048, 4096}) {
    const int64_t n = 45;
    Tensor x = rand_cpu({n, c}, 20 + c, -2.0, 2.0), w = rand_cpu({c}, 21 + c, 0.5, 1.5), b = rand_cpu({c}, 22 + c);
    for (DType t : kTypes) {
      const std::string cs = " c=" + std::to_string(c);
      compare({x, w, b}, {true, true, true}, t,
              [c](const std::vector<Tensor>& v) { return layer_norm(v[0], {c}, v[1], v[2], 1e-5); },
              "layer_norm" + cs);
      compare({x}, {true}, t, [c](const std::vector<Tensor>& v) { return layer_norm(v[0], {c}); }, "layer_norm plain" + cs);
      compare({x, w}, {true, true}, t, [c](const std::vector<Tensor>& v) { return rms_norm(v[0], {c}, v[1]); },
              "rms_norm" + cs);
    }
  }
}

// Padded rows (ops/padded_rows.h): the norm's rows followed by a one and zeros in memory, read in place by a
// linear layer and the MLP after it, whose weight-gradient products take the bias gradients: values and
// gradients against the CPU's plain rows (both in norm: they come out of sums of up to 1536 products), for a
// warp per row (768: GPT-2; 64) and a block per row (20: rows not a whole number of vectors).
TEST(CudaNorm, PaddedRowsFeedTheProductsAfterTheNorm) {
  REQUIRE_GPU();
  for (int64_t c : {20, 64, 768}) {
    const int64_t n = 3, t = 37, hidden = 2 * c, ld = ops::padded_ld(c);
    Tensor x = rand_cpu({n, t, c}, 30 + c, -2.0, 2.0), lw = rand_cpu({c}, 31 + c, 0.5, 1.5),
           lb = rand_cpu({c}, 32 + c), w = rand_cpu({c, c}, 33 + c, -0.2, 0.2), b = rand_cpu({c}, 34 + c),
           w1 = rand_cpu({hidden, c}, 35 + c, -0.2, 0.2), b1 = rand_cpu({hidden}, 36 + c),
           w2 = rand_cpu({c, hidden}, 37 + c, -0.2, 0.2), b2 = rand_cpu({c}, 38 + c);
    for (DType dt : kTypes) {
      const std::string cs = " c=" + std::to_string(c);
      compare({x, lw, lb, w, b, w1, b1, w2, b2}, {true, true, true, true, true, true, true, true, true}, dt,
              [c](const std::vector<Tensor>& v) {
                const Tensor h = linear(ops::layer_norm_padded(v[0], {c}, v[1], v[2], 1e-5), v[3], v[4]);
                return gelu_mlp(ops::layer_norm_padded(h, {c}, v[1], v[2], 1e-5), v[5], v[6], v[7], v[8], h);
              },
              "padded rows" + cs, 2.0, true);
      // The rows as written on the device: the norm's values, a one, zeros.
      Tensor y = ops::layer_norm_padded(x.to(dt).to(gpu()), {c}, lw.to(dt).to(gpu()), lb.to(dt).to(gpu()), 1e-5);
      const Tensor rows = ops::padded_rows_of(reshape(y, {n * t, c}));
      ASSERT_TRUE(rows.defined()) << cs;
      const std::vector<float> got = rows.cpu().to(DType::f32).to_vector<float>();
      const std::vector<float> plain = reshape(y, {n * t, c}).cpu().to(DType::f32).to_vector<float>();
      for (int64_t r = 0; r < n * t; ++r) {
        for (int64_t j = 0; j < c; ++j) ASSERT_EQ(got[r * ld + j], plain[r * c + j]) << cs << " " << r << ", " << j;
        ASSERT_EQ(got[r * ld + c], 1.0f) << cs << " row " << r;
        for (int64_t j = c + 1; j < ld; ++j) ASSERT_EQ(got[r * ld + j], 0.0f) << cs << " " << r << ", " << j;
      }
    }
  }
}

// The backward's column sums of dx as stored (written or added into a gradient already there), which a
// residual branch's bias gradient takes: equal to the sums of the stored values, for every warp-per-row width;
// rows the warp kernel does not take (unaligned, or a block per row) report that they gave none.
TEST(CudaNorm, LayerNormBackwardSumsTheColumnsOfDx) {
  REQUIRE_GPU();
  for (int64_t c : {8, 768, 777, 2048, 4096}) {
    const int64_t n = 300;
    for (DType t : kTypes) {
      const std::string what = std::string(dtype_name(t)) + " c=" + std::to_string(c);
      Tensor x = rand_cpu({n, c}, 40 + c, -2.0, 2.0).to(t).to(gpu()), dy = rand_cpu({n, c}, 41 + c).to(t).to(gpu());
      Tensor w = rand_cpu({c}, 42 + c, 0.5, 1.5).to(gpu()), b = rand_cpu({c}, 43 + c).to(gpu());
      Tensor y = Tensor::empty({n, c}, t, gpu()), mean = Tensor::empty({n}, DType::f32, gpu()),
             rstd = Tensor::empty({n}, DType::f32, gpu());
      gpu_be().layer_norm_forward(x, w, b, n, c, 1e-5, false, y, mean, rstd);
      const int64_t vec = 16 / static_cast<int64_t>(dtype_size(t));  // elements a 16-byte access holds
      const bool warp = c % vec == 0 && (c + 32 * vec - 1) / (32 * vec) <= 8;
      for (bool add : {false, true}) {
        Tensor dx = add ? rand_cpu({n, c}, 44 + c).to(t).to(gpu()) : Tensor::empty({n, c}, t, gpu());
        Tensor dw = Tensor::empty({c}, DType::f32, gpu()), db = Tensor::empty({c}, DType::f32, gpu());
        Tensor sums = Tensor::empty({c}, DType::f32, gpu());
        const bool summed = add ? gpu_be().layer_norm_backward_add(dy, x, w, mean, rstd, n, c, false, dx, dw, db, sums)
                                : gpu_be().layer_norm_backward(dy, x, w, mean, rstd, n, c, false, dx, dw, db, sums);
        EXPECT_EQ(summed, warp) << what;
        if (!summed) continue;
        const std::vector<double> v = dx.cpu().to_vector<double>(), got = sums.cpu().to_vector<double>();
        double worst = 0.0;
        for (int64_t j = 0; j < c; ++j) {
          double want = 0.0, mag = 0.0;
          for (int64_t i = 0; i < n; ++i) {
            want += v[i * c + j];
            mag += std::fabs(v[i * c + j]);
          }
          worst = std::max(worst, std::fabs(got[j] - want) / (mag + 1e-30));
        }
        EXPECT_LT(worst, 2e-5) << what << (add ? " added" : "") << ": column sums off by " << worst
                               << " of the columns' absolute sums";
      }
    }
  }
}

TEST(CudaNorm, LayerNormOf16BitDataWithF32Parameters) {
  REQUIRE_GPU();
  const int64_t n = 64, c = 768;
  Tensor x = rand_cpu({n, c}, 31, -2.0, 2.0), w = rand_cpu({c}, 32, 0.5, 1.5), b = rand_cpu({c}, 33);
  Tensor dy = rand_cpu({n, c}, 34);
  for (DType t : {DType::f16, DType::bf16}) {
    Tensor xr = x.to(t).to(DType::f32);
    Tensor xc = xr.clone(), wc = w.clone(), bc = b.clone();
    for (Tensor* p : {&xc, &wc, &bc}) p->requires_grad_();
    backward(layer_norm(xc, {c}, wc, bc), {}, dy.to(t).to(DType::f32));
    Tensor xg = x.to(t).to(gpu()).clone(), wg = w.to(gpu()).clone(), bg = b.to(gpu()).clone();
    for (Tensor* p : {&xg, &wg, &bg}) p->requires_grad_();
    Tensor y = layer_norm(xg, {c}, wg, bg);
    EXPECT_EQ(y.dtype(), t);
    backward(y, {}, dy.to(t).to(gpu()));
    EXPECT_EQ(wg.grad().dtype(), DType::f32);
    const Tol tol = tol_for(t);
    expect_norm_close(wc.grad(), wg.grad(), tol.grad_rel, std::string("f32 weight gradient of ") + dtype_name(t));
    expect_norm_close(bc.grad(), bg.grad(), tol.grad_rel, std::string("f32 bias gradient of ") + dtype_name(t));
    expect_norm_close(xc.grad(), xg.grad().to(DType::f32), tol.grad_rel, std::string("input gradient ") + dtype_name(t));
  }
}

TEST(CudaNorm, ClassLossesOverNdLogits) {
  REQUIRE_GPU();
  // 10: a warp per row; 3000: a block per row, rows 16-byte aligned; 3001: rows starting anywhere.
  for (int64_t c : {10, 3000, 3001}) {
    Tensor logits = rand_cpu({3, 5, c}, 40 + c, -3.0, 3.0);
    std::vector<int64_t> tv;
    for (int64_t i = 0; i < 15; ++i) tv.push_back(i % 4 == 1 ? -100 : (i * 7919) % c);
    Tensor targets = Tensor::from_vector(tv, {3, 5});
    for (DType t : kTypes)
      for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        const std::string tag = std::string(reduction_name(r)) + " c=" + std::to_string(c);
        compare({logits, targets}, {true, false}, t,
                [r](const std::vector<Tensor>& v) { return softmax_cross_entropy(v[0], v[1], r); }, "cross_entropy " + tag);
        compare({logits, targets}, {true, false}, t,
                [r](const std::vector<Tensor>& v) { return nll_loss(v[0], v[1], r); }, "nll_loss " + tag);
      }
  }
}

// The fused classifier (its logits overwritten by their gradient in the forward) against the CPU: a warp per
// row (10 classes), a block per row with aligned (3000) and unaligned (3001) rows, ignored positions; the
// inputs' and the head's gradients. Also: the CUDA result equals the unfused composition on the GPU.
TEST(CudaNorm, LinearCrossEntropyFusesTheHeadWithTheLoss) {
  REQUIRE_GPU();
  // 20000 and 70001: long rows, aligned and not.
  for (int64_t c : {10, 3000, 3001, 20000, 70001}) {
    Tensor x = rand_cpu({3, 5, 16}, 50 + c, -1.0, 1.0), w = rand_cpu({c, 16}, 60 + c, -1.0, 1.0);
    std::vector<int64_t> tv;
    for (int64_t i = 0; i < 15; ++i) tv.push_back(i % 4 == 1 ? -100 : (i * 7919) % c);
    Tensor targets = Tensor::from_vector(tv, {3, 5});
    for (DType t : kTypes)
      for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
        const std::string tag = std::string(reduction_name(r)) + " c=" + std::to_string(c);
        const Fn fused = [r](const std::vector<Tensor>& v) { return linear_cross_entropy(v[0], v[1], v[2], r); };
        compare({x, w, targets}, {true, true, false}, t, fused, "linear_cross_entropy " + tag);
        const Fn plain = [r](const std::vector<Tensor>& v) {
          return softmax_cross_entropy(linear(v[0], v[1], Tensor()), v[2], r);
        };
        const Tensor dy = Tensor::full({}, 0.5);
        auto a = run_on({x, w, targets}, {true, true, false}, t, gpu(), fused, dy);
        auto b = run_on({x, w, targets}, {true, true, false}, t, gpu(), plain, dy);
        const Tol tol = tol_for(t);
        expect_close(b.y, a.y, tol.rtol, tol.atol, "fused vs composed " + tag + " loss");
        expect_norm_close(b.grads[0], a.grads[0], tol.grad_rel, "fused vs composed " + tag + " d input");
        expect_norm_close(b.grads[1], a.grads[1], tol.grad_rel, "fused vs composed " + tag + " d weight");
        // The logits in chunks of 4 positions (the weight's gradient accumulated in f32 over the chunks).
        const Fn chunked = [r](const std::vector<Tensor>& v) {
          return linear_cross_entropy(v[0], v[1], v[2], r, -100, 4);
        };
        auto ch = run_on({x, w, targets}, {true, true, false}, t, gpu(), chunked, dy);
        expect_close(b.y, ch.y, tol.rtol, tol.atol, "chunked vs composed " + tag + " loss");
        expect_norm_close(b.grads[0], ch.grads[0], tol.grad_rel, "chunked vs composed " + tag + " d input");
        expect_norm_close(b.grads[1], ch.grads[1], tol.grad_rel, "chunked vs composed " + tag + " d weight");
      }
  }
}

// The fused classifier with its last rows masked (a token table padded to a multiple of 64: classes < rows)
// against the CPU's masked one: the loss and both gradients; on the GPU the padding rows' gradient is exactly
// zero and the rest is the composition on the first `classes` rows alone, in one chunk and in chunks of 4
// positions. A warp per row (10 of 16), a block per row (3001 and 2990 of 3008: rows that end unaligned), long
// rows (20000 of 20032; GPT-2's 50257 of 50304). The padding rows are random, so that a padding logit taken into
// the softmax would show.
TEST(CudaNorm, LinearCrossEntropyMasksThePaddingClasses) {
  REQUIRE_GPU();
  const std::pair<int64_t, int64_t> shapes[] = {{16, 10}, {3008, 3001}, {3008, 2990}, {20032, 20000}, {50304, 50257}};
  for (auto [rows, classes] : shapes) {
    Tensor x = rand_cpu({3, 5, 16}, 80 + rows, -1.0, 1.0), w = rand_cpu({rows, 16}, 90 + classes, -2.0, 2.0);
    std::vector<int64_t> tv;
    for (int64_t i = 0; i < 15; ++i) tv.push_back(i % 4 == 1 ? -100 : i == 2 ? classes - 1 : (i * 7919) % classes);
    Tensor targets = Tensor::from_vector(tv, {3, 5});
    const int64_t cl = classes;
    for (DType t : kTypes)
      for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
        const std::string tag = std::string(reduction_name(r)) + " " + std::to_string(classes) + " of " +
                                std::to_string(rows) + " " + dtype_name(t);
        for (int64_t chunk : {0, 4}) {
          const Fn masked = [r, cl, chunk](const std::vector<Tensor>& v) {
            return linear_cross_entropy(v[0], v[1], v[2], r, -100, chunk, cl);
          };
          const std::string what = tag + (chunk ? " in chunks" : "");
          compare({x, w, targets}, {true, true, false}, t, masked, "masked linear_cross_entropy " + what);
          const Fn plain = [r, cl](const std::vector<Tensor>& v) {
            return softmax_cross_entropy(linear(v[0], slice(v[1], 0, 0, cl), Tensor()), v[2], r);
          };
          const Tensor dy = Tensor::full({}, 0.5);
          auto a = run_on({x, w, targets}, {true, true, false}, t, gpu(), masked, dy);
          auto b = run_on({x, w, targets}, {true, true, false}, t, gpu(), plain, dy);
          const Tol tol = tol_for(t);
          expect_close(b.y, a.y, tol.rtol, tol.atol, "masked vs the first rows' " + what + " loss");
          expect_norm_close(b.grads[0], a.grads[0], tol.grad_rel, "masked vs the first rows' " + what + " d input");
          expect_norm_close(b.grads[1], a.grads[1], tol.grad_rel, "masked vs the first rows' " + what + " d weight");
          int64_t nonzero = 0;
          for (double v : host_values(a.grads[1].narrow(0, classes, rows - classes))) nonzero += v != 0.0;
          EXPECT_EQ(nonzero, 0) << "the padding rows' gradient " << what;
        }
      }
  }
}

TEST(CudaNorm, ElementwiseLosses) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({6, 7}, 50, -3.0, 3.0), t = rand_cpu({6, 7}, 51, 0.0, 1.0), p = rand_cpu({6, 7}, 52, 0.05, 0.95);
  for (DType dt : kTypes)
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      const std::string tag = reduction_name(r);
      compare({x, t}, {true, true}, dt, [r](const std::vector<Tensor>& v) { return mse_loss(v[0], v[1], r); },
              "mse " + tag);
      compare({p, t}, {true, false}, dt,
              [r](const std::vector<Tensor>& v) { return binary_cross_entropy(v[0], v[1], r); }, "bce " + tag);
      compare({x, t}, {true, false}, dt,
              [r](const std::vector<Tensor>& v) { return binary_cross_entropy_with_logits(v[0], v[1], r); },
              "bce with logits " + tag);
    }
}

TEST(CudaNorm, OutOfRangeTargetIsReportedAtTheNextSync) {
  REQUIRE_GPU();
  Tensor logits = rand_cpu({2, 4}, 60).to(gpu());
  Tensor targets = Tensor::from_vector<int64_t>({1, 9}, {2}).to(gpu());
  Tensor loss = softmax_cross_entropy(logits, targets, Reduction::Sum);
  EXPECT_THROW(synchronize(gpu()), Error);
  EXPECT_TRUE(std::isnan(loss.item<float>()));
}

TEST(CudaNorm, AttentionMathPathInF32) {
  REQUIRE_GPU();
  PrecisionScope exact(Precision::f32);
  Tensor q = rand_cpu({2, 3, 17, 8}, 70), k = rand_cpu({2, 3, 23, 8}, 71), v = rand_cpu({2, 3, 23, 5}, 72);
  for (bool causal : {false, true})
    compare({q, k, v}, {true, true, true}, DType::f32,
            [causal](const std::vector<Tensor>& t) { return scaled_dot_product_attention(t[0], t[1], t[2], causal); },
            causal ? "attention causal" : "attention");
  // Dropout draws the same mask on both devices from the counter-based generator.
  compare({q, k, v}, {true, true, true}, DType::f32,
          [](const std::vector<Tensor>& t) {
            Generator g(3);
            return scaled_dot_product_attention(t[0], t[1], t[2], true, 0.25, 0.0, &g);
          },
          "attention dropout");
}

TEST(CudaNorm, DropoutOnNdTensorsMatchesTheCpu) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({3, 4, 5, 2}, 80);
  for (DType t : kTypes)
    compare({x}, {true}, t,
            [](const std::vector<Tensor>& v) {
              Generator g(11);
              return dropout(v[0], 0.3, true, g);
            },
            "dropout");
}

TEST(CudaNorm, RecordedStepReplaysNormalisationAndLosses) {
  REQUIRE_GPU();
  // A small language-model tail: layer norm, attention's math path, log-softmax, cross-entropy with ignored
  // positions, all forward and backward, recorded once and replayed: nothing in it may wait for the device.
  Tensor x = rand_cpu({2, 8, 16}, 90).to(gpu()), w = rand_cpu({16}, 91, 0.5, 1.5).to(gpu()), b = rand_cpu({16}, 92).to(gpu());
  for (Tensor* t : {&x, &w, &b}) t->requires_grad_();
  Tensor targets = Tensor::from_vector<int64_t>({1, 2, 3, -100, 5, 6, 7, 8, 9, 10, -100, 12, 13, 14, 15, 0}, {2, 8}).to(gpu());
  auto step = [&] {
    Tensor h = layer_norm(x, {16}, w, b);
    Tensor q = reshape(h, {2, 1, 8, 16});
    Tensor a = reshape(scaled_dot_product_attention(q, q, q, true), {2, 8, 16});
    Tensor l = softmax_cross_entropy(log_softmax(a, -1), targets, Reduction::Mean);
    backward(l);
    return l;
  };
  Tensor eager = step().detach().clone();
  Tensor eager_gw = w.grad().clone();
  for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
  Tensor loss;
  DeviceGraph graph(gpu(), [&] { loss = step(); });
  graph.replay();
  synchronize(gpu());
  expect_same_bytes(eager, loss.detach(), "replayed loss");
  expect_same_bytes(eager_gw, w.grad(), "replayed weight gradient");
}

}  // namespace
}  // namespace tandem
