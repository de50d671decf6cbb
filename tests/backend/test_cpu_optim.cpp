// Fused optimizer steps against values worked out by hand, element by element, over several steps.
#include <cmath>

#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

using backend::AdamArgs;
using backend::ParamSlot;
using backend::SgdArgs;

TEST(CpuSgd, PlainStepWithWeightDecay) {
  // p = 1, g = 0.5, lr 0.1, wd 0.2: d = 0.5 + 0.2 = 0.7, p = 1 - 0.07 = 0.93; then d = 0.5 + 0.186 = 0.686.
  Tensor p = Tensor::full({3}, 1.0, DType::f64), g = Tensor::full({3}, 0.5, DType::f64);
  ParamSlot slot{p, g, Tensor(), Tensor(), Tensor()};
  SgdArgs a{0.1, 0.0, 0.0, 0.2, false, true};
  cpu().sgd_step(&slot, 1, a);
  EXPECT_NEAR(p.to_vector<double>()[2], 0.93, 1e-15);
  a.first_step = false;
  cpu().sgd_step(&slot, 1, a);
  EXPECT_NEAR(p.to_vector<double>()[0], 0.93 - 0.1 * 0.686, 1e-15);
}

TEST(CpuSgd, MomentumDampeningAndNesterov) {
  // Hand-worked, one element: p0 = 2, gradients 1, -2, 0.5 over three steps; lr 0.1, momentum 0.9.
  struct Case {
    double dampening, wd;
    bool nesterov;
    double p[3];
  };
  // momentum, no dampening: buf = 1, 0.9-2 = -1.1, -0.99+0.5 = -0.49
  //   p: 2 - 0.1 = 1.9, 1.9 + 0.11 = 2.01, 2.01 + 0.049 = 2.059
  // dampening 0.5: buf = 1 (first step takes the gradient whole), 0.9 - 1 = -0.1, -0.09 + 0.25 = 0.16
  //   p: 1.9, 1.91, 1.894
  // nesterov: buf as the first case; d = g + 0.9 * buf: 1.9, -2.99, 0.059
  //   p: 2 - 0.19 = 1.81, 1.81 + 0.299 = 2.109, 2.109 - 0.0059 = 2.1031
  // weight decay 0.1 with momentum: d = g + 0.1 p: 1.2; buf 1.2; p = 1.88
  //   d = -2 + 0.188 = -1.812; buf = 1.08 - 1.812 = -0.732; p = 1.88 + 0.0732 = 1.9532
  //   d = 0.5 + 0.19532 = 0.69532; buf = -0.6588 + 0.69532 = 0.03652; p = 1.9532 - 0.003652 = 1.949548
  const Case cases[] = {{0.0, 0.0, false, {1.9, 2.01, 2.059}},
                        {0.5, 0.0, false, {1.9, 1.91, 1.894}},
                        {0.0, 0.0, true, {1.81, 2.109, 2.1031}},
                        {0.0, 0.1, false, {1.88, 1.9532, 1.949548}}};
  const double grads[3] = {1.0, -2.0, 0.5};
  for (DType dt : float_types())
    for (const Case& c : cases) {
      // Two slots in one call: the second tensor is large enough to be updated by several threads.
      Tensor p1 = Tensor::full({1}, 2.0, dt), p2 = Tensor::full({50000}, 2.0, dt);
      Tensor b1 = Tensor::empty({1}, dt), b2 = Tensor::empty({50000}, dt);
      for (int step = 0; step < 3; ++step) {
        Tensor g1 = Tensor::full({1}, grads[step], dt), g2 = Tensor::full({50000}, grads[step], dt);
        ParamSlot slots[2] = {{p1, g1, b1, Tensor(), Tensor()}, {p2, g2, b2, Tensor(), Tensor()}};
        cpu().sgd_step(slots, 2, SgdArgs{0.1, 0.9, c.dampening, c.wd, c.nesterov, step == 0});
        const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
        EXPECT_NEAR(p1.item<double>(), c.p[step], tol) << "step " << step << " dampening " << c.dampening;
        auto v2 = p2.to_vector<double>();
        EXPECT_NEAR(v2.front(), c.p[step], tol);
        EXPECT_NEAR(v2.back(), c.p[step], tol);
      }
    }
}

// Adam by its definition, one element, in double.
struct AdamRef {
  double p, m = 0, v = 0;
  void step(double g, int64_t t, double lr, double b1, double b2, double eps, double wd, bool decoupled) {
    if (decoupled)
      p *= 1 - lr * wd;
    else
      g += wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, double(t))), vhat = v / (1 - std::pow(b2, double(t)));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

TEST(CpuAdam, BothWeightDecayModesOverSeveralSteps) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
  const double grads[4] = {0.3, -0.1, 0.7, 0.05};
  for (DType dt : float_types())
    for (bool decoupled : {false, true}) {
      AdamRef ref{1.5};
      Tensor p = Tensor::full({40000}, 1.5, dt), m = Tensor::zeros({40000}, dt), v = Tensor::zeros({40000}, dt);
      for (int64_t t = 1; t <= 4; ++t) {
        Tensor g = Tensor::full({40000}, grads[t - 1], dt);
        ParamSlot slot{p, g, m, v, Tensor()};
        cpu().adam_step(&slot, 1, AdamArgs{lr, b1, b2, eps, wd, t, decoupled});
        ref.step(grads[t - 1], t, lr, b1, b2, eps, wd, decoupled);
        const double tol = dt == DType::f64 ? 1e-13 : 2e-6;
        auto vp = p.to_vector<double>();
        EXPECT_NEAR(vp[0], ref.p, tol) << "step " << t << (decoupled ? " decoupled" : " L2");
        EXPECT_NEAR(vp[39999], ref.p, tol);
        EXPECT_NEAR(m.to_vector<double>()[7], ref.m, tol);
        EXPECT_NEAR(v.to_vector<double>()[7], ref.v, tol);
      }
    }
}

TEST(CpuAdam, FirstStepMovesEachElementByAboutLr) {
  // With zero state, the bias-corrected first step is lr * g / (|g| + eps): a sign step of size lr.
  Tensor p = Tensor::from_vector<float>({0.f, 0.f, 0.f}, {3});
  Tensor g = Tensor::from_vector<float>({2.f, -0.001f, 30.f}, {3});
  Tensor m = Tensor::zeros({3}), v = Tensor::zeros({3});
  ParamSlot slot{p, g, m, v, Tensor()};
  cpu().adam_step(&slot, 1, AdamArgs{0.1, 0.9, 0.999, 1e-8, 0.0, 1, false});
  auto got = p.to_vector<float>();
  EXPECT_NEAR(got[0], -0.1f, 1e-6);
  EXPECT_NEAR(got[1], 0.1f, 1e-5);
  EXPECT_NEAR(got[2], -0.1f, 1e-6);
}

// A gradient factor gives the step of gradients scaled by it first; the copies are the updated parameters'
// rounding to bf16 and f16 (Tensor::to's).
TEST(CpuAdam, GradientFactorAndCopiesGiveTheBitsOfScalingFirstAndConverting) {
  for (DType copy_type : {DType::bf16, DType::f16}) {
    Tensor p1 = Tensor::from_vector<float>({0.5f, -1.25f, 3.0f, 1e-3f}, {4}), p2 = p1.clone();
    Tensor m1 = Tensor::zeros({4}), v1 = Tensor::zeros({4}), m2 = Tensor::zeros({4}), v2 = Tensor::zeros({4});
    Tensor copy = Tensor::zeros({4}, copy_type);
    for (int64_t t = 1; t <= 3; ++t) {
      const float f = 0.3f + 0.2f * static_cast<float>(t);
      Tensor factor = Tensor::full({1}, f);
      std::vector<float> gv = {0.7f * t, -0.2f, 1.9f, -3.0f / t};
      Tensor g1 = Tensor::from_vector<float>(gv, {4}), g2 = Tensor::from_vector<float>(gv, {4});
      cpu().scale_by(g2, factor, g2);
      AdamArgs a{0.01, 0.9, 0.95, 1e-8, 0.1, t, true};
      ParamSlot s2{p2, g2, m2, v2, Tensor()};
      cpu().adam_step(&s2, 1, a);
      AdamArgs af = a;
      af.grad_factor = factor.data<float>();
      ParamSlot s1{p1, g1, m1, v1, copy};
      cpu().adam_step(&s1, 1, af);
      EXPECT_EQ(p1.to_vector<float>(), p2.to_vector<float>()) << "step " << t;
      EXPECT_EQ(m1.to_vector<float>(), m2.to_vector<float>());
      EXPECT_EQ(v1.to_vector<float>(), v2.to_vector<float>());
      EXPECT_EQ(copy.to(DType::f32).to_vector<float>(), p2.to(copy_type).to(DType::f32).to_vector<float>())
          << dtype_name(copy_type) << " step " << t;
    }
  }
  // A copy of another size is refused with the parameter named.
  Tensor p = Tensor::zeros({4}), g = Tensor::zeros({4}), m = Tensor::zeros({4}), v = Tensor::zeros({4});
  ParamSlot bad{p, g, m, v, Tensor::zeros({3}, DType::bf16)};
  EXPECT_THROW(cpu().adam_step(&bad, 1, AdamArgs{0.01, 0.9, 0.95, 1e-8, 0.0, 1, true}), Error);
}

// The step runs over chunks of all the slots at once, eight lanes at a time with a scalar tail: every element
// of equal inputs gets the same bits wherever it falls (lanes, tails, chunk edges, small and large slots), and
// the values follow Adam's definition; the gradients are left as they were, factor or not.
TEST(CpuAdam, ChunksLanesAndTailsAgree) {
  for (DType dt : float_types())
    for (int threads : {1, 2}) {
      ThreadScope scope(threads);
      const std::vector<int64_t> sizes = {3, 8, 16384 + 5, 40000, 1};
      std::vector<ParamSlot> slots;
      for (int64_t n : sizes)
        slots.push_back({Tensor::full({n}, 0.75, dt), Tensor::full({n}, -0.3, dt), Tensor::zeros({n}, dt),
                         Tensor::zeros({n}, dt), Tensor()});
      AdamRef ref{0.75};
      Tensor factor = Tensor::full({1}, 0.5);
      for (int64_t t = 1; t <= 3; ++t) {
        AdamArgs a{0.01, 0.9, 0.95, 1e-8, 0.1, t, true};
        if (dt == DType::f32) a.grad_factor = factor.data<float>();
        cpu().adam_step(slots.data(), static_cast<int64_t>(slots.size()), a);
        ref.step(dt == DType::f32 ? -0.15 : -0.3, t, 0.01, 0.9, 0.95, 1e-8, 0.1, true);
      }
      const double first = slots[0].param.to_vector<double>()[0];
      EXPECT_NEAR(first, ref.p, dt == DType::f64 ? 1e-12 : 1e-6) << dtype_name(dt);
      for (const ParamSlot& s : slots) {
        for (double v : values(s.param)) ASSERT_EQ(v, first) << dtype_name(dt) << " slot of " << s.param.numel();
        for (double g : values(s.grad))
          ASSERT_EQ(g, Tensor::full({1}, -0.3, dt).item<double>()) << "the gradients are left as they were";
      }
    }
}

}  // namespace
}  // namespace tandem::testing
