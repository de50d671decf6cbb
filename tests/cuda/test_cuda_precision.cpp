// Precision modes and channels-last storage on CUDA, at the op level: every op chain runs on the GPU
// at f32, tf32, bf16 and f16 and is compared with the CPU's exact f32 (forward values and gradients, by
// relative L2 norm with a tolerance per precision). Also the wide per-channel reductions, their
// determinism, and a few mixed-precision training steps of a residual network.
#include <cmath>
#include <cstdlib>
#include <functional>

#include "backend/backend.h"
#include "cuda/cuda_test_util.h"
#include "ops/layout.h"
#include "ops/param_copies.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"
#include "tandem/precision.h"

namespace tandem {
namespace {

using namespace cudatest;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

const Precision kPrecisions[] = {Precision::f32, Precision::tf32, Precision::bf16, Precision::f16};

// Relative L2 error allowed against exact f32 for values of about unit size.
double tolerance(Precision p) {
  switch (p) {
    case Precision::f32: return 1e-4;
    case Precision::tf32: return 5e-3;
    case Precision::f16: return 1e-2;
    case Precision::bf16: return 4e-2;
  }
  return 0;
}

struct RunResult {
  Tensor out;
  std::vector<Tensor> grads;
};

// f on copies of the inputs on device d at precision p; backward of a fixed weighting of the output.
RunResult run(const Fn& f, const std::vector<Tensor>& inputs, Device d, Precision p) {
  std::vector<Tensor> in;
  for (const Tensor& t : inputs) {
    Tensor c = t.to(d).clone();
    if (is_floating(c.dtype())) c.requires_grad_();
    in.push_back(c);
  }
  Tensor out;
  {
    PrecisionScope scope(p);
    out = f(in);
  }
  Generator gen(4242);
  Tensor w = Tensor::uniform(out.shape(), -1.0, 1.0, gen).to(d).to(out.dtype());
  backward(out, {}, w);
  RunResult r{out.to(DType::f32), {}};
  for (const Tensor& t : in)
    if (t.requires_grad()) r.grads.push_back(t.grad());
  return r;
}

// grad_factor widens the gradient tolerance where a ReLU is involved: an output within rounding of zero
// opens or closes the ReLU's gate, and such flips move whole gradient elements.
void compare_with_cpu(const Fn& f, const std::vector<Tensor>& inputs, const std::string& what,
                      double grad_factor = 1.0) {
  const RunResult ref = run(f, inputs, Device::cpu(), Precision::f32);
  for (Precision p : kPrecisions) {
    const RunResult got = run(f, inputs, gpu(), p);
    const std::string name = what + " at " + precision_name(p);
    expect_norm_close(ref.out, got.out, tolerance(p), name + " output");
    ASSERT_EQ(ref.grads.size(), got.grads.size());
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      EXPECT_EQ(got.grads[i].dtype(), inputs[i].dtype()) << name << ": gradient " << i << " changed type";
      expect_norm_close(ref.grads[i], got.grads[i], grad_factor * tolerance(p), name + " gradient " + std::to_string(i));
    }
  }
}

TEST(CudaPrecision, ConvolutionInEveryPrecisionAndLayout) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    Shape x, w;
    int stride, pad;
    bool relu;
  };
  // 16 -> 32 channels runs channels-last under tf32/bf16/f16; 3 -> 20 stays NCHW.
  for (const Case& c : {Case{{4, 16, 12, 12}, {32, 16, 3, 3}, 1, 1, true}, Case{{4, 16, 12, 12}, {32, 16, 1, 1}, 2, 0, false},
                        Case{{3, 3, 17, 15}, {20, 3, 5, 5}, 1, 0, true}, Case{{2, 8, 9, 9}, {16, 8, 3, 3}, 2, 1, false}}) {
    Tensor x = rand_cpu(c.x, 101), w = rand_cpu(c.w, 102, -0.3, 0.3), b = rand_cpu({c.w[0]}, 103);
    Conv2dOptions opt{{c.stride, c.stride}, {c.pad, c.pad}, c.relu};
    compare_with_cpu([&](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], opt); }, {x, w, b},
                     "conv " + shape_str(c.x) + " * " + shape_str(c.w) + (c.relu ? " relu" : ""), c.relu ? 3.0 : 1.0);
  }
}

// Strided 1x1 convolutions (residual shortcuts) with their gradients as matrix products, forced on
// (TANDEM_CONV_STRIDED=1; the geometries are new to this process, so their plans are made under it):
// strides that divide the input and one that does not, and an input whose gradient accumulates from
// two such convolutions.
TEST(CudaPrecision, StridedPointwiseGradientsAsMatrixProducts) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  setenv("TANDEM_CONV_STRIDED", "1", 1);
  struct Case {
    Shape x, w;
    int stride;
  };
  for (const Case& c : {Case{{4, 32, 10, 10}, {16, 32, 1, 1}, 2}, Case{{3, 16, 11, 11}, {24, 16, 1, 1}, 3}}) {
    Tensor x = rand_cpu(c.x, 111), w = rand_cpu(c.w, 112, -0.3, 0.3);
    Conv2dOptions opt{{c.stride, c.stride}, {0, 0}, false};
    compare_with_cpu([&](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], Tensor(), opt); }, {x, w},
                     "strided pointwise conv " + shape_str(c.x) + " * " + shape_str(c.w));
  }
  Tensor x = rand_cpu({2, 40, 9, 9}, 113), w1 = rand_cpu({48, 40, 1, 1}, 114, -0.3, 0.3),
         w2 = rand_cpu({48, 40, 1, 1}, 115, -0.3, 0.3);
  Conv2dOptions opt{{2, 2}, {0, 0}, false};
  compare_with_cpu(
      [&](const std::vector<Tensor>& t) { return add(conv2d(t[0], t[1], Tensor(), opt), conv2d(t[0], t[2], Tensor(), opt)); },
      {x, w1, w2}, "two strided pointwise convs of one input");
  unsetenv("TANDEM_CONV_STRIDED");
}

// Grouped convolutions stay in planes (NCHW) at every precision, computing in f32 or TF32.
TEST(CudaPrecision, GroupedConvolutionInEveryPrecisionStaysPlanar) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const Conv2dOptions depthwise{{1, 1}, {1, 1}, false, 16};
  compare_with_cpu([&](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], depthwise); },
                   {rand_cpu({2, 16, 10, 10}, 31), rand_cpu({16, 1, 3, 3}, 32), rand_cpu({16}, 33)},
                   "depthwise conv2d");
  Tensor x = rand_cpu({2, 16, 10, 10}, 34).to(gpu()), w = rand_cpu({16, 1, 3, 3}, 35).to(gpu());
  for (Precision p : kPrecisions) {
    PrecisionScope scope(p);
    Tensor y = conv2d(x, w, Tensor(), depthwise);
    EXPECT_FALSE(ops::strictly_channels_last(y)) << precision_name(p);
    EXPECT_EQ(y.dtype(), DType::f32) << precision_name(p);
  }
}

TEST(CudaPrecision, ReducedPrecisionKeepsConvolutionsChannelsLast) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Tensor x = rand_cpu({2, 16, 8, 8}, 104).to(gpu()), w = rand_cpu({32, 16, 3, 3}, 105).to(gpu());
  for (Precision p : kPrecisions) {
    PrecisionScope scope(p);
    Tensor y = conv2d(x, w, Tensor(), {{1, 1}, {1, 1}});
    EXPECT_EQ(ops::strictly_channels_last(y), p != Precision::f32) << precision_name(p);
    EXPECT_EQ(y.dtype(), activation_dtype(p)) << precision_name(p);
    EXPECT_EQ(y.shape(), (Shape{2, 32, 8, 8}));
  }
}

// A residual block with pooling, a linear layer and the loss: x -> conv3x3 -> bn(+ bn(conv1x1(x)), relu)
// -> pooling -> global average -> linear -> softmax cross-entropy.
Fn residual_block(bool training, bool max_pool) {
  return [training, max_pool](const std::vector<Tensor>& t) {
    const Device d = t[0].device();
    Tensor labels = Tensor::from_vector(std::vector<int32_t>{1, 7, 3, 0}, {4}, d);
    Tensor rm1 = Tensor::zeros({16}, DType::f32, d), rv1 = Tensor::ones({16}, DType::f32, d);
    Tensor rm2 = Tensor::zeros({16}, DType::f32, d), rv2 = Tensor::ones({16}, DType::f32, d);
    Tensor skip = batch_norm2d(conv2d(t[0], t[2], Tensor(), {}), t[5], t[6], rm2, rv2, training);
    Tensor h = batch_norm2d_act(conv2d(t[0], t[1], Tensor(), {{1, 1}, {1, 1}}), skip, t[3], t[4], rm1, rv1, training,
                                true);
    h = max_pool ? max_pool2d(h, {{3, 3}, {2, 2}, {1, 1}}) : avg_pool2d(h, {{2, 2}, {2, 2}, {0, 0}});
    h = avg_pool2d(h, {{8, 8}, {8, 8}, {0, 0}});
    return softmax_cross_entropy(linear(flatten(h, 1), t[7], t[8]), labels);
  };
}

std::vector<Tensor> residual_inputs() {
  return {rand_cpu({4, 8, 16, 16}, 106),          rand_cpu({16, 8, 3, 3}, 107, -0.3, 0.3),
          rand_cpu({16, 8, 1, 1}, 108, -0.5, 0.5), rand_cpu({16}, 109, 0.5, 1.5),
          rand_cpu({16}, 110),                     rand_cpu({16}, 111, 0.5, 1.5),
          rand_cpu({16}, 112),                     rand_cpu({10, 16}, 113),
          rand_cpu({10}, 114)};
}

TEST(CudaPrecision, ResidualBlockInEveryPrecision) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // Average pooling here: a max-pool routes each gradient to one winner, and near-ties pick different
  // winners at different precisions, so its gradients are compared in exact f32 below.
  for (bool training : {true, false})
    compare_with_cpu(residual_block(training, false), residual_inputs(),
                     std::string("residual block, ") + (training ? "training" : "evaluation"), 3.0);
}

TEST(CudaPrecision, ChannelsLastInExactF32MatchesTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // Channels-last storage with exact arithmetic: any difference from the CPU is a layout error.
  ops::force_channels_last(1);
  for (bool training : {true, false}) {
    const std::vector<Tensor> in = residual_inputs();
    const RunResult ref = run(residual_block(training, true), in, Device::cpu(), Precision::f32);
    const RunResult got = run(residual_block(training, true), in, gpu(), Precision::f32);
    const std::string what = std::string("channels-last f32 residual block, ") + (training ? "training" : "evaluation");
    expect_norm_close(ref.out, got.out, 1e-5, what + " loss");
    for (size_t i = 0; i < ref.grads.size(); ++i)
      expect_norm_close(ref.grads[i], got.grads[i], 1e-4, what + " gradient " + std::to_string(i));
  }
  Tensor y = conv2d(rand_cpu({2, 3, 8, 8}, 118).to(gpu()), rand_cpu({16, 3, 3, 3}, 119).to(gpu()), Tensor(), {});
  EXPECT_TRUE(ops::strictly_channels_last(y));
  ops::force_channels_last(-1);
}

TEST(CudaPrecision, WideChannelReductionsMatchTheCpuAndRepeatBitForBit) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // Large enough that every channel is split over many blocks.
  const int64_t n = 32, c = 64, s = 56 * 56;
  Tensor g = rand_cpu({n, c, s}, 115);
  for (bool rows : {false, true}) {
    const int64_t rn = rows ? n * s : n, rs = rows ? 1 : s;
    Tensor want = Tensor::empty({c});
    cpu_be().bias_grad(g, rn, c, rs, want);
    Tensor gd = g.to(gpu()), a = Tensor::empty({c}, DType::f32, gpu()), b = Tensor::empty({c}, DType::f32, gpu());
    gpu_be().bias_grad(gd, rn, c, rs, a);
    gpu_be().bias_grad(gd, rn, c, rs, b);
    expect_close(want, a, 1e-5, 1e-4, rows ? "bias grad, rows" : "bias grad, planes");
    expect_same_bytes(a, b, "bias grad repeated");
  }
  // Batch-norm statistics on the same data, channels-last, repeated.
  Tensor x = ops::to_dense(rand_cpu({n, c, 56, 56}, 116, -1.0, 3.0).to(gpu()), DType::f32, true);
  Tensor gamma = Tensor::ones({c}, DType::f32, gpu()), beta = Tensor::zeros({c}, DType::f32, gpu());
  std::vector<Tensor> means;
  for (int rep = 0; rep < 2; ++rep) {
    Tensor rm = Tensor::zeros({c}, DType::f32, gpu()), rv = Tensor::ones({c}, DType::f32, gpu());
    Tensor y = batch_norm2d(x, gamma, beta, rm, rv, true);
    EXPECT_TRUE(ops::strictly_channels_last(y));
    means.push_back(rm);
  }
  expect_same_bytes(means[0], means[1], "batch-norm running mean repeated");
}

// Batch norm with the fused residual add and ReLU at shapes where every channel is split over many
// blocks (two levels of partial sums), odd channel counts leave threads idle, and a single channel takes
// a whole block: each layout (planes, rows) and 16-bit storage against the CPU's f32 on the same
// (rounded) values.
TEST(CudaPrecision, BatchNormAtLargeShapesInEveryLayoutMatchesTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct S {
    int64_t n, c, h, w;
  };
  for (S s : {S{16, 24, 28, 28}, S{8, 1, 100, 100}, S{4, 200, 7, 7}, S{64, 64, 14, 14}})
    for (bool rows : {false, true})
      for (DType dt : {DType::f32, DType::bf16}) {
        const Shape shape{s.n, s.c, s.h, s.w};
        const std::string what = "batch norm " + std::to_string(s.n) + "x" + std::to_string(s.c) + "x" +
                                 std::to_string(s.h) + "x" + std::to_string(s.w) + (rows ? " rows " : " planes ") +
                                 dtype_name(dt);
        // Inputs rounded to the storage type, so both sides see the same values.
        auto rounded = [&](uint64_t seed, double lo, double hi) { return rand_cpu(shape, seed, lo, hi).to(dt).to(DType::f32); };
        Tensor x = rounded(130, -1.0, 3.0), z = rounded(131, -1.0, 1.0), dy = rounded(132, -1.0, 1.0);
        Tensor gamma = rand_cpu({s.c}, 133, 0.5, 1.5), beta = rand_cpu({s.c}, 134);
        backend::BnArgs args;
        args.relu = true;
        const double m = double(s.n * s.h * s.w);
        // The CPU in f32, planes.
        Tensor rm = Tensor::zeros({s.c}), rv = Tensor::ones({s.c}), y = Tensor::empty(shape), sm = Tensor::empty({s.c}),
               si = Tensor::empty({s.c});
        cpu_be().batch_norm_forward_train(x, z, gamma, beta, rm, rv, args, y, sm, si);
        Tensor dx = Tensor::empty(shape), dz = Tensor::empty(shape), dg = Tensor::empty({s.c}), db = Tensor::empty({s.c});
        cpu_be().batch_norm_backward(dy, x, y, gamma, sm, si, args, dx, dz, dg, db);
        // The GPU in dt, stored as the layout says.
        auto up = [&](const Tensor& t) { return ops::to_dense(t.to(gpu()), dt, rows); };
        auto make = [&] { return rows ? ops::empty_channels_last(shape, dt, gpu()) : Tensor::empty(shape, dt, gpu()); };
        auto vec = [&](const Tensor& t) { return t.to(gpu()).clone(); };
        Tensor xg = up(x), zg = up(z), dyg = up(dy), gg = vec(gamma);
        Tensor rmg = vec(Tensor::zeros({s.c})), rvg = vec(Tensor::ones({s.c})), yg = make(),
               smg = Tensor::empty({s.c}, DType::f32, gpu()), sig = Tensor::empty({s.c}, DType::f32, gpu());
        args.nhwc = rows;
        gpu_be().batch_norm_forward_train(xg, zg, gg, vec(beta), rmg, rvg, args, yg, smg, sig);
        Tensor dxg = make(), dzg = make(), dgg = Tensor::empty({s.c}, DType::f32, gpu()),
               dbg = Tensor::empty({s.c}, DType::f32, gpu());
        gpu_be().batch_norm_backward(dyg, xg, yg, gg, smg, sig, args, dxg, dzg, dgg, dbg);
        const double out_tol = dt == DType::f32 ? 1e-5 : 1e-2;  // outputs are rounded to dt
        expect_close(sm, smg, 1e-5, 1e-6, what + " mean");
        expect_close(si, sig, 1e-5, 1e-6, what + " inverse deviation");
        expect_close(rm, rmg, 1e-5, 1e-6, what + " running mean");
        expect_close(rv, rvg, 1e-5, 1e-6, what + " running variance");
        expect_close(y, yg.to(DType::f32).contiguous(), out_tol, out_tol, what + " output");
        // The gradient sums see the same values on both sides (the ReLU mask included) as long as the
        // output rounded to dt keeps its sign, which it does away from underflow.
        expect_close(db, dbg, 1e-5, 1e-6 * std::sqrt(m), what + " dbeta");
        expect_close(dg, dgg, 1e-4, 1e-5 * std::sqrt(m), what + " dgamma");
        expect_close(dz, dzg.to(DType::f32).contiguous(), out_tol, out_tol, what + " dz");
        expect_close(dx, dxg.to(DType::f32).contiguous(), 10 * out_tol, 10 * out_tol, what + " dx");
      }
}

// Max pooling of channels-last tensors whose channels pack into 16-byte loads (ResNet's stem: 3x3,
// stride 2, padding 1) gives the same bits as the planes kernels, ties and NaNs included, in f32 and bf16.
TEST(CudaPrecision, ChannelsLastMaxPoolMatchesPlanesBitForBit) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct G {
    int64_t n, c, h, w, k, s, p;
  };
  for (G q : {G{4, 64, 28, 28, 3, 2, 1}, G{2, 16, 9, 11, 2, 2, 0}, G{3, 8, 7, 7, 3, 1, 1}})
    for (DType dt : {DType::f32, DType::bf16}) {
      backend::PoolGeom g{q.n, q.c, q.h, q.w, q.k, q.k, q.s, q.s, q.p, q.p, (q.h + 2 * q.p - q.k) / q.s + 1,
                          (q.w + 2 * q.p - q.k) / q.s + 1};
      const Shape xs{q.n, q.c, q.h, q.w}, ys{q.n, q.c, g.oh, g.ow};
      const std::string what = "max pool " + std::to_string(q.c) + " channels k" + std::to_string(q.k) + " s" +
                               std::to_string(q.s) + " " + dtype_name(dt);
      // Few distinct values (ties everywhere) and a NaN.
      std::vector<float> v = rand_cpu(xs, 140, 0.0, 4.0).to_vector<float>();
      for (float& e : v) e = std::floor(e);
      v[5] = NAN;
      Tensor x = Tensor::from_vector(v, xs).to(gpu()), dy = rand_cpu(ys, 141).to(gpu());
      Tensor xp = x.to(dt), dyp = dy.to(dt);
      Tensor y = Tensor::empty(ys, dt, gpu()), idx = Tensor::empty(ys, DType::i32, gpu()), dx = Tensor::empty(xs, dt, gpu());
      gpu_be().max_pool2d_forward(xp, g, y, idx);
      gpu_be().max_pool2d_backward(dyp, xp, y, idx, g, dx);
      g.nhwc = true;
      Tensor xc = ops::to_dense(xp, dt, true), dyc = ops::to_dense(dyp, dt, true);
      Tensor yc = ops::empty_channels_last(ys, dt, gpu()), idxc = ops::empty_channels_last(ys, DType::i32, gpu()),
             dxc = ops::empty_channels_last(xs, dt, gpu());
      gpu_be().max_pool2d_forward(xc, g, yc, idxc);
      gpu_be().max_pool2d_backward(dyc, xc, yc, idxc, g, dxc);
      expect_same_bytes(y, yc.contiguous(), what + " output");
      expect_same_bytes(idx, idxc.contiguous(), what + " indices");
      expect_same_bytes(dx, dxc.contiguous(), what + " input gradient");
    }
}

// ONNX's pooling geometry (asymmetric pads, ceil mode, the mean over the input elements only) on
// channels-last tensors, packed (64 channels) and not (3): the same bits as the planes kernels, forward and
// backward, max and average.
TEST(CudaPrecision, ChannelsLastPoolsInCeilModeMatchPlanesBitForBit) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (int64_t c : {int64_t{64}, int64_t{3}})
    for (bool count_pad : {true, false}) {
      // 9x8 input, kernel 3, stride 2, pads 1 before and 0 after, ceil mode: 5x4 windows, the last overhanging.
      backend::PoolGeom g{2, c, 9, 8, 3, 3, 2, 2, 1, 1, 5, 4};
      g.pad_bottom = g.pad_right = 0;
      g.count_pad = count_pad;
      const Shape xs{g.n, g.c, g.h, g.w}, ys{g.n, g.c, g.oh, g.ow};
      const std::string what =
          "ceil-mode pool " + std::to_string(c) + " channels" + (count_pad ? "" : " pads not counted");
      Tensor x = rand_cpu(xs, 142).to(gpu()), dy = rand_cpu(ys, 143).to(gpu());
      Tensor y = Tensor::empty(ys, DType::f32, gpu()), idx = Tensor::empty(ys, DType::i32, gpu());
      Tensor dx = Tensor::empty(xs, DType::f32, gpu()), ya = Tensor::empty(ys, DType::f32, gpu()),
             dxa = Tensor::empty(xs, DType::f32, gpu());
      gpu_be().max_pool2d_forward(x, g, y, idx);
      gpu_be().max_pool2d_backward(dy, x, y, idx, g, dx);
      gpu_be().avg_pool2d_forward(x, g, ya);
      gpu_be().avg_pool2d_backward(dy, g, dxa);
      g.nhwc = true;
      Tensor xc = ops::to_dense(x, DType::f32, true), dyc = ops::to_dense(dy, DType::f32, true);
      Tensor yc = ops::empty_channels_last(ys, DType::f32, gpu());
      Tensor idxc = ops::empty_channels_last(ys, DType::i32, gpu());
      Tensor dxc = ops::empty_channels_last(xs, DType::f32, gpu());
      Tensor yac = ops::empty_channels_last(ys, DType::f32, gpu());
      Tensor dxac = ops::empty_channels_last(xs, DType::f32, gpu());
      gpu_be().max_pool2d_forward(xc, g, yc, idxc);
      gpu_be().max_pool2d_backward(dyc, xc, yc, idxc, g, dxc);
      gpu_be().avg_pool2d_forward(xc, g, yac);
      gpu_be().avg_pool2d_backward(dyc, g, dxac);
      expect_same_bytes(y, yc.contiguous(), what + " max output");
      expect_same_bytes(idx, idxc.contiguous(), what + " max indices");
      expect_same_bytes(dx, dxc.contiguous(), what + " max input gradient");
      expect_same_bytes(ya, yac.contiguous(), what + " average output");
      expect_same_bytes(dxa, dxac.contiguous(), what + " average input gradient");
    }
}

TEST(CudaPrecision, MixedPrecisionStepsOfAResidualNetwork) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  nn::ModelConfig mc;
  mc.in_channels = 3;
  mc.height = 16;
  mc.width = 16;
  mc.num_classes = 10;
  Tensor x = rand_cpu({16, 3, 16, 16}, 117);
  std::vector<int32_t> lv;
  for (int i = 0; i < 16; ++i) lv.push_back(i % 10);
  Tensor labels = Tensor::from_vector(lv, {16});
  struct Trace {
    std::vector<double> losses;
    std::vector<Tensor> first_grads;
  };
  auto train = [&](Device d, Precision p) {
    nn::ModulePtr model = nn::make_model("resnet18", mc);
    model->to(d);
    optim::SgdOptions so;
    so.lr = 0.01;
    optim::SGD sgd(model->parameters(), so);
    Trace tr;
    for (int step = 0; step < 4; ++step) {
      Tensor loss;
      {
        PrecisionScope scope(p);
        loss = softmax_cross_entropy(model->forward(x.to(d)), labels.to(d));
      }
      EXPECT_EQ(loss.dtype(), DType::f32);  // the loss stays f32 whatever the precision
      tr.losses.push_back(loss.item<double>());
      sgd.zero_grad();
      backward(loss);
      for (const Tensor& prm : model->parameters()) {
        EXPECT_EQ(prm.dtype(), DType::f32);  // master weights and their gradients stay f32
        EXPECT_EQ(prm.grad().dtype(), DType::f32);
        if (step == 0) tr.first_grads.push_back(prm.grad().cpu().clone().view({-1}));  // a copy on the CPU too
      }
      sgd.step();
    }
    return tr;
  };
  // All gradients of a step as one vector: per-tensor errors of tiny tensors say little.
  auto concat = [](const std::vector<Tensor>& gs) {
    std::vector<float> all;
    for (const Tensor& g : gs) {
      std::vector<float> v = g.to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    return Tensor::from_vector(all, {static_cast<int64_t>(all.size())});
  };
  const Trace ref = train(Device::cpu(), Precision::f32);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  for (Precision p : kPrecisions) {
    const Trace got = train(gpu(), p);
    const std::string name = precision_name(p);
    EXPECT_NEAR(got.losses[0], ref.losses[0], tolerance(p) * std::fabs(ref.losses[0])) << name << " first loss";
    EXPECT_LT(got.losses.back(), got.losses.front()) << name << ": training does not lower the loss";
    // Batch norm over small batches amplifies rounding through 18 layers, so the gradients are compared
    // by direction: the cosine of the angle between the whole gradient vectors.
    const std::vector<float> a = concat(ref.first_grads).to_vector<float>(), b = concat(got.first_grads).to_vector<float>();
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ab += double(a[i]) * b[i];
      aa += double(a[i]) * a[i];
      bb += double(b[i]) * b[i];
    }
    const double min_cos = p == Precision::f32 ? 0.99999 : p == Precision::bf16 ? 0.93 : 0.98;
    EXPECT_GT(ab / std::sqrt(aa * bb), min_cos) << name << ": first gradients point elsewhere";
  }
}

// Four bf16 SGD steps (momentum, weight decay) of ResNet-18 on the images x under deterministic algorithms, the
// convolutions in the layout the caller forces; with copies the convolutions read the 16-bit filter copies SGD
// writes as it steps (each checked to be its parameter's rounding), else every f32 weight is converted at every
// step. Returns the parameters.
std::vector<std::vector<float>> train_bf16_resnet(const Tensor& x, const Tensor& labels, bool copies) {
  nn::ModelConfig mc;
  mc.in_channels = 3;
  mc.height = x.size(2);
  mc.width = x.size(3);
  mc.num_classes = 10;
  nn::ModulePtr model = nn::make_model("resnet18", mc);
  model->to(gpu());
  optim::SgdOptions so;
  so.lr = 0.02;
  so.momentum = 0.9;
  so.weight_decay = 1e-4;
  optim::SGD sgd(model->parameters(), so);
  std::vector<Tensor> kept;
  if (copies) {
    for (const Tensor& p : sgd.params()) kept.push_back(p.detach().contiguous().to(DType::bf16));
    sgd.set_parameter_copies(kept);
  }
  ParamCopies table(sgd.params(), copies ? kept : std::vector<Tensor>(sgd.params().size()), DType::bf16);
  for (int step = 0; step < 4; ++step) {
    ParamCopiesScope scope(copies ? &table : nullptr);
    Tensor loss;
    {
      PrecisionScope precision(Precision::bf16);
      loss = softmax_cross_entropy(model->forward(x), labels);
    }
    sgd.zero_grad();
    backward(loss);
    sgd.step();
    for (size_t i = 0; i < kept.size(); ++i)
      EXPECT_EQ(kept[i].to(DType::f32).to_vector<float>(), sgd.params()[i].to(DType::bf16).to(DType::f32).to_vector<float>())
          << "step " << step << ": the copy of parameter " << i << " is not its rounding";
  }
  std::vector<std::vector<float>> out;
  for (const Tensor& p : sgd.params()) out.push_back(p.to_vector<float>());
  return out;
}

// Two runs without copies, then one with them: the same bits, the first run's parameters given as converted.
void expect_runs_repeat_and_copies_match(const Tensor& x, const Tensor& labels, const std::string& layout) {
  const auto converted = train_bf16_resnet(x, labels, false), again = train_bf16_resnet(x, labels, false),
             read = train_bf16_resnet(x, labels, true);
  ASSERT_EQ(converted.size(), again.size());
  ASSERT_EQ(converted.size(), read.size());
  for (size_t i = 0; i < again.size(); ++i)
    EXPECT_EQ(again[i], converted[i]) << layout << " parameter " << i << ": two runs without copies differ (not deterministic)";
  for (size_t i = 0; i < read.size(); ++i) EXPECT_EQ(read[i], converted[i]) << layout << " parameter " << i;
}

// Under deterministic algorithms and a forced convolution layout (1 channels-last, 0 NCHW), a batch of n
// [3, hw, hw] images whose labels step by `step`: the runs of expect_runs_repeat_and_copies_match.
void check_layout(int mode, int64_t n, int64_t hw, uint64_t seed, int step, const char* layout) {
  const bool was_deterministic = deterministic_algorithms();
  set_deterministic_algorithms(true);
  ops::force_channels_last(mode);
  Tensor x = rand_cpu({n, 3, hw, hw}, seed).to(gpu());
  std::vector<int32_t> lv;
  for (int64_t i = 0; i < n; ++i) lv.push_back(static_cast<int32_t>((step * i) % 10));
  Tensor labels = Tensor::from_vector(lv, {n}).to(gpu());
  expect_runs_repeat_and_copies_match(x, labels, layout);
  ops::force_channels_last(-1);
  set_deterministic_algorithms(was_deterministic);
}

// bf16 steps of a residual network whose convolutions read the 16-bit filter copies SGD writes as it steps,
// against the same steps converting every f32 weight: the same bits, with the convolutions NCHW.
TEST(CudaPrecision, SgdWeightCopiesGiveTheBitsOfConvertingAtEveryStep) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  check_layout(0, 16, 16, 118, 3, "NCHW");
}

// The same with channels-last convolutions, which compute in bf16 (the rearrangement of a copy into
// channels-last is a plain copy). The geometry is one no other test uses, so the first run searches for the
// convolutions' algorithms and the later runs reuse them: a convolution whose input gradient is added into a
// residual connection's (cuDNN's beta) must give the same bits on its first call as on the later ones.
TEST(CudaPrecision, ChannelsLastBf16StepsOfAResidualNetworkRepeatTheirBits) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  check_layout(1, 12, 12, 119, 7, "channels-last");
}

}  // namespace
}  // namespace tandem
