// Models: parameter counts against the published architectures, shapes, and that training moves them.
#include <gtest/gtest.h>

#include "tandem/autograd.h"
#include "tandem/nn/layers.h"
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

// The bigram language model: the logits after token t are row t of its one table, for every position.
TEST(Models, BigramLogitsAreTheTableRowsOfEachToken) {
  nn::ModelConfig c;
  c.gpt.vocab = 7;
  c.seed = 3;
  nn::ModulePtr m = nn::make_model("bigram", c);
  ASSERT_TRUE(nn::is_language_model("bigram"));
  EXPECT_FALSE(nn::is_language_model("cnn"));
  EXPECT_EQ(m->num_parameters(), 49);
  EXPECT_EQ(m->flops_per_token(16), 0.0);  // no matrix products: no MFU figure
  const std::vector<int32_t> tokens = {0, 6, 3, 3, 1, 5};
  Tensor x = Tensor::from_vector(tokens, {2, 3});
  Tensor logits = m->forward(x);
  ASSERT_EQ(logits.shape(), (Shape{2, 3, 7}));
  const std::vector<float> table = m->parameters()[0].to_vector<float>();
  const std::vector<float> out = logits.to_vector<float>();
  for (size_t i = 0; i < tokens.size(); ++i)
    for (size_t j = 0; j < 7; ++j) ASSERT_EQ(out[i * 7 + j], table[static_cast<size_t>(tokens[i]) * 7 + j]);
  // Tokens [B, T] only, of an integer type.
  EXPECT_THROW(m->forward(Tensor::zeros({6}, DType::i32)), Error);
  EXPECT_THROW(m->forward(Tensor::zeros({2, 3}, DType::f32)), Error);
  c.gpt.vocab = 1;
  EXPECT_THROW(nn::make_model("bigram", c), Error);
}

// The bigram's gradient: the mean cross-entropy's, by finite differences in f64.
TEST(Models, BigramGradientMatchesFiniteDifferences) {
  nn::ModelConfig c;
  c.gpt.vocab = 4;
  nn::ModulePtr m = nn::make_model("bigram", c);
  Tensor w = m->parameters()[0];
  Tensor w64 = w.to(DType::f64).detach();
  w64.requires_grad_(true);
  const Tensor x = Tensor::from_vector(std::vector<int32_t>{0, 2, 2, 1, 3, 0}, {2, 3});
  const Tensor y = Tensor::from_vector(std::vector<int32_t>{2, 2, 1, 3, 0, 0}, {2, 3});
  auto loss_at = [&](const Tensor& table) {
    return softmax_cross_entropy(embedding(table, x), y, Reduction::Mean);
  };
  backward(loss_at(w64));
  const std::vector<double> grad = w64.grad().to_vector<double>();
  std::vector<double> v = w64.detach().to_vector<double>();
  const double h = 1e-6;
  NoGradGuard no_grad;
  for (size_t i = 0; i < v.size(); ++i) {
    std::vector<double> up = v, down = v;
    up[i] += h;
    down[i] -= h;
    const double fd = (loss_at(Tensor::from_vector(up, {4, 4})).item<double>() -
                       loss_at(Tensor::from_vector(down, {4, 4})).item<double>()) / (2 * h);
    EXPECT_NEAR(grad[i], fd, 1e-7) << "entry " << i;
  }
  // The model's own forward gives the same loss as the f64 table rounded to f32.
  EXPECT_NEAR(softmax_cross_entropy(m->forward(x), y, Reduction::Mean).item<double>(), loss_at(w64).item<double>(),
              1e-5);
}

// A module's generators are found by name through its children, and an offset set from a checkpoint
// makes dropout draw the masks it drew at that point.
TEST(Models, NamedGeneratorsRestoreDropoutMasks) {
  auto seq = std::make_shared<nn::Sequential>();
  seq->add(std::make_shared<nn::Dropout>(0.5, 11));
  seq->add(std::make_shared<nn::ReLU>());
  seq->add(std::make_shared<nn::Dropout>(0.5, 12));
  nn::NamedGenerators gens = seq->named_generators();
  ASSERT_EQ(gens.size(), 2u);
  EXPECT_EQ(gens[0].first, "0.rng");
  EXPECT_EQ(gens[1].first, "2.rng");
  const Tensor x = Tensor::full({64}, 1.0);
  seq->forward(x);
  const uint64_t o0 = gens[0].second->offset(), o1 = gens[1].second->offset();
  EXPECT_GT(o0, 0u);
  const std::vector<float> next = seq->forward(x).to_vector<float>();
  gens[0].second->set_offset(o0);
  gens[1].second->set_offset(o1);
  EXPECT_EQ(seq->forward(x).to_vector<float>(), next);
  // Evaluation draws nothing.
  seq->eval();
  const uint64_t before = gens[0].second->offset();
  seq->forward(x);
  EXPECT_EQ(gens[0].second->offset(), before);
}
