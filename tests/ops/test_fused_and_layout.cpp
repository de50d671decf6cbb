// Fused ops (convolution and linear with ReLU, batch norm with a residual and ReLU) by finite
// differences and against their unfused compositions, and the channels-last storage helpers.
#include "core/tensor_impl.h"
#include "gradcheck.h"
#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;

TEST(GradCheck, ConvolutionWithFusedRelu) {
  Generator gen(71);
  Tensor x = leaf({2, 3, 6, 5}, gen), w = leaf({4, 3, 3, 3}, gen), b = leaf({4}, gen);
  Conv2dOptions opt{{1, 1}, {1, 1}, true};
  EXPECT_TRUE(gradcheck([&](const Ts& t) { return conv2d(t[0], t[1], t[2], opt); }, {x, w, b}));
  EXPECT_TRUE(gradcheck([&](const Ts& t) { return conv2d(t[0], t[1], Tensor(), opt); }, {x, w}));
  // The fused ReLU equals ReLU after the convolution, forward and backward.
  Conv2dOptions plain{{1, 1}, {1, 1}, false};
  Tensor fused = conv2d(x, w, b, opt), ref = relu(conv2d(x, w, b, plain));
  EXPECT_EQ(fused.to_vector<double>(), ref.to_vector<double>());
}

TEST(GradCheck, LinearWithFusedRelu) {
  Generator gen(72);
  Tensor x = leaf({5, 6}, gen), w = leaf({4, 6}, gen), b = leaf({4}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear(t[0], t[1], t[2], true); }, {x, w, b}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear(t[0], t[1], Tensor(), true); }, {x, w}));
  EXPECT_EQ(linear(x, w, b, true).to_vector<double>(), relu(linear(x, w, b)).to_vector<double>());
}

TEST(GradCheck, BatchNormWithResidualAndRelu) {
  Generator gen(73);
  for (bool training : {true, false})
    for (bool relu_on : {true, false}) {
      Tensor x = leaf({3, 4, 3, 2}, gen, -1.0, 2.0), z = leaf({3, 4, 3, 2}, gen);
      Tensor gamma = leaf({4}, gen, 0.5, 1.5), beta = leaf({4}, gen);
      Tensor rm = Tensor::uniform({4}, -0.5, 0.5, gen, DType::f64), rv = Tensor::uniform({4}, 0.5, 1.5, gen, DType::f64);
      auto f = [&](const Ts& t) {
        Tensor m = rm.clone(), v = rv.clone();  // every evaluation starts from the same running statistics
        return batch_norm2d_act(t[0], t[1], t[2], t[3], m, v, training, relu_on);
      };
      if (relu_on) {
        // Keep the output away from the kink: check at inputs where bn(x) + z is clearly nonzero.
        Tensor m = rm.clone(), v = rv.clone();
        NoGradGuard no_grad;
        Tensor pre = batch_norm2d_act(x, z, gamma, beta, m, v, training, false);
        std::vector<double> zv = z.to_vector<double>(), pv = pre.to_vector<double>();
        for (size_t i = 0; i < zv.size(); ++i)
          if (std::fabs(pv[i]) < 0.05) zv[i] += pv[i] < 0 ? -0.1 : 0.1;
        z = Tensor::from_vector(zv, z.shape());
        z.requires_grad_();
      }
      EXPECT_TRUE(gradcheck(f, {x, z, gamma, beta}, {1e-6, 1e-5, 1e-7}))
          << (training ? "training" : "evaluation") << (relu_on ? " with relu" : "");
      // Equal to the composition it replaces.
      Tensor m1 = rm.clone(), v1 = rv.clone(), m2 = rm.clone(), v2 = rv.clone();
      Tensor fused = batch_norm2d_act(x, z, gamma, beta, m1, v1, training, relu_on);
      Tensor sum = add(batch_norm2d(x, gamma, beta, m2, v2, training), z);
      Tensor ref = relu_on ? relu(sum) : sum;
      const std::vector<double> a = fused.to_vector<double>(), r = ref.to_vector<double>();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], r[i], 1e-12);
      EXPECT_EQ(m1.to_vector<double>(), m2.to_vector<double>());
    }
}

TEST(Layout, ChannelsLastRoundTripKeepsValues) {
  Generator gen(74);
  Tensor x = Tensor::uniform({2, 3, 4, 5}, -1, 1, gen);
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_FALSE(ops::is_channels_last(x));
  Tensor cl = ops::to_dense(x, DType::f32, true);
  EXPECT_TRUE(ops::strictly_channels_last(cl));
  EXPECT_EQ(cl.shape(), x.shape());
  EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));
  // Element [n, c, h, w] sits at n*60 + h*15 + w*3 + c in storage.
  const float* p = cl.data<float>();
  const std::vector<float> xv = x.to_vector<float>();
  EXPECT_EQ(p[1 * 60 + 2 * 15 + 3 * 3 + 1], xv[((1 * 3 + 1) * 4 + 2) * 5 + 3]);
  EXPECT_EQ(cl.to_vector<float>(), xv);  // reading back follows the logical shape
  EXPECT_EQ(ops::to_dense(cl, DType::f32, false).to_vector<float>(), xv);
  EXPECT_TRUE(ops::to_dense(cl, DType::f32, true).is_same(cl));  // already so: no copy
  // Converting type and order in one pass.
  Tensor cl64 = ops::to_dense(x, DType::f64, true);
  EXPECT_EQ(cl64.dtype(), DType::f64);
  EXPECT_TRUE(ops::is_channels_last(cl64));
  const std::vector<double> back = cl64.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(back[i], static_cast<double>(xv[i]));
  // One channel or 1x1 planes: both orders coincide.
  EXPECT_TRUE(ops::is_channels_last(Tensor::empty({2, 1, 3, 3})));
  EXPECT_TRUE(ops::is_channels_last(Tensor::empty({2, 7, 1, 1})));
  EXPECT_FALSE(ops::strictly_channels_last(Tensor::empty({2, 7, 1, 1})));
}

TEST(Layout, ElementwiseOpsKeepTheStorageOrder) {
  Generator gen(75);
  Tensor a = Tensor::uniform({2, 3, 2, 4}, -1, 1, gen), b = Tensor::uniform({2, 3, 2, 4}, -1, 1, gen);
  Tensor acl = ops::to_dense(a, DType::f32, true), bcl = ops::to_dense(b, DType::f32, true);
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  for (const auto& [x, y] : {std::pair{acl, bcl}, std::pair{acl, b}, std::pair{a, bcl}}) {
    Tensor s = ops::binary_raw(backend::Binary::Add, x, y);
    EXPECT_TRUE(ops::strictly_channels_last(s));
    const std::vector<float> sv = s.to_vector<float>();
    for (size_t i = 0; i < sv.size(); ++i) EXPECT_EQ(sv[i], av[i] + bv[i]);
  }
  Tensor r = ops::unary_raw(backend::Unary::Relu, acl);
  EXPECT_TRUE(ops::strictly_channels_last(r));
  const std::vector<float> rv = r.to_vector<float>();
  for (size_t i = 0; i < rv.size(); ++i) EXPECT_EQ(rv[i], std::max(av[i], 0.0f));
  // Autograd sums and reshapes see the logical order.
  Tensor flat = reshape(acl, {2, 24});
  EXPECT_EQ(flat.to_vector<float>(), av);
}

}  // namespace
}  // namespace tandem::testing
