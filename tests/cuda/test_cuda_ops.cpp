// The op layer on the GPU against the CPU: forward values and the gradients autograd computes.
#include "cuda/cuda_test_util.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

using namespace cudatest;

// Leaves on one device, copied from CPU originals, with gradients requested.
std::vector<Tensor> leaves_on(const std::vector<Tensor>& originals, Device d) {
  std::vector<Tensor> out;
  for (const Tensor& t : originals) {
    Tensor l = t.to(d).clone();
    l.requires_grad_();
    out.push_back(l);
  }
  return out;
}

using Graph = std::function<Tensor(const std::vector<Tensor>&)>;

// Builds the graph on both devices, reduces its output against fixed random weights (so every
// gradient element matters), runs backward, and compares the outputs and every leaf's gradient.
void compare_graph(const std::vector<Tensor>& inputs, const Graph& f, double rtol, double atol, const std::string& what,
                   bool by_norm = false) {
  std::vector<Tensor> lc = leaves_on(inputs, Device::cpu()), lg = leaves_on(inputs, gpu());
  Tensor yc = f(lc), yg = f(lg);
  ASSERT_EQ(yc.shape(), yg.shape()) << what;
  Tensor weights = rand_cpu(yc.shape(), 4242);
  Tensor lossc = sum(mul(yc, weights)), lossg = sum(mul(yg, weights.to(gpu())));
  backward(lossc);
  backward(lossg);
  auto check = [&](const Tensor& e, const Tensor& a, const std::string& name) {
    if (by_norm)
      expect_norm_close(e, a, rtol, name);
    else
      expect_close(e, a, rtol, atol, name);
  };
  check(yc.detach(), yg.detach(), what + " forward");
  ASSERT_TRUE(lc[0].grad().defined()) << what;
  for (size_t i = 0; i < lc.size(); ++i) {
    // Some ops differentiate only some inputs (batch norm in evaluation: only x).
    ASSERT_EQ(lc[i].grad().defined(), lg[i].grad().defined()) << what << " input " << i;
    if (!lc[i].grad().defined()) continue;
    EXPECT_EQ(lg[i].grad().device(), gpu());
    check(lc[i].grad(), lg[i].grad(), what + " gradient of input " + std::to_string(i));
  }
}

TEST(CudaOps, Conv2d) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    Shape x, w;
    Conv2dOptions opt;
    bool bias;
  };
  for (const Case& c : {Case{{2, 3, 9, 8}, {4, 3, 3, 3}, {{1, 1}, {1, 1}}, true},
                        Case{{3, 1, 28, 28}, {20, 1, 5, 5}, {{1, 1}, {0, 0}}, true},
                        Case{{2, 4, 11, 10}, {5, 4, 3, 2}, {{2, 1}, {1, 0}}, false},
                        Case{{1, 2, 7, 7}, {3, 2, 1, 1}, {{2, 2}, {0, 0}}, true}}) {
    std::vector<Tensor> in;
    in.reserve(3);
    in.push_back(rand_cpu(c.x, 1));
    in.push_back(rand_cpu(c.w, 2));
    if (c.bias) in.push_back(rand_cpu({c.w[0]}, 3));
    compare_graph(
        in,
        [&](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), c.opt); },
        1e-4, 0.0, "conv2d " + shape_str(c.x) + " * " + shape_str(c.w), true);
  }
}

// Grouped and depthwise convolutions (cuDNN's group count) against the CPU's per-group im2col. The
// matrix-product and direct paths, forced on wherever they fit, must pass such convolutions over: they
// know one group only.
TEST(CudaOps, GroupedConv2d) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    Shape x, w;
    Conv2dOptions opt;
    bool bias;
  };
  const Case cases[] = {Case{{2, 4, 9, 8}, {6, 2, 3, 3}, {{1, 1}, {1, 1}, false, 2}, true},
                        Case{{3, 8, 12, 12}, {8, 1, 3, 3}, {{1, 1}, {1, 1}, false, 8}, false},  // depthwise
                        Case{{2, 6, 11, 10}, {12, 1, 5, 5}, {{2, 2}, {2, 2}, true, 6}, true},  // two per channel
                        Case{{2, 8, 7, 7}, {4, 4, 1, 1}, {{1, 1}, {0, 0}, false, 2}, true}};   // grouped pointwise
  for (const char* forced : {"", "1"}) {
    if (*forced) {
      setenv("TANDEM_CONV_GEMM", forced, 1);
      setenv("TANDEM_CONV_DIRECT", forced, 1);
    }
    for (const Case& c : cases) {
      std::vector<Tensor> in;
      in.push_back(rand_cpu(c.x, 21));
      in.push_back(rand_cpu(c.w, 22));
      if (c.bias) in.push_back(rand_cpu({c.w[0]}, 23));
      // Another batch size on the second pass: a new plan, chosen with the fast paths forced on.
      if (*forced) in[0] = rand_cpu({c.x[0] + 1, c.x[1], c.x[2], c.x[3]}, 24);
      compare_graph(
          in,
          [&](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), c.opt); },
          1e-4, 0.0,
          "conv2d " + shape_str(in[0].shape()) + " * " + shape_str(c.w) + " in " + std::to_string(c.opt.groups) +
              " groups" + (*forced ? " (fast paths forced)" : ""),
          true);
    }
  }
  unsetenv("TANDEM_CONV_GEMM");
  unsetenv("TANDEM_CONV_DIRECT");
}

TEST(CudaOps, Cat) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::vector<Tensor> in = {rand_cpu({2, 3, 4, 5}, 41), rand_cpu({2, 1, 4, 5}, 42), rand_cpu({2, 2, 4, 5}, 43)};
  for (int64_t dim : {1, -1}) {
    std::vector<Tensor> parts = in;
    if (dim == -1) parts = {in[0], rand_cpu({2, 3, 4, 2}, 44), rand_cpu({2, 3, 4, 1}, 45)};
    compare_graph(parts, [&](const std::vector<Tensor>& t) { return tanh(cat(t, dim)); }, 1e-6, 1e-7,
                  "cat along " + std::to_string(dim));
  }
}

TEST(CudaOps, Pools) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // The last four: ONNX's geometry (asymmetric pads, ceil mode with windows past the padded input, the mean
  // over the input elements only).
  for (const Pool2dOptions& opt : {Pool2dOptions{{2, 2}, {2, 2}, {0, 0}}, Pool2dOptions{{3, 3}, {2, 2}, {1, 1}},
                                   Pool2dOptions{{3, 2}, {1, 1}, {1, 1}},
                                   Pool2dOptions{{2, 2}, {2, 2}, {1, 1}, {-1, -1}, true, true},
                                   Pool2dOptions{{3, 3}, {2, 2}, {1, 1}, {0, 0}, true, true},
                                   Pool2dOptions{{3, 3}, {2, 2}, {1, 1}, {0, 0}, true, false},
                                   Pool2dOptions{{3, 2}, {2, 3}, {0, 1}, {1, 0}, false, false}}) {
    std::vector<Tensor> in = {rand_cpu({2, 3, 9, 7}, 4)};
    const std::string what = "pool k" + std::to_string(opt.kernel[0]) + "x" + std::to_string(opt.kernel[1]) +
                             " p" + std::to_string(opt.padding[0]) + "," + std::to_string(opt.padding[1]) +
                             " end " + std::to_string(opt.padding_end[0]) + "," + std::to_string(opt.padding_end[1]) +
                             (opt.ceil_mode ? " ceil" : "") + (opt.count_include_pad ? "" : " pads not counted");
    compare_graph(in, [&](const std::vector<Tensor>& t) { return max_pool2d(t[0], opt); }, 1e-6, 1e-7,
                  "max_" + what);
    compare_graph(in, [&](const std::vector<Tensor>& t) { return avg_pool2d(t[0], opt); }, 1e-6, 1e-7,
                  "avg_" + what);
  }
}

TEST(CudaOps, BatchNorm2d) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::vector<Tensor> in = {rand_cpu({4, 5, 6, 7}, 5, -1.0, 2.0), rand_cpu({5}, 6, 0.5, 1.5), rand_cpu({5}, 7)};
  Tensor rm0 = rand_cpu({5}, 8), rv0 = rand_cpu({5}, 9, 0.5, 1.5);
  for (bool training : {true, false}) {
    Tensor rmc = rm0.clone(), rvc = rv0.clone(), rmg = rm0.to(gpu()).clone(), rvg = rv0.to(gpu()).clone();
    compare_graph(
        in,
        [&](const std::vector<Tensor>& t) {
          const bool on_gpu = t[0].device().is_cuda();
          return batch_norm2d(t[0], t[1], t[2], on_gpu ? rmg : rmc, on_gpu ? rvg : rvc, training, 0.1, 1e-5);
        },
        1e-4, 1e-5, training ? "batch_norm2d training" : "batch_norm2d eval");
    expect_close(rmc, rmg, 1e-5, 1e-6, "running mean");
    expect_close(rvc, rvg, 1e-5, 1e-6, "running var");
  }
}

TEST(CudaOps, LinearWithAndWithoutBias) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::vector<Tensor> in = {rand_cpu({64, 800}, 10), rand_cpu({500, 800}, 11), rand_cpu({500}, 12)};
  compare_graph(in, [](const std::vector<Tensor>& t) { return relu(linear(t[0], t[1], t[2])); }, 1e-4, 0.0,
                "linear+relu", true);
  std::vector<Tensor> nb = {rand_cpu({7, 3}, 13), rand_cpu({5, 3}, 14)};
  compare_graph(nb, [](const std::vector<Tensor>& t) { return linear(t[0], t[1], Tensor()); }, 1e-4, 0.0,
                "linear without bias", true);
}

TEST(CudaOps, BroadcastingJoiningSlicingAndSoftmax) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  using Ts = std::vector<Tensor>;
  Ts in = {rand_cpu({4, 3, 5}, 20), rand_cpu({3, 1}, 21, 0.5, 2.0), rand_cpu({5}, 22)};
  compare_graph(in, [](const Ts& t) { return div(add(t[0], t[2]), t[1]); }, 1e-6, 1e-6, "broadcast add, div");
  compare_graph(in, [](const Ts& t) { return mul(sub(t[2], t[0]), exp(t[1])); }, 1e-6, 1e-6, "broadcast sub, mul");
  compare_graph({in[1]}, [](const Ts& t) { return log(t[0]); }, 1e-6, 1e-6, "log");
  Ts parts = {rand_cpu({2, 3, 4}, 23), rand_cpu({2, 1, 4}, 24)};
  compare_graph(parts, [](const Ts& t) { return concat({t[0], t[1], t[0]}, 1); }, 0.0, 0.0, "concat");
  compare_graph(parts, [](const Ts& t) { return slice(permute(t[0], {2, 0, 1}), 0, 1, 2); }, 0.0, 0.0,
                "permute, slice");
  compare_graph(parts, [](const Ts& t) { return softmax(t[0], 1); }, 1e-5, 1e-7, "softmax");
  Tensor m = compare(in[0].to(gpu()), in[2].to(gpu()), Comparison::Greater);
  expect_close(compare(in[0], in[2], Comparison::Greater), m, 0.0, 0.0, "greater");
}

TEST(CudaOps, SoftmaxCrossEntropy) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::vector<int64_t> lv;
  for (int64_t i = 0; i < 64; ++i) lv.push_back((i * 3) % 10);
  Tensor labels = Tensor::from_vector(lv, {64});
  std::vector<Tensor> in = {rand_cpu({64, 10}, 15, -3.0, 3.0)};
  compare_graph(
      in,
      [&](const std::vector<Tensor>& t) {
        return softmax_cross_entropy(t[0], labels.to(t[0].device()));
      },
      1e-5, 1e-7, "softmax_cross_entropy");
}

// Targets [N, C] as on the CPU: rows of weights, and integer one-hot rows (converted on the device).
TEST(CudaOps, SoftmaxCrossEntropyWithTargets) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::vector<int32_t> hot(640, 0);
  for (size_t i = 0; i < 64; ++i) hot[i * 10 + (i * 3) % 10] = 1;
  std::vector<Tensor> in = {rand_cpu({64, 10}, 23, -3.0, 3.0)};
  for (const Tensor& targets : {rand_cpu({64, 10}, 24, 0.0, 1.0), Tensor::from_vector(hot, {64, 10})})
    compare_graph(
        in,
        [&](const std::vector<Tensor>& t) { return softmax_cross_entropy(t[0], targets.to(t[0].device())); },
        1e-5, 1e-7, std::string("softmax_cross_entropy, targets ") + dtype_name(targets.dtype()));
}

TEST(CudaOps, SmallCnnTrainingStep) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // The guide's CNN in miniature: conv, relu, pool, conv, relu, pool, flatten, linear, loss.
  std::vector<Tensor> in = {rand_cpu({8, 1, 28, 28}, 16, 0.0, 1.0), rand_cpu({6, 1, 5, 5}, 17, -0.2, 0.2),
                            rand_cpu({6}, 18, -0.1, 0.1),           rand_cpu({10, 6, 5, 5}, 19, -0.1, 0.1),
                            rand_cpu({10}, 20, -0.1, 0.1),          rand_cpu({10, 160}, 21, -0.1, 0.1),
                            rand_cpu({10}, 22, -0.1, 0.1)};
  std::vector<int32_t> lv = {0, 1, 2, 3, 4, 5, 6, 7};
  Tensor labels = Tensor::from_vector(lv, {8});
  std::vector<Tensor> lc = leaves_on(in, Device::cpu()), lg = leaves_on(in, gpu());
  auto logits_of = [](const std::vector<Tensor>& t) {
    Tensor h = max_pool2d(relu(conv2d(t[0], t[1], t[2])));
    h = max_pool2d(relu(conv2d(h, t[3], t[4])));
    return linear(flatten(h), t[5], t[6]);
  };
  Tensor logits_c = logits_of(lc), logits_g = logits_of(lg);
  Tensor loss_c = softmax_cross_entropy(logits_c, labels), loss_g = softmax_cross_entropy(logits_g, labels.to(gpu()));
  EXPECT_NEAR(loss_c.item<float>(), loss_g.item<float>(), 1e-5 * std::fabs(loss_c.item<float>()));
  EXPECT_EQ(count_correct(logits_c, labels).item<int64_t>(), count_correct(logits_g, labels.to(gpu())).item<int64_t>());
  expect_close(argmax(logits_c.detach()), argmax(logits_g.detach()), 0.0, 0.0, "cnn argmax");
  backward(loss_c);
  backward(loss_g);
  for (size_t i = 0; i < lc.size(); ++i)
    expect_norm_close(lc[i].grad(), lg[i].grad(), 1e-4, "cnn gradient " + std::to_string(i));
}

// A batch's running sums in one launch: the loss added as add_into adds it, the correct rows counted
// as count_correct counts them, batch after batch, on both devices, with i32 and i64 labels.
TEST(CudaOps, LossAndCorrectSumsMatchTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (DType lt : {DType::i32, DType::i64}) {
    Tensor sum_c = Tensor::zeros({1}), sum_g = Tensor::zeros({1}, DType::f32, gpu());
    Tensor cnt_c = Tensor::zeros({1}, DType::i64), cnt_g = Tensor::zeros({1}, DType::i64, gpu());
    Tensor want_sum = Tensor::zeros({1}), want_cnt = Tensor::zeros({1}, DType::i64);
    for (int64_t n : {1, 64, 300}) {
      Tensor logits = rand_cpu({n, 10}, 40 + static_cast<uint64_t>(n), -1.0, 1.0);
      std::vector<int32_t> lv(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) lv[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % 10);
      Tensor labels = Tensor::from_vector(lv, {n}).to(lt);
      Tensor loss = softmax_cross_entropy(logits, labels).detach();
      add_into(want_sum, loss.view({1}));
      add_correct(logits, labels, want_cnt);
      add_loss_and_correct(loss, logits, labels, sum_c, cnt_c);
      add_loss_and_correct(loss.to(gpu()), logits.to(gpu()), labels.to(gpu()), sum_g, cnt_g);
    }
    EXPECT_EQ(sum_c.to_vector<float>(), want_sum.to_vector<float>());
    EXPECT_EQ(sum_g.to_vector<float>(), want_sum.to_vector<float>());
    EXPECT_EQ(cnt_c.to_vector<int64_t>(), want_cnt.to_vector<int64_t>());
    EXPECT_EQ(cnt_g.to_vector<int64_t>(), want_cnt.to_vector<int64_t>());
    EXPECT_GT(want_cnt.to_vector<int64_t>()[0], 0);
  }
}

}  // namespace
}  // namespace tandem
