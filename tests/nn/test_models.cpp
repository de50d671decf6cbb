// Models: parameter counts against the published architectures, shapes, and that training moves them.
#include <gtest/gtest.h>

#include "tandem/autograd.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

using namespace tandem;

namespace {
nn::ModelConfig imagenet() {
  nn::ModelConfig c;
  c.in_channels = 3;
  c.height = c.width = 224;
  c.num_classes = 1000;
  return c;
}
}  // namespace

TEST(Models, GuideCnnHas431080Parameters) {
  EXPECT_EQ(nn::make_model("cnn", {})->num_parameters(), 431080);
}

TEST(Models, MlpCountsFollowTheHiddenSizes) {
  nn::ModelConfig c;
  c.hidden = {64, 32};
  EXPECT_EQ(nn::make_model("mlp", c)->num_parameters(), (784 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10));
}

// The reference counts are those of the original architectures (as torchvision builds them):
// convolutions without bias, batch norm with a scale and a shift, a biased final layer.
TEST(Models, ResNetParameterCountsMatchTheArchitectures) {
  EXPECT_EQ(nn::make_model("resnet18", imagenet())->num_parameters(), 11689512);
  EXPECT_EQ(nn::make_model("resnet34", imagenet())->num_parameters(), 21797672);
  EXPECT_EQ(nn::make_model("resnet50", imagenet())->num_parameters(), 25557032);
}

TEST(Models, ResNetBuffersAreBatchNormStatistics) {
  auto m = nn::make_model("resnet18", imagenet());
  auto buffers = m->named_buffers();
  ASSERT_FALSE(buffers.empty());
  EXPECT_EQ(buffers.size() % 2, 0u);
  for (auto& [name, t] : buffers)
    EXPECT_TRUE(name.find("running_mean") != std::string::npos || name.find("running_var") != std::string::npos)
        << name;
}

TEST(Models, SmallResNetTrainsOnCifarSizedInputs) {
  nn::ModelConfig c;
  c.in_channels = 3;
  c.height = c.width = 32;
  c.num_classes = 10;
  auto m = nn::make_model("resnet18", c);
  Generator gen(3);
  Tensor x = Tensor::normal({4, 3, 32, 32}, 0.0, 1.0, gen);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{1, 7, 3, 3}, {4});
  optim::SGD sgd(m->parameters(), {.lr = 0.05, .momentum = 0.9});
  m->train();
  Tensor logits = m->forward(x);
  ASSERT_EQ(logits.shape(), (Shape{4, 10}));
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    Tensor loss = softmax_cross_entropy(m->forward(x), y);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    sgd.zero_grad();
    backward(loss);
    sgd.step();
  }
  EXPECT_LT(last, first) << "five steps on one batch should fit it better";
  m->eval();
  NoGradGuard ng;
  EXPECT_EQ(m->forward(x).shape(), (Shape{4, 10}));
}

TEST(Models, UnknownModelNamesTheChoices) {
  try {
    nn::make_model("resnet9", {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resnet50"), std::string::npos) << e.what();
  }
}
