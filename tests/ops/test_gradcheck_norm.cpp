// Finite-difference gradient checks (f64, CPU) of the softmax, normalisation, loss and attention ops:
// every axis kind (first, middle, last), non-contiguous inputs, size-1 axes, each reduction, ignored
// targets, causal and non-causal attention with queries and keys of different lengths, and dropout.
#include <cmath>

#include "ops/gradcheck.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

Tensor labels(const std::vector<int64_t>& v, const Shape& shape) { return Tensor::from_vector(v, shape); }

TEST(GradcheckNorm, SoftmaxAndLogSoftmaxAlongEveryAxis) {
  Generator gen(1);
  Tensor x = leaf({3, 4, 5}, gen, -2.0, 2.0);
  for (int64_t dim : {0, 1, 2, -1}) {
    EXPECT_TRUE(gradcheck1([dim](const Tensor& t) { return softmax(t, dim); }, x)) << "softmax dim " << dim;
    EXPECT_TRUE(gradcheck1([dim](const Tensor& t) { return log_softmax(t, dim); }, x)) << "log_softmax dim " << dim;
  }
  // After a recorded transpose (non-contiguous views are the fixtures' job: a view is not recorded), and an
  // axis of extent 1.
  Tensor y = leaf({4, 3}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return log_softmax(permute(t, {1, 0}), 1); }, y));
  Tensor z = leaf({2, 1, 3}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return softmax(t, 1); }, z));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return log_softmax(t, 1); }, z));
}

TEST(GradcheckNorm, LayerNormWithAndWithoutParameters) {
  Generator gen(2);
  Tensor x = leaf({3, 2, 5}, gen, -2.0, 2.0), w = leaf({5}, gen, 0.5, 1.5), b = leaf({5}, gen);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& t) { return layer_norm(t[0], {5}, t[1], t[2], 1e-5); },
                        {x, w, b}));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return layer_norm(t, {5}); }, x));
  // Two normalised dimensions, weight only.
  Tensor w2 = leaf({2, 5}, gen, 0.5, 1.5);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& t) { return layer_norm(t[0], {2, 5}, t[1], Tensor(), 1e-3); },
                        {x, w2}));
  // A normalised row of one element: the output is the bias, and x gets no gradient through it.
  Tensor x1 = leaf({4, 1}, gen), b1 = leaf({1}, gen);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& t) { return layer_norm(t[0], {1}, Tensor(), t[1], 1e-5); }, {x1, b1}));
}

TEST(GradcheckNorm, RmsNorm) {
  Generator gen(3);
  Tensor x = leaf({4, 6}, gen, -2.0, 2.0), w = leaf({6}, gen, 0.5, 1.5);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& t) { return rms_norm(t[0], {6}, t[1], 1e-6); }, {x, w}));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return rms_norm(t, {6}); }, x));
  Tensor x3 = leaf({2, 3, 4}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return rms_norm(t, {3, 4}, Tensor(), 1e-4); }, x3));
}

TEST(GradcheckNorm, CrossEntropyAndNllOverNdLogitsWithIgnoredTargets) {
  Generator gen(4);
  Tensor logits = leaf({2, 3, 5}, gen, -2.0, 2.0);
  const Tensor t = labels({1, -100, 4, 0, 2, -100}, {2, 3});
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    EXPECT_TRUE(gradcheck1([&](const Tensor& x) { return softmax_cross_entropy(x, t, r); }, logits))
        << reduction_name(r);
    EXPECT_TRUE(gradcheck1([&](const Tensor& x) { return nll_loss(log_softmax(x, -1), t, r); }, logits))
        << reduction_name(r);
    EXPECT_TRUE(gradcheck1([&](const Tensor& x) { return nll_loss(x, t, r); }, logits)) << reduction_name(r);
  }
  // Another ignored index, 2-D logits, i32 targets.
  Tensor l2 = leaf({4, 3}, gen);
  const Tensor t2 = Tensor::from_vector<int32_t>({2, 0, 1, 0}, {4});
  EXPECT_TRUE(gradcheck1([&](const Tensor& x) { return softmax_cross_entropy(x, t2, Reduction::Mean, 0); }, l2));
}

TEST(GradcheckNorm, LinearCrossEntropy) {
  Generator gen(9);
  // x [2, 3, 4] against a head of 5 classes; one position ignored.
  Tensor x = leaf({2, 3, 4}, gen), w = leaf({5, 4}, gen);
  const Tensor t = Tensor::from_vector<int64_t>({4, 0, -100, 2, 1, 3}, {2, 3});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& in) { return linear_cross_entropy(in[0], in[1], t, r); }, {x, w}))
        << reduction_name(r);
  }
  EXPECT_TRUE(gradcheck1([&](const Tensor& v) { return linear_cross_entropy(v, w.detach(), t, Reduction::Mean); }, x));
  EXPECT_TRUE(gradcheck1([&](const Tensor& v) { return linear_cross_entropy(x.detach(), v, t, Reduction::Mean); }, w));
  // The logits made a few positions at a time: chunks of 1, 4 (the last one shorter) and 6 positions.
  for (int64_t rows : {1, 4, 6})
    for (Reduction r : {Reduction::Mean, Reduction::Sum})
      EXPECT_TRUE(gradcheck(
          [&](const std::vector<Tensor>& in) { return linear_cross_entropy(in[0], in[1], t, r, -100, rows); }, {x, w}))
          << reduction_name(r) << " chunks of " << rows;
  EXPECT_THROW(linear_cross_entropy(x, w, t, Reduction::Mean, -100, -1), Error);
}

// The fused classifier against the composition it stands for: the loss and both gradients, in f32 and f64,
// with ignored positions and i32 targets; without a gradient it is that composition.
TEST(GradcheckNorm, LinearCrossEntropyIsTheComposition) {
  Generator gen(10);
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x0 = Tensor::uniform({6, 7}, -1.0, 1.0, gen, dt), w0 = Tensor::uniform({300, 7}, -1.0, 1.0, gen, dt);
    const Tensor t = Tensor::from_vector<int32_t>({299, 0, 7, 7, 150, 1}, {6});
    for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
      Tensor xa = x0.clone(), wa = w0.clone(), xb = x0.clone(), wb = w0.clone();
      for (Tensor* v : {&xa, &wa, &xb, &wb}) v->requires_grad_();
      Tensor fused = linear_cross_entropy(xa, wa, t, r, 7), plain = softmax_cross_entropy(linear(xb, wb, Tensor()), t, r, 7);
      backward(scale(fused, 3.0));
      backward(scale(plain, 3.0));
      // In chunks of 4 positions: the second chunk's weight gradient added to the first's.
      Tensor xc = x0.clone(), wc = w0.clone();
      for (Tensor* v : {&xc, &wc}) v->requires_grad_();
      Tensor chunked = linear_cross_entropy(xc, wc, t, r, 7, 4);
      backward(scale(chunked, 3.0));
      const double tol = dt == DType::f32 ? 1e-6 : 1e-12;
      auto close = [&](const Tensor& a, const Tensor& b, const char* what) {
        const std::vector<double> va = a.to(DType::f64).to_vector<double>(), vb = b.to(DType::f64).to_vector<double>();
        ASSERT_EQ(va.size(), vb.size()) << what;
        for (size_t i = 0; i < va.size(); ++i)
          EXPECT_NEAR(va[i], vb[i], tol * (1.0 + std::abs(vb[i]))) << what << " [" << i << "] " << dtype_name(dt) << " "
                                                                  << reduction_name(r);
      };
      close(fused.detach(), plain.detach(), "loss");
      close(xa.grad(), xb.grad(), "d input");
      close(wa.grad(), wb.grad(), "d weight");
      close(chunked.detach(), plain.detach(), "loss in chunks");
      close(xc.grad(), xb.grad(), "d input in chunks");
      close(wc.grad(), wb.grad(), "d weight in chunks");
    }
    NoGradGuard no_grad;
    const Tensor a = linear_cross_entropy(x0, w0, t, Reduction::Mean),
                 b = softmax_cross_entropy(linear(x0, w0, Tensor()), t, Reduction::Mean);
    EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
  }
}

// A head of 300 classes padded with 20 rows (classes = 300; the padding rows random, as no model leaves them,
// so that a padding logit taken into the softmax shows): the loss and gradients of the first 300 rows alone, the
// padding rows' gradient zero, fused in one chunk and in chunks of 4 positions, per position (None, the
// composition on the first rows) and without a gradient. A target in the padding is refused.
TEST(GradcheckNorm, LinearCrossEntropyMasksPaddingClasses) {
  Generator gen(11);
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x0 = Tensor::uniform({6, 7}, -1.0, 1.0, gen, dt), w0 = Tensor::uniform({320, 7}, -3.0, 3.0, gen, dt);
    const Tensor t = Tensor::from_vector<int32_t>({299, 0, 7, 7, 150, 1}, {6});
    const double tol = dt == DType::f32 ? 1e-6 : 1e-12;
    auto close = [&](const Tensor& a, const Tensor& b, const std::string& what) {
      const std::vector<double> va = a.to(DType::f64).to_vector<double>(), vb = b.to(DType::f64).to_vector<double>();
      ASSERT_EQ(va.size(), vb.size()) << what;
      for (size_t i = 0; i < va.size(); ++i)
        EXPECT_NEAR(va[i], vb[i], tol * (1.0 + std::abs(vb[i]))) << what << " [" << i << "] " << dtype_name(dt);
    };
    auto zero = [&](const Tensor& g, const std::string& what) {
      for (double v : g.narrow(0, 300, 20).to(DType::f64).to_vector<double>()) ASSERT_EQ(v, 0.0) << what;
    };
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      const std::string tag = reduction_name(r);
      Tensor xb = x0.clone(), wb = w0.narrow(0, 0, 300).clone();
      for (Tensor* v : {&xb, &wb}) v->requires_grad_();
      Tensor plain = softmax_cross_entropy(linear(xb, wb, Tensor()), t, r, 7);
      backward(r == Reduction::None ? sum(plain) : plain);
      for (int64_t chunk : {0, 4}) {
        Tensor xa = x0.clone(), wa = w0.clone();
        for (Tensor* v : {&xa, &wa}) v->requires_grad_();
        Tensor fused = linear_cross_entropy(xa, wa, t, r, 7, chunk, 300);
        backward(r == Reduction::None ? sum(fused) : fused);
        const std::string what = tag + " chunks of " + std::to_string(chunk);
        close(fused.detach(), plain.detach(), "loss " + what);
        close(xa.grad(), xb.grad(), "d input " + what);
        close(wa.grad().narrow(0, 0, 300), wb.grad(), "d weight " + what);
        zero(wa.grad(), "the padding rows' gradient " + what);
      }
    }
    NoGradGuard no_grad;
    close(linear_cross_entropy(x0, w0, t, Reduction::Mean, -100, 0, 300),
          softmax_cross_entropy(linear(x0, w0.narrow(0, 0, 300), Tensor()), t, Reduction::Mean), "without a gradient");
  }
  Generator g2(12);
  Tensor x = leaf({6, 7}, g2), w = leaf({320, 7}, g2);
  const Tensor in_padding = Tensor::from_vector<int64_t>({299, 0, 305, 7, 150, 1}, {6});
  EXPECT_THROW(linear_cross_entropy(x, w, in_padding, Reduction::Mean, -100, 0, 300), Error);
  EXPECT_THROW(linear_cross_entropy(x, w, in_padding, Reduction::None, -100, 0, 300), Error);
  // The masked head is differentiable as it stands (finite differences over every row, the padding's included).
  const Tensor tt = Tensor::from_vector<int64_t>({4, 0, -100, 2, 1, 3}, {6});
  EXPECT_THROW(linear_cross_entropy(x, w, tt, Reduction::Mean, -100, 0, 321), Error);  // more classes than rows
  Tensor ws = leaf({8, 7}, g2);
  EXPECT_TRUE(gradcheck(
      [&](const std::vector<Tensor>& in) { return linear_cross_entropy(in[0], in[1], tt, Reduction::Mean, -100, 0, 5); },
      {x, ws}));
}

TEST(GradcheckNorm, ElementwiseLosses) {
  Generator gen(5);
  Tensor x = leaf({3, 4}, gen), target = leaf({3, 4}, gen);
  Tensor p = leaf({3, 4}, gen, 0.05, 0.95);
  Tensor t01 = Tensor::uniform({3, 4}, 0.0, 1.0, gen, DType::f64);
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], r); }, {x, target}))
        << "mse " << reduction_name(r);
    EXPECT_TRUE(gradcheck1([&](const Tensor& v) { return binary_cross_entropy(v, t01, r); }, p))
        << "bce " << reduction_name(r);
    EXPECT_TRUE(gradcheck1([&](const Tensor& v) { return binary_cross_entropy_with_logits(v, t01, r); }, x))
        << "bce with logits " << reduction_name(r);
  }
}

TEST(GradcheckNorm, AttentionMathPath) {
  Generator gen(6);
  Tensor q = leaf({2, 2, 4, 3}, gen), k = leaf({2, 2, 4, 3}, gen), v = leaf({2, 2, 4, 2}, gen);
  for (bool causal : {false, true}) {
    EXPECT_TRUE(gradcheck(
        [causal](const std::vector<Tensor>& t) { return scaled_dot_product_attention(t[0], t[1], t[2], causal); },
        {q, k, v}))
        << "causal " << causal;
  }
  // Keys longer and shorter than the queries, an explicit scale, the causal mask's top-left diagonal.
  Tensor k6 = leaf({2, 2, 6, 3}, gen), v6 = leaf({2, 2, 6, 2}, gen), k2 = leaf({2, 2, 2, 3}, gen),
         v2 = leaf({2, 2, 2, 2}, gen);
  for (bool causal : {false, true}) {
    EXPECT_TRUE(gradcheck(
        [causal](const std::vector<Tensor>& t) {
          return scaled_dot_product_attention(t[0], t[1], t[2], causal, 0.0, 0.7);
        },
        {q, k6, v6}));
    EXPECT_TRUE(gradcheck(
        [causal](const std::vector<Tensor>& t) { return scaled_dot_product_attention(t[0], t[1], t[2], causal); },
        {q, k2, v2}));
  }
  // Dropout: the same generator state on every evaluation gives the same mask.
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& t) {
        Generator g(77);
        return scaled_dot_product_attention(t[0], t[1], t[2], true, 0.3, 0.0, &g);
      },
      {q, k, v}));
  // Heads split from [B, T, H, d] by a recorded permutation, as a multi-head layer does.
  Tensor qt = leaf({2, 4, 2, 3}, gen);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& t) { return scaled_dot_product_attention(permute(t[0], {0, 2, 1, 3}), t[1], t[2]); },
      {qt, k, v}));
}

TEST(GradcheckNorm, PackedSelfAttention) {
  Generator gen(8);
  // qkv [B=2, T=4, 3C] with C = 2 heads x 3.
  Tensor qkv = leaf({2, 4, 18}, gen);
  for (bool causal : {false, true}) {
    EXPECT_TRUE(gradcheck1([causal](const Tensor& t) { return packed_self_attention(t, 2, causal); }, qkv))
        << "causal " << causal;
    // The same values as splitting, viewing by head, attending and merging the heads by hand.
    const std::vector<Tensor> parts = split(qkv.detach(), {6, 6, 6}, 2);
    auto by_head = [](const Tensor& y) { return permute(reshape(y, {2, 4, 2, 3}), {0, 2, 1, 3}); };
    const Tensor expect = reshape(
        permute(scaled_dot_product_attention(by_head(parts[0]), by_head(parts[1]), by_head(parts[2]), causal),
                {0, 2, 1, 3}),
        {2, 4, 6});
    const Tensor got = packed_self_attention(qkv.detach(), 2, causal);
    ASSERT_EQ(got.shape(), expect.shape());
    EXPECT_EQ(got.contiguous().to_vector<double>(), expect.contiguous().to_vector<double>()) << "causal " << causal;
  }
  EXPECT_TRUE(gradcheck1(
      [](const Tensor& t) {
        Generator g(78);
        return packed_self_attention(t, 2, true, 0.3, 0.0, &g);
      },
      qkv));
}

// Grouped-query attention: key and value heads serving groups of query heads give what repeating each of them
// for its group gives, and its gradients (summed over each group) check by finite differences.
TEST(GradcheckNorm, GroupedQueryAttention) {
  Generator gen(41);
  Tensor q = leaf({2, 4, 3, 2}, gen), k = leaf({2, 2, 3, 2}, gen), v = leaf({2, 2, 3, 2}, gen);
  for (bool causal : {false, true}) {
    EXPECT_TRUE(gradcheck(
        [causal](const std::vector<Tensor>& t) { return scaled_dot_product_attention(t[0], t[1], t[2], causal); },
        {q, k, v}))
        << "causal " << causal;
    auto repeat = [](const Tensor& x) {  // head h serves query heads 2h and 2h + 1
      return concat({x.narrow(1, 0, 1), x.narrow(1, 0, 1), x.narrow(1, 1, 1), x.narrow(1, 1, 1)}, 1).contiguous();
    };
    const Tensor got = scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), causal);
    const Tensor want = scaled_dot_product_attention(q.detach(), repeat(k.detach()), repeat(v.detach()), causal);
    EXPECT_EQ(got.contiguous().to_vector<double>(), want.contiguous().to_vector<double>()) << "causal " << causal;
  }
  // One key-value head for every query head (multi-query attention).
  Tensor k1 = leaf({2, 1, 3, 2}, gen), v1 = leaf({2, 1, 3, 2}, gen);
  EXPECT_TRUE(gradcheck(
      [](const std::vector<Tensor>& t) { return scaled_dot_product_attention(t[0], t[1], t[2], true); }, {q, k1, v1}));
  // Heads that do not divide are refused.
  Tensor k3 = leaf({2, 3, 3, 2}, gen);
  EXPECT_THROW(scaled_dot_product_attention(q, k3, k3), Error);
}

// Rotary position embeddings: the rotation of each pair by its angle (checked against the formula), and the
// gradient by finite differences; the tables' frequencies as transformers computes them, and Llama 3's rescaling.
TEST(GradcheckNorm, RotaryEmbedding) {
  Generator gen(42);
  Tensor x = leaf({2, 3, 5, 4}, gen);
  auto [cos, sin] = rotary_tables(4, 5, 10000.0, RopeScaling{}, DType::f64, Device::cpu());
  EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return rotary_embedding(t, cos, sin); }, x));
  const std::vector<double> xs = x.contiguous().to_vector<double>(), ys = rotary_embedding(x, cos, sin).contiguous().to_vector<double>();
  const std::vector<double> cs = cos.to_vector<double>(), ss = sin.to_vector<double>();
  for (int64_t r = 0; r < 2 * 3; ++r)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t i = 0; i < 2; ++i) {
        const int64_t base = (r * 5 + t) * 4;
        const double x1 = xs[base + i], x2 = xs[base + i + 2], c = cs[t * 4 + i], sn = ss[t * 4 + i];
        EXPECT_NEAR(ys[base + i], x1 * c - x2 * sn, 1e-12);
        EXPECT_NEAR(ys[base + i + 2], x2 * c + x1 * sn, 1e-12);
      }
  // Frequency i of head size 8: theta^(-2i/8); position 3's angle is 3 x that (in f32, as transformers).
  auto [c8, s8] = rotary_tables(8, 4, 500000.0, RopeScaling{}, DType::f64, Device::cpu());
  const std::vector<double> c8v = c8.to_vector<double>();
  for (int64_t i = 0; i < 4; ++i) {
    const float inv = 1.0f / std::pow(500000.0f, static_cast<float>(2 * i) / 8.0f);
    EXPECT_DOUBLE_EQ(c8v[3 * 8 + i], std::cos(static_cast<double>(3.0f * inv)));
    EXPECT_DOUBLE_EQ(c8v[3 * 8 + i + 4], c8v[3 * 8 + i]);
  }
  // Llama 3 (factor 8, original context 16: wavelengths above 16 / 1 divided by 8, below 16 / 4 kept, between
  // blended): frequency 0 (wavelength 2 pi) blends, frequency 3 (wavelength about 3e4) is divided.
  RopeScaling s{8.0, 1.0, 4.0, 16};
  auto [cs8, ss8] = rotary_tables(8, 2, 500000.0, s, DType::f64, Device::cpu());
  const std::vector<double> scaled = ss8.to_vector<double>();
  const float smooth = (16.0f / (2.0f * static_cast<float>(M_PI)) - 1.0f) / 3.0f;
  const float inv0 = (1.0f - smooth) * 1.0f / 8.0f + smooth * 1.0f;
  EXPECT_DOUBLE_EQ(scaled[8 + 0], std::sin(static_cast<double>(inv0)));
  EXPECT_GT(inv0, 1.0f / 8.0f);
  EXPECT_LT(inv0, 1.0f);
  const float inv3 = 1.0f / std::pow(500000.0f, 6.0f / 8.0f) / 8.0f;
  EXPECT_DOUBLE_EQ(scaled[8 + 3], std::sin(static_cast<double>(1.0f * inv3)));
  EXPECT_THROW(rotary_embedding(x, c8, s8), Error);  // tables of another head size
}

TEST(GradcheckNorm, DropoutOnAnyShape) {
  Generator gen(7);
  for (const Shape& s : {Shape{7}, Shape{2, 3, 4}, Shape{2, 1, 3, 2, 2}}) {
    Tensor x = leaf(s, gen);
    EXPECT_TRUE(gradcheck1(
        [](const Tensor& t) {
          Generator g(5);
          return dropout(t, 0.4, true, g);
        },
        x))
        << shape_str(s);
  }
}

}  // namespace
}  // namespace tandem::testing
