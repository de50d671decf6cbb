// Time profiles per device: a small model's training steps on the CPU list its kernels by phase with
// the times they took, after the skipped first iterations; verbosity 0 times nothing.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "tandem/autograd.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"
#include "tandem/profiler.h"

namespace tandem {
namespace {

using profiler::OpTime;
using profiler::Phase;

// Leaves the CPU's profile off and empty for the next test.
struct ProfiledCpu {
  ProfiledCpu(int level, int skip) {
    profiler::reset(Device::cpu());
    profiler::set_verbosity(Device::cpu(), level);
    profiler::set_skip_iterations(Device::cpu(), skip);
  }
  ~ProfiledCpu() {
    profiler::set_verbosity(Device::cpu(), 0);
    profiler::set_skip_iterations(Device::cpu(), 5);
    profiler::reset(Device::cpu());
  }
};

// `steps` SGD steps of a one-layer classifier: linear, relu, softmax cross-entropy.
void train(int steps) {
  Generator gen(3);
  Tensor w = Tensor::uniform({4, 6}, -1, 1, gen), b = Tensor::zeros({4});
  w.requires_grad_();
  b.requires_grad_();
  optim::SGD sgd({w, b}, optim::SgdOptions{0.1});
  Tensor x = Tensor::uniform({8, 6}, -1, 1, gen);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}, {8});
  for (int i = 0; i < steps; ++i) {
    backward(softmax_cross_entropy(relu(linear(x, w, b)), y));
    sgd.step();
    sgd.zero_grad();
  }
}

const OpTime* find(const profiler::Profile& p, const std::string& name, Phase phase) {
  for (const OpTime& op : p.ops)
    if (op.name == name && op.phase == phase) return &op;
  return nullptr;
}

TEST(Profiler, ListsEachKernelByPhaseAfterTheSkippedIterations) {
  ProfiledCpu on(2, 1);
  train(4);
  const profiler::Profile p = profiler::profile(Device::cpu());
  EXPECT_EQ(p.iterations, 4);
  EXPECT_EQ(p.profiled, 3);
  // The model's kernels, each in its phase: the product forward, the loss forward and backward, ReLU's
  // gradient, the optimizer's step.
  const OpTime* gemm = find(p, "gemm", Phase::Forward);
  const OpTime* loss = find(p, "softmax_xent_forward", Phase::Forward);
  const OpTime* loss_grad = find(p, "softmax_xent_backward", Phase::Backward);
  const OpTime* relu_grad = find(p, "relu_backward", Phase::Backward);
  const OpTime* step = find(p, "sgd_step", Phase::Update);
  for (const OpTime* op : {gemm, loss, loss_grad, relu_grad, step}) {
    ASSERT_NE(op, nullptr) << profiler::report(Device::cpu());
    EXPECT_GT(op->seconds, 0.0) << op->name;
  }
  // Only the 3 iterations after the skipped one were timed.
  EXPECT_EQ(loss->calls, 3);
  EXPECT_EQ(loss_grad->calls, 3);
  EXPECT_EQ(step->calls, 3);
  EXPECT_EQ(find(p, "softmax_xent_backward", Phase::Forward), nullptr);

  const std::string r = profiler::report(Device::cpu());
  EXPECT_NE(r.find("Time Profiling: cpu, 3 iterations after the first 1 skipped"), std::string::npos) << r;
  EXPECT_NE(r.find("softmax_xent_forward [forward] : "), std::string::npos) << r;
  EXPECT_NE(r.find("sgd_step [update] : "), std::string::npos) << r;
  EXPECT_NE(r.find(", 1 call\n"), std::string::npos) << r;
}

TEST(Profiler, OnlyTheTrainingThreadBeginsTheNextIteration) {
  ProfiledCpu on(2, 1);
  Tensor w = Tensor::ones({3});
  w.requires_grad_();
  backward(sum(mul(w, w)));  // iteration 0 (skipped) has ended
  std::thread([] { Tensor::ones({4}); }).join();  // another thread's kernel (a loader's upload)
  EXPECT_TRUE(profiler::profile(Device::cpu()).ops.empty());
  Tensor::ones({4});  // the training thread's next forward kernel begins iteration 1: timed
  const profiler::Profile p = profiler::profile(Device::cpu());
  ASSERT_EQ(p.ops.size(), 1u);
  EXPECT_EQ(p.ops[0].name, "fill");
}

TEST(Profiler, ForwardAndBackwardTotalsAtVerbosityOne) {
  ProfiledCpu on(1, 0);
  train(2);
  const std::string r = profiler::report(Device::cpu());
  EXPECT_NE(r.find("Forward Propagation Time : "), std::string::npos) << r;
  EXPECT_NE(r.find("Backward Propagation Time : "), std::string::npos) << r;
  EXPECT_EQ(r.find("OP_ID"), std::string::npos) << r;
}

TEST(Profiler, DistributedLevelListsOnlyTheDistributedOptimizersKernels) {
  ProfiledCpu on(3, 0);
  train(1);
  const std::string r = profiler::report(Device::cpu());
  EXPECT_NE(r.find("no distributed training operation was timed"), std::string::npos) << r;
  EXPECT_EQ(r.find("gemm"), std::string::npos) << r;
}

TEST(Profiler, NothingIsTimedWhileOffOrDuringTheSkippedIterations) {
  {
    ProfiledCpu off(0, 0);
    train(2);
    EXPECT_TRUE(profiler::profile(Device::cpu()).ops.empty());
    EXPECT_EQ(profiler::report(Device::cpu()), "");
  }
  ProfiledCpu on(2, 5);
  train(3);
  const profiler::Profile p = profiler::profile(Device::cpu());
  EXPECT_EQ(p.iterations, 3);
  EXPECT_TRUE(p.ops.empty());
  EXPECT_NE(profiler::report(Device::cpu()).find("nothing was timed yet"), std::string::npos);
}

TEST(Profiler, RefusesLevelsAndSkipsItDoesNotKnow) {
  EXPECT_THROW(profiler::set_verbosity(Device::cpu(), 4), Error);
  EXPECT_THROW(profiler::set_verbosity(Device::cpu(), -1), Error);
  EXPECT_THROW(profiler::set_skip_iterations(Device::cpu(), -1), Error);
  EXPECT_EQ(profiler::profile(Device::cpu()).verbosity, 0);
}

}  // namespace
}  // namespace tandem
