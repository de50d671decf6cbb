// DistOpt with release_gradients (what the tandem program uses): gradients live only from backward to the
// update, each bucket allocated as backward reaches it. The steps are those of kept gradients, bit for bit (with
// clipping, accumulation, a parameter a step leaves out); update() leaves no gradient behind; and the peak
// memory of a step whose activations outweigh its gradients drops by about the gradients' size.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tandem/autograd.h"
#include "tandem/device.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem {
namespace {

// A stack of linear layers with ReLU, and a side layer that only odd steps use.
struct Stack : nn::Module {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  std::shared_ptr<nn::Linear> side;
  Stack(int64_t width, int depth) {
    Generator gen(7);
    for (int i = 0; i < depth; ++i)
      layers.push_back(register_module("l" + std::to_string(i), std::make_shared<nn::Linear>(width, width, gen, true, true)));
    side = register_module("side", std::make_shared<nn::Linear>(width, width, gen));
  }
  Tensor forward_step(const Tensor& x, bool use_side) {
    Tensor h = x;
    for (auto& l : layers) h = l->forward(h);
    if (use_side) h = add(h, side->forward(x));
    return mean(mul(h, h));
  }
  Tensor forward(const Tensor& x) override { return forward_step(x, false); }
};

Tensor batch(int64_t rows, int64_t width, int step) {
  Generator gen(100 + static_cast<uint64_t>(step));
  return Tensor::normal({rows, width}, 0.0, 1.0, gen);
}

std::vector<std::vector<float>> values(nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<float> norms;
  bool grads_after_update = false;
  size_t peak = 0;  // the last step's peak, over the memory held before the model was made
  int64_t gradient_bytes = 0;
};

Trained train(bool release, int64_t width, int depth, int64_t rows, int steps, bool accumulate) {
  const size_t start = memory_stats(Device::cpu()).in_use;
  Stack net(width, depth);
  auto adam = std::make_shared<optim::Adam>(net.parameters(), optim::AdamOptions{.lr = 1e-3, .decoupled = true});
  dist::DistOptOptions o;
  o.release_gradients = release;
  o.bucket_bytes = size_t(64) << 10;
  o.first_bucket_bytes = size_t(16) << 10;
  dist::DistOpt opt(adam, dist::make_single_communicator(), o);
  opt.sync_parameters(net);
  Trained r;
  for (int s = 0; s < steps; ++s) {
    reset_peak_memory(Device::cpu());
    if (accumulate) {
      auto local = opt.no_sync();
      opt.backward_and_sync(net.forward_step(batch(rows, width, 2 * s), s % 2 == 1));
    }
    opt.backward_and_sync(net.forward_step(batch(rows, width, 2 * s + 1), s % 2 == 1));
    r.norms.push_back(opt.clip_grad_norm_in_update(0.5).item<float>());
    opt.update();
    r.peak = memory_stats(Device::cpu()).peak_in_use - start;
    r.grads_after_update = false;
    for (const Tensor& p : net.parameters()) r.grads_after_update |= p.grad().defined();
  }
  r.params = values(net);
  r.gradient_bytes = opt.memory_report().gradients;
  return r;
}

TEST(ReleasedGradients, StepLikeKeptGradientsAndLeaveNoneBehind) {
  for (bool accumulate : {false, true}) {
    const Trained kept = train(false, 48, 3, 16, 6, accumulate), released = train(true, 48, 3, 16, 6, accumulate);
    EXPECT_EQ(released.params, kept.params) << "accumulate " << accumulate;
    EXPECT_EQ(released.norms, kept.norms) << "accumulate " << accumulate;
    EXPECT_TRUE(kept.grads_after_update);
    EXPECT_FALSE(released.grads_after_update) << "update() left gradients behind";
    EXPECT_EQ(released.gradient_bytes, kept.gradient_bytes) << "the report counts what a step holds at its end";
    EXPECT_GT(released.gradient_bytes, 0);
  }
}

TEST(ReleasedGradients, TheStepsPeakHoldsNoGradientBesideTheActivations) {
  // 8 layers of 256 x 256 (2 MiB of gradients) on 2048 rows (2 MiB per activation, two per layer kept).
  const Trained kept = train(false, 256, 8, 2048, 3, false), released = train(true, 256, 8, 2048, 3, false);
  EXPECT_EQ(released.params, kept.params);
  ASSERT_GT(kept.gradient_bytes, int64_t(2) << 20);
  EXPECT_LE(static_cast<double>(released.peak) + 0.7 * static_cast<double>(kept.gradient_bytes),
            static_cast<double>(kept.peak))
      << "peak released " << released.peak << ", kept " << kept.peak << ", gradients "
      << kept.gradient_bytes;
}

// SGD with momentum through step(): the side layer's steps without a gradient leave its momentum alone, as with
// kept gradients.
TEST(ReleasedGradients, SgdWithMomentumStepsAsWithKeptGradients) {
  auto run = [](bool release) {
    Stack net(16, 2);
    auto sgd = std::make_shared<optim::SGD>(net.parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
    dist::DistOptOptions o;
    o.release_gradients = release;
    dist::DistOpt opt(sgd, dist::make_single_communicator(), o);
    opt.sync_parameters(net);
    for (int s = 0; s < 3; ++s) opt.step(net.forward_step(batch(4, 16, s), true));
    return values(net);
  };
  EXPECT_EQ(run(true), run(false));
}

}  // namespace
}  // namespace tandem
