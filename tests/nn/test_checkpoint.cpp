// Checkpoints: round trip of parameters, buffers and optimizer state; clear errors for bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tandem/autograd.h"
#include "tandem/checkpoint.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("tandem_ckpt_" + name + "_" + std::to_string(getpid()));
}

// One SGD step on a fixed batch, so that parameters and momentum hold something.
void train_step(nn::Module& m, optim::Optimizer& opt, uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::normal({4, 1, 28, 28}, 0.0, 1.0, gen);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 3, 5, 9}, {4});
  Tensor loss = softmax_cross_entropy(m.forward(x), y);
  opt.zero_grad();
  backward(loss);
  opt.step();
}

std::vector<float> flat(const std::vector<Tensor>& ts) {
  std::vector<float> out;
  for (const Tensor& t : ts)
    for (float v : t.to_vector<float>()) out.push_back(v);
  return out;
}

}  // namespace

TEST(Checkpoint, RoundTripContinuesExactlyLikeTheOriginal) {
  nn::ModelConfig cfg;
  auto a = nn::make_model("cnn", cfg);
  optim::SGD sa(a->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
  train_step(*a, sa, 1);
  fs::path p = temp_file("roundtrip");
  save_checkpoint(p.string(), *a, &sa, R"({"epoch": 3, "note": "x"})");

  cfg.seed = 99;  // different initial values
  auto b = nn::make_model("cnn", cfg);
  optim::SGD sb(b->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
  std::string meta = load_checkpoint(p.string(), *b, &sb);
  EXPECT_NE(meta.find("\"epoch\":3"), std::string::npos) << meta;
  EXPECT_EQ(flat(a->parameters()), flat(b->parameters()));
  EXPECT_EQ(sb.steps(), sa.steps());
  // The momentum came back too: one more identical step keeps the two identical.
  train_step(*a, sa, 2);
  train_step(*b, sb, 2);
  EXPECT_EQ(flat(a->parameters()), flat(b->parameters()));
  fs::remove(p);
}

TEST(Checkpoint, BuffersAndAdamStateRoundTrip) {
  nn::ModelConfig cfg;
  cfg.height = cfg.width = 32;
  cfg.in_channels = 1;
  auto a = nn::make_model("resnet18", cfg);
  optim::Adam oa(a->parameters(), {.lr = 1e-3});
  Generator gen(5);
  Tensor x = Tensor::normal({2, 1, 32, 32}, 0.0, 1.0, gen);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{1, 2}, {2});
  backward(softmax_cross_entropy(a->forward(x), y));
  oa.step();
  fs::path p = temp_file("adam");
  save_checkpoint(p.string(), *a, &oa);
  cfg.seed = 7;
  auto b = nn::make_model("resnet18", cfg);
  optim::Adam ob(b->parameters(), {.lr = 1e-3});
  load_checkpoint(p.string(), *b, &ob);
  std::vector<Tensor> ba, bb;
  for (auto& [n, t] : a->named_buffers()) ba.push_back(t);
  for (auto& [n, t] : b->named_buffers()) bb.push_back(t);
  EXPECT_EQ(flat(ba), flat(bb));
  EXPECT_EQ(*ob.step_counts(), *oa.step_counts());
  fs::remove(p);
}

TEST(Checkpoint, AnotherModelIsRefusedAndLeftUntouched) {
  auto a = nn::make_model("cnn", {});
  fs::path p = temp_file("other");
  save_checkpoint(p.string(), *a, nullptr);
  nn::ModelConfig c;
  c.hidden = {16};
  auto m = nn::make_model("mlp", c);
  std::vector<float> before = flat(m->parameters());
  try {
    load_checkpoint(p.string(), *m, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(flat(m->parameters()), before);
  fs::remove(p);
}

TEST(Checkpoint, DamagedAndForeignFilesAreNamed) {
  auto a = nn::make_model("cnn", {});
  fs::path p = temp_file("damaged");
  save_checkpoint(p.string(), *a, nullptr);
  fs::resize_file(p, fs::file_size(p) / 2);
  auto b = nn::make_model("cnn", {});
  EXPECT_THROW(load_checkpoint(p.string(), *b, nullptr), Error);
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << "definitely not a checkpoint";
  }
  try {
    load_checkpoint(p.string(), *b, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a tandem checkpoint"), std::string::npos) << e.what();
  }
  fs::remove(p);
  EXPECT_THROW(load_checkpoint(p.string(), *b, nullptr), Error);
}
