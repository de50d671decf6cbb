// CUDA backend kernels against the CPU backend on the same random inputs: elementwise ops, bias
// broadcast and reduction, sums, GEMM, convolution, pooling, batch norm, losses and metrics, softmax.
#include <cmath>
#include <cstdlib>
#include <functional>
#include <utility>

#include "cuda/cuda_test_util.h"

namespace tandem {
namespace {

using namespace cudatest;
using backend::Backend;
using backend::BnArgs;
using backend::Binary;
using backend::Unary;
using Outputs = std::vector<Tensor>;
using Kernel = std::function<Outputs(Backend&, Device)>;

// Runs the kernel on both backends and compares every output, elementwise or (for GEMM and
// convolution, whose summation orders differ) by relative norm.
void compare(const Kernel& k, double rtol, double atol, const std::string& what, bool by_norm = false) {
  Outputs c = k(cpu_be(), Device::cpu());
  Outputs g = k(gpu_be(), gpu());
  ASSERT_EQ(c.size(), g.size());
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string name = what + " (output " + std::to_string(i) + ")";
    if (by_norm)
      expect_norm_close(c[i], g[i], rtol, name);
    else
      expect_close(c[i], g[i], rtol, atol, name);
  }
}

void compare_exact(const Kernel& k, const std::string& what) {
  Outputs c = k(cpu_be(), Device::cpu());
  Outputs g = k(gpu_be(), gpu());
  ASSERT_EQ(c.size(), g.size());
  for (size_t i = 0; i < c.size(); ++i) expect_same_bytes(c[i], g[i], what + " (output " + std::to_string(i) + ")");
}

const int64_t kSizes[] = {1, 7, 1000, 65537};

TEST(CudaKernels, BinaryF32) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (Binary op : {Binary::Add, Binary::Sub, Binary::Mul, Binary::Div, Binary::Max, Binary::Min, Binary::Gt,
                    Binary::Ge, Binary::Lt, Binary::Le, Binary::Eq}) {
    for (int64_t n : kSizes) {
      Tensor a = rand_cpu({n}, 1), b = rand_cpu({n}, 2, 0.25, 2.0);
      compare(
          [&](Backend& be, Device d) {
            // clone: on the CPU, to() returns the input itself, which the aliasing call below overwrites
            Tensor x = a.to(d).clone(), y = b.to(d), o = Tensor::empty({n}, DType::f32, d);
            be.binary(op, x, y, o);
            be.binary(op, x, y, x);  // the output may alias an input
            return Outputs{o, x};
          },
          1e-6, 0.0, "binary " + std::to_string(int(op)) + " n=" + std::to_string(n));
    }
  }
}

TEST(CudaKernels, SoftmaxRowsAndTheirGradient) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (auto [n, c] : {std::pair<int64_t, int64_t>{1, 1}, {3, 10}, {64, 1000}, {5, 33}}) {
    Tensor x = rand_cpu({n, c}, 11, -8.0, 8.0), dy = rand_cpu({n, c}, 12);
    compare(
        [&](Backend& be, Device d) {
          Tensor y = Tensor::empty({n, c}, DType::f32, d), dx = Tensor::empty({n, c}, DType::f32, d);
          be.softmax_rows(x.to(d), n, c, y);
          be.softmax_rows_backward(dy.to(d), y, n, c, dx);
          return Outputs{y, dx};
        },
        1e-5, 1e-7, "softmax rows n=" + std::to_string(n) + " c=" + std::to_string(c));
  }
}

TEST(CudaKernels, BinaryIntegers) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::vector<int64_t> av, bv;
  for (int64_t i = 0; i < 3001; ++i) {
    av.push_back((i * 7919) % 2001 - 1000);
    int64_t b = (i * 104729) % 97 - 48;
    bv.push_back(b == 0 ? 5 : b);
  }
  for (DType dt : {DType::i32, DType::i64}) {
    Tensor a = Tensor::from_vector(av, {3001}).to(dt), b = Tensor::from_vector(bv, {3001}).to(dt);
    for (Binary op : {Binary::Add, Binary::Sub, Binary::Mul, Binary::Div, Binary::Max, Binary::Min, Binary::Gt,
                      Binary::Ge, Binary::Lt, Binary::Le, Binary::Eq}) {
      compare_exact(
          [&](Backend& be, Device d) {
            Tensor o = Tensor::empty({3001}, dt, d);
            be.binary(op, a.to(d), b.to(d), o);
            return Outputs{o};
          },
          std::string("binary ") + dtype_name(dt) + " op " + std::to_string(int(op)));
    }
  }
}

TEST(CudaKernels, Unary) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (Unary op : {Unary::Neg, Unary::Relu, Unary::Sigmoid, Unary::Tanh, Unary::Exp, Unary::Log, Unary::Abs,
                   Unary::Sqrt}) {
    const bool positive = op == Unary::Log || op == Unary::Sqrt;
    for (int64_t n : kSizes) {
      Tensor a = positive ? rand_cpu({n}, 3, 0.05, 4.0) : rand_cpu({n}, 3, -4.0, 4.0);
      compare(
          [&](Backend& be, Device d) {
            Tensor o = Tensor::empty({n}, DType::f32, d);
            be.unary(op, a.to(d), o);
            return Outputs{o};
          },
          2e-6, 1e-7, "unary " + std::to_string(int(op)) + " n=" + std::to_string(n));
    }
  }
}

TEST(CudaKernels, AffineAxpyAndActivationBackward) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (int64_t n : kSizes) {
    Tensor a = rand_cpu({n}, 4), b = rand_cpu({n}, 5), y01 = rand_cpu({n}, 6, 0.0, 1.0), ys = rand_cpu({n}, 7);
    compare(
        [&](Backend& be, Device d) {
          Tensor o = Tensor::empty({n}, DType::f32, d), acc = b.to(d).clone();
          be.affine(a.to(d), 1.7, -0.3, o);
          be.axpy(-0.6, a.to(d), acc);
          Tensor r = Tensor::empty({n}, DType::f32, d), s = Tensor::empty({n}, DType::f32, d),
                 t = Tensor::empty({n}, DType::f32, d);
          be.unary_backward(Unary::Relu, b.to(d), ys.to(d), r);
          be.unary_backward(Unary::Sigmoid, b.to(d), y01.to(d), s);
          be.unary_backward(Unary::Tanh, b.to(d), ys.to(d), t);
          return Outputs{o, acc, r, s, t};
        },
        1e-6, 1e-7, "affine/axpy/backward n=" + std::to_string(n));
  }
}

TEST(CudaKernels, RejectsDtypesTheyDoNotTake) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Tensor d64 = Tensor::zeros({8}, DType::f64, gpu()), out = Tensor::empty({8}, DType::f64, gpu());
  auto expect_message = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << op << " accepted an f64 tensor";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
    }
  };
  expect_message([&] { gpu_be().unary(Unary::Relu, d64, out); }, "unary");
  expect_message([&] { gpu_be().random_uniform(out, 1, 0, 0.0, 1.0); }, "random_uniform");
  expect_message([&] { gpu_be().binary(Binary::Add, d64, d64, out); }, "binary");
  // Conversions and fills take every dtype, f64 included.
  EXPECT_EQ(Tensor::full({3}, 2.5, DType::f64, gpu()).to_vector<double>(), std::vector<double>(3, 2.5));
}

struct NCS {
  int64_t n, c, s;
};
const NCS kBiasShapes[] = {{64, 10, 1}, {3, 1000, 1}, {2, 5, 49}, {7, 3, 1}, {1, 1, 1}, {4, 16, 13 * 17}, {129, 33, 1}};

TEST(CudaKernels, BiasAddAndBiasGrad) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const NCS& sh : kBiasShapes) {
    Tensor x = rand_cpu({sh.n, sh.c, sh.s}, 8), b = rand_cpu({sh.c}, 9);
    const std::string what = "bias n=" + std::to_string(sh.n) + " c=" + std::to_string(sh.c) + " s=" + std::to_string(sh.s);
    compare(
        [&](Backend& be, Device d) {
          Tensor o = Tensor::empty(x.shape(), DType::f32, d);
          be.bias_add(x.to(d), b.to(d), sh.n, sh.c, sh.s, o);
          return Outputs{o};
        },
        1e-6, 0.0, what + " add");
    compare(
        [&](Backend& be, Device d) {
          Tensor o = Tensor::empty({sh.c}, DType::f32, d);
          be.bias_grad(x.to(d), sh.n, sh.c, sh.s, o);
          return Outputs{o};
        },
        1e-5, 1e-6 * std::sqrt(double(sh.n * sh.s)), what + " grad");
  }
}

TEST(CudaKernels, Sum) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(513 * 1024 + 3), (int64_t(1) << 21) + 5}) {
    Tensor x = rand_cpu({n}, 10, -0.5, 1.5);
    compare(
        [&](Backend& be, Device d) {
          Tensor o = Tensor::empty({}, DType::f32, d);
          be.sum(x.to(d), o);
          return Outputs{o};
        },
        1e-5, 1e-6 * double(n), "sum f32 n=" + std::to_string(n));
  }
  std::vector<int64_t> iv;
  int64_t expect = 0;
  for (int64_t i = 0; i < 600001; ++i) {
    iv.push_back((i * 31) % 2001 - 1000);
    expect += iv.back();
  }
  Tensor xi = Tensor::from_vector(iv, {600001});
  for (DType dt : {DType::i32, DType::i64}) {
    compare_exact(
        [&](Backend& be, Device d) {
          Tensor o = Tensor::empty({}, dt, d);
          be.sum(xi.to(dt).to(d), o);
          return Outputs{o};
        },
        std::string("sum ") + dtype_name(dt));
  }
  Tensor wide = Tensor::empty({}, DType::i64, gpu());
  gpu_be().sum(xi.to(DType::i32).to(gpu()), wide);
  EXPECT_EQ(wide.item<int64_t>(), expect);
}

TEST(CudaKernels, Gemm) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct MNK {
    int64_t m, n, k;
  };
  for (MNK s : {MNK{1, 1, 1}, MNK{7, 5, 3}, MNK{64, 500, 800}, MNK{33, 17, 129}, MNK{1, 300, 2}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        Tensor a = rand_cpu(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, 11);
        Tensor b = rand_cpu(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, 12);
        Tensor c0 = rand_cpu({s.m, s.n}, 13);
        const std::string what = "gemm " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
                                 " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
        compare(
            [&](Backend& be, Device d) {
              Tensor c = c0.to(d).clone(), fresh = Tensor::full({s.m, s.n}, NAN, DType::f32, d);
              be.gemm(ta, tb, s.m, s.n, s.k, 1.3, a.to(d), b.to(d), 0.5, c);
              be.gemm(ta, tb, s.m, s.n, s.k, 1.0, a.to(d), b.to(d), 0.0, fresh);  // beta 0 ignores C, NaN included
              return Outputs{c, fresh};
            },
            1e-5, 0.0, what, true);
      }
    }
  }
}

backend::ConvGeom conv_geom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s, int64_t sh,
                            int64_t sw, int64_t ph, int64_t pw) {
  return {n, c, h, w, k, r, s, sh, sw, ph, pw, (h + 2 * ph - r) / sh + 1, (w + 2 * pw - s) / sw + 1};
}

const backend::ConvGeom kConvs[] = {
    conv_geom(2, 3, 9, 7, 4, 3, 3, 1, 1, 1, 1),       conv_geom(3, 1, 28, 28, 20, 5, 5, 1, 1, 0, 0),
    conv_geom(2, 20, 12, 12, 50, 5, 5, 1, 1, 0, 0),   conv_geom(2, 5, 10, 11, 6, 3, 2, 2, 2, 1, 0),
    conv_geom(1, 2, 5, 5, 3, 1, 1, 2, 2, 2, 2),       conv_geom(4, 8, 15, 13, 16, 3, 3, 2, 1, 1, 2),
    conv_geom(2, 16, 8, 8, 32, 1, 1, 1, 1, 0, 0),     conv_geom(1, 3, 32, 32, 64, 7, 7, 2, 2, 3, 3),
    conv_geom(2, 4, 7, 9, 9, 3, 3, 1, 1, 2, 2),       conv_geom(2, 3, 21, 19, 10, 3, 3, 1, 1, 1, 1)};

std::string geom_name(const backend::ConvGeom& g) {
  return "conv n" + std::to_string(g.n) + " c" + std::to_string(g.c) + " " + std::to_string(g.h) + "x" +
         std::to_string(g.w) + " k" + std::to_string(g.k) + " " + std::to_string(g.r) + "x" + std::to_string(g.s) +
         " stride " + std::to_string(g.stride_h) + "," + std::to_string(g.stride_w) + " pad " +
         std::to_string(g.pad_h) + "," + std::to_string(g.pad_w);
}

// Every geometry of kConvs, with `extra` more samples (plans are kept per geometry: a new batch size
// makes the algorithm choice again).
void check_convolutions(int64_t extra) {
  for (backend::ConvGeom g : kConvs) {
    g.n += extra;
    Tensor x = rand_cpu({g.n, g.c, g.h, g.w}, 14), w = rand_cpu({g.k, g.c, g.r, g.s}, 15), b = rand_cpu({g.k}, 16);
    Tensor dy = rand_cpu({g.n, g.k, g.oh, g.ow}, 17);
    const std::string what = geom_name(g);
    for (int rep = 0; rep < 2; ++rep) {  // the second pass runs from the cached plan
      compare(
          [&](Backend& be, Device d) {
            Tensor y = Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::f32, d);
            Tensor yb = Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::f32, d);
            be.conv2d_forward(x.to(d), w.to(d), Tensor(), g, y);
            be.conv2d_forward(x.to(d), w.to(d), b.to(d), g, yb);
            Tensor yr = Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::f32, d);
            be.conv2d_forward(x.to(d), w.to(d), b.to(d), g, yr, true);
            Tensor dx = Tensor::empty(x.shape(), DType::f32, d), dw = Tensor::empty(w.shape(), DType::f32, d);
            Tensor none;
            be.conv2d_backward_data(dy.to(d), w.to(d), g, dx);
            be.conv2d_backward_weight(dy.to(d), x.to(d), g, dw, none);
            return Outputs{y, yb, yr, dx, dw};
          },
          1e-4, 0.0, what, true);
      compare(
          [&](Backend& be, Device d) {
            Tensor db = Tensor::empty({g.k}, DType::f32, d), dw = Tensor::empty(w.shape(), DType::f32, d);
            Tensor db_only = Tensor::empty({g.k}, DType::f32, d), none;
            be.conv2d_backward_weight(dy.to(d), x.to(d), g, dw, db);
            be.conv2d_backward_weight(dy.to(d), Tensor(), g, none, db_only);
            return Outputs{db, db_only};
          },
          1e-5, 1e-5 * std::sqrt(double(g.n * g.oh * g.ow)), what + " bias grad");
    }
  }
}

TEST(CudaKernels, ConvolutionForwardAndBackward) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  check_convolutions(0);
}

// The im2col + cuBLAS path, taken wherever it fits (TANDEM_CONV_GEMM=1), against the CPU; then cuDNN
// alone (=0) on the same geometries with another batch size. The direct kernels stay out of both.
TEST(CudaKernels, ConvolutionAsMatrixProductsAndCudnnAlone) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  setenv("TANDEM_CONV_DIRECT", "0", 1);
  setenv("TANDEM_CONV_GEMM", "1", 1);
  check_convolutions(1);
  setenv("TANDEM_CONV_GEMM", "0", 1);
  check_convolutions(2);
  unsetenv("TANDEM_CONV_GEMM");
  unsetenv("TANDEM_CONV_DIRECT");
}

// The direct kernels (stride 1, 3x3 and 5x5 filters: four of the geometries above, among them the
// guide's CNN's, a padding of 2 and rows whose width is no multiple of four) taken wherever they fit
// (TANDEM_CONV_DIRECT=1), against the CPU.
TEST(CudaKernels, ConvolutionDirectKernels) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  setenv("TANDEM_CONV_DIRECT", "1", 1);
  check_convolutions(3);
  check_convolutions(61);  // batch 64 for the CNN's geometries: the weight gradient splits the batch
  unsetenv("TANDEM_CONV_DIRECT");
}

backend::PoolGeom pool_geom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                            int64_t ph, int64_t pw) {
  return {n, c, h, w, kh, kw, sh, sw, ph, pw, (h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1};
}

// ONNX's geometry: padding after the input of its own (bottom, right), ceil mode (the op layer's output size:
// a last window that starts inside the input or its leading padding) and the average's divisor.
backend::PoolGeom onnx_pool_geom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t s, int64_t pb,
                                 int64_t pe, bool ceil, bool count_pad) {
  auto out = [&](int64_t in) {
    int64_t o = (ceil ? (in + pb + pe - k + s - 1) / s : (in + pb + pe - k) / s) + 1;
    if (ceil && (o - 1) * s >= in + pb) --o;
    return o;
  };
  backend::PoolGeom g{n, c, h, w, k, k, s, s, pb, pb, out(h), out(w)};
  g.pad_bottom = g.pad_right = pe;
  g.count_pad = count_pad;
  return g;
}

const backend::PoolGeom kPools[] = {
    pool_geom(2, 3, 8, 8, 2, 2, 2, 2, 0, 0),  pool_geom(2, 3, 7, 9, 3, 3, 2, 2, 1, 1),
    pool_geom(1, 2, 10, 7, 3, 2, 1, 1, 1, 1), pool_geom(3, 4, 5, 5, 3, 3, 1, 1, 0, 0),
    pool_geom(2, 1, 9, 11, 4, 3, 3, 2, 2, 1), pool_geom(64, 20, 24, 24, 2, 2, 2, 2, 0, 0),
    onnx_pool_geom(2, 3, 5, 5, 2, 2, 1, 1, true, true),   onnx_pool_geom(2, 3, 5, 7, 3, 2, 1, 0, true, true),
    onnx_pool_geom(2, 3, 5, 7, 3, 2, 1, 0, true, false),  onnx_pool_geom(1, 2, 9, 6, 4, 3, 2, 1, false, false),
    onnx_pool_geom(2, 2, 7, 9, 2, 2, 0, 0, true, true)};

void compare_pools(const backend::PoolGeom& g, const Tensor& x, const std::string& what) {
  Tensor dy = rand_cpu({g.n, g.c, g.oh, g.ow}, 19);
  compare_exact(
      [&](Backend& be, Device d) {
        Tensor y = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::f32, d);
        Tensor idx = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::i32, d);
        be.max_pool2d_forward(x.to(d), g, y, idx);
        return Outputs{y, idx};
      },
      what + " max forward");
  compare(
      [&](Backend& be, Device d) {
        Tensor xd = x.to(d);
        Tensor y = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::f32, d);
        Tensor idx = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::i32, d);
        be.max_pool2d_forward(xd, g, y, idx);
        Tensor dx = Tensor::empty(x.shape(), DType::f32, d);
        be.max_pool2d_backward(dy.to(d), xd, y, idx, g, dx);
        Tensor ya = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::f32, d), dxa = Tensor::empty(x.shape(), DType::f32, d);
        be.avg_pool2d_forward(xd, g, ya);
        be.avg_pool2d_backward(dy.to(d), g, dxa);
        return Outputs{dx, ya, dxa};
      },
      1e-6, 1e-7, what + " max backward / avg");
}

TEST(CudaKernels, Pooling) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const backend::PoolGeom& g : kPools) {
    const std::string what = "pool " + std::to_string(g.h) + "x" + std::to_string(g.w) + " k" + std::to_string(g.kh) +
                             "x" + std::to_string(g.kw) + " s" + std::to_string(g.stride_h) + " p" +
                             std::to_string(g.pad_h) + "," + std::to_string(g.pad_w) + " end " +
                             std::to_string(g.pad_h_end()) + "," + std::to_string(g.pad_w_end()) + " out " +
                             std::to_string(g.oh) + "x" + std::to_string(g.ow) +
                             (g.count_pad ? "" : " pads not counted");
    compare_pools(g, rand_cpu({g.n, g.c, g.h, g.w}, 18), what);
    // Few distinct values: ties everywhere, the first maximum must win on both devices.
    Tensor ties = rand_cpu({g.n, g.c, g.h, g.w}, 20, 0.0, 3.0);
    {
      std::vector<float> v = ties.to_vector<float>();
      for (float& e : v) e = std::floor(e);
      ties = Tensor::from_vector(v, ties.shape());
    }
    compare_pools(g, ties, what + " ties");
    // All inputs negative: a padded position (zero) must never win.
    Tensor neg = rand_cpu({g.n, g.c, g.h, g.w}, 21, -3.0, -1.0);
    compare_pools(g, neg, what + " negative");
    Tensor y = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::f32, gpu());
    Tensor idx = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::i32, gpu());
    gpu_be().max_pool2d_forward(neg.to(gpu()), g, y, idx);
    for (float e : y.to_vector<float>()) ASSERT_LT(e, -0.5f) << what << ": padding won a max";
  }
}

struct BnShape {
  int64_t n, c, h, w;
};

TEST(CudaKernels, BatchNorm) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (BnShape s : {BnShape{4, 3, 5, 5}, BnShape{2, 16, 7, 9}, BnShape{64, 8, 1, 1}, BnShape{3, 1, 33, 31}}) {
    Tensor x = rand_cpu({s.n, s.c, s.h, s.w}, 22, -2.0, 3.0), gamma = rand_cpu({s.c}, 23, 0.5, 1.5),
           beta = rand_cpu({s.c}, 24), rm0 = rand_cpu({s.c}, 25), rv0 = rand_cpu({s.c}, 26, 0.5, 2.0),
           dy = rand_cpu(x.shape(), 27);
    const double m = double(s.n * s.h * s.w);
    const std::string what = "batch norm " + std::to_string(s.n) + "x" + std::to_string(s.c) + "x" +
                             std::to_string(s.h) + "x" + std::to_string(s.w);
    compare(
        [&](Backend& be, Device d) {
          Tensor rm = rm0.to(d).clone(), rv = rv0.to(d).clone(), y = Tensor::empty(x.shape(), DType::f32, d);
          Tensor sm = Tensor::empty({s.c}, DType::f32, d), si = Tensor::empty({s.c}, DType::f32, d);
          be.batch_norm_forward_train(x.to(d), Tensor(), gamma.to(d), beta.to(d), rm, rv, BnArgs{}, y, sm, si);
          Tensor ye = Tensor::empty(x.shape(), DType::f32, d);
          be.batch_norm_forward_eval(x.to(d), Tensor(), gamma.to(d), beta.to(d), rm, rv, BnArgs{}, ye);
          return Outputs{y, sm, si, rm, rv, ye};
        },
        1e-5, 1e-5, what + " forward");
    compare(
        [&](Backend& be, Device d) {
          Tensor rm = rm0.to(d).clone(), rv = rv0.to(d).clone(), y = Tensor::empty(x.shape(), DType::f32, d);
          Tensor sm = Tensor::empty({s.c}, DType::f32, d), si = Tensor::empty({s.c}, DType::f32, d);
          be.batch_norm_forward_train(x.to(d), Tensor(), gamma.to(d), beta.to(d), rm, rv, BnArgs{}, y, sm, si);
          Tensor dx = Tensor::empty(x.shape(), DType::f32, d), dg = Tensor::empty({s.c}, DType::f32, d),
                 db = Tensor::empty({s.c}, DType::f32, d);
          Tensor no_dz;
          be.batch_norm_backward(dy.to(d), x.to(d), y, gamma.to(d), sm, si, BnArgs{}, dx, no_dz, dg, db);
          return Outputs{dg, db};
        },
        1e-5, 1e-5 * std::sqrt(m), what + " dgamma/dbeta");
    compare(
        [&](Backend& be, Device d) {
          Tensor rm = rm0.to(d).clone(), rv = rv0.to(d).clone(), y = Tensor::empty(x.shape(), DType::f32, d);
          Tensor sm = Tensor::empty({s.c}, DType::f32, d), si = Tensor::empty({s.c}, DType::f32, d);
          be.batch_norm_forward_train(x.to(d), Tensor(), gamma.to(d), beta.to(d), rm, rv, BnArgs{}, y, sm, si);
          Tensor dx = Tensor::empty(x.shape(), DType::f32, d), dg = Tensor::empty({s.c}, DType::f32, d),
                 db = Tensor::empty({s.c}, DType::f32, d);
          Tensor no_dz;
          be.batch_norm_backward(dy.to(d), x.to(d), y, gamma.to(d), sm, si, BnArgs{}, dx, no_dz, dg, db);
          return Outputs{dx};
        },
        1e-4, 2e-5, what + " dx");
  }
}

struct NC {
  int64_t n, c;
};

TEST(CudaKernels, SoftmaxCrossEntropy) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (NC s : {NC{64, 10}, NC{1, 3}, NC{300, 1000}, NC{5, 70000}, NC{4000, 2}}) {
    Tensor logits = rand_cpu({s.n, s.c}, 28, -5.0, 5.0);
    std::vector<int64_t> lv;
    for (int64_t i = 0; i < s.n; ++i) lv.push_back((i * 7 + 3) % s.c);
    Tensor dloss = Tensor::full({}, 0.7);
    for (DType lt : {DType::i32, DType::i64}) {
      Tensor labels = Tensor::from_vector(lv, {s.n}).to(lt);
      compare(
          [&](Backend& be, Device d) {
            Tensor loss = Tensor::empty({}, DType::f32, d), probs = Tensor::empty({s.n, s.c}, DType::f32, d);
            be.softmax_xent_forward(logits.to(d), labels.to(d), loss, probs);
            Tensor dl = Tensor::empty({s.n, s.c}, DType::f32, d);
            be.softmax_xent_backward(probs, labels.to(d), dloss.to(d), dl);
            return Outputs{loss, probs, dl};
          },
          1e-5, 1e-8, "softmax xent n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) + " " + dtype_name(lt));
    }
  }
}

// Targets [n, c] (one-hot rows, distributions, other weights), in the one-block and the per-row
// launches, as the CPU computes them.
TEST(CudaKernels, SoftmaxCrossEntropyWithTargets) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (NC s : {NC{64, 10}, NC{1, 3}, NC{300, 1000}, NC{5, 70000}, NC{4000, 2}}) {
    Tensor logits = rand_cpu({s.n, s.c}, 31, -5.0, 5.0);
    std::vector<float> tv = rand_cpu({s.n, s.c}, 32, 0.0, 1.0).to_vector<float>();
    for (int64_t i = 0; i < s.n; i += 2)  // every other row one-hot
      for (int64_t j = 0; j < s.c; ++j) tv[static_cast<size_t>(i * s.c + j)] = j == (i * 7 + 3) % s.c ? 1.0f : 0.0f;
    Tensor targets = Tensor::from_vector(tv, {s.n, s.c});
    Tensor dloss = Tensor::full({}, 0.7);
    compare(
        [&](Backend& be, Device d) {
          Tensor loss = Tensor::empty({}, DType::f32, d), probs = Tensor::empty({s.n, s.c}, DType::f32, d);
          be.softmax_xent_targets_forward(logits.to(d), targets.to(d), loss, probs);
          Tensor dl = Tensor::empty({s.n, s.c}, DType::f32, d);
          be.softmax_xent_targets_backward(probs, targets.to(d), dloss.to(d), dl);
          return Outputs{loss, probs, dl};
        },
        // The gradient (p * sum(t) - t) / n cancels where p * sum(t) is near t: the rounding of the row
        // sum (70,000 terms, summed in another order by each device) shows there on the scale of t / n,
        // not of the result: an absolute bound of 1e-7 is 5e-7 of the largest t / n.
        1e-5, 1e-7, "softmax xent targets n=" + std::to_string(s.n) + " c=" + std::to_string(s.c));
  }
}

TEST(CudaKernels, ArgmaxAndCountCorrect) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (NC s : {NC{64, 10}, NC{1, 1}, NC{1000, 37}, NC{3, 5000}, NC{70000, 3}}) {
    Tensor rnd = rand_cpu({s.n, s.c}, 29);
    std::vector<float> tv = rand_cpu({s.n, s.c}, 30, 0.0, 2.0).to_vector<float>();
    for (float& e : tv) e = std::floor(e);  // ties: the first maximum must win
    Tensor ties = Tensor::from_vector(tv, {s.n, s.c});
    std::vector<int32_t> lv;
    for (int64_t i = 0; i < s.n; ++i) lv.push_back(static_cast<int32_t>((i * 5) % s.c));
    Tensor labels = Tensor::from_vector(lv, {s.n});
    for (const Tensor& x : {rnd, ties}) {
      compare_exact(
          [&](Backend& be, Device d) {
            Tensor am = Tensor::empty({s.n}, DType::i64, d), cc = Tensor::empty({}, DType::i64, d),
                   cc64 = Tensor::empty({}, DType::i64, d);
            be.argmax_rows(x.to(d), am);
            be.count_correct(x.to(d), labels.to(d), cc);
            be.count_correct(x.to(d), labels.to(DType::i64).to(d), cc64);
            return Outputs{am, cc, cc64};
          },
          "argmax/count n=" + std::to_string(s.n) + " c=" + std::to_string(s.c));
    }
  }
}

}  // namespace
}  // namespace tandem
