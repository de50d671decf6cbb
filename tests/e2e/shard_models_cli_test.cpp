// --shard parameters (ZeRO stage 3) for every model tandem ships, from the command line: each is built of
// layer groups (a layer, a residual block, a transformer block, the embeddings and the head), the GPT's token
// table a parameter of two groups (the embeddings and the tied head). On 2 and 3 Gloo ranks, stage 3 trains
// as the other stages do.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"

namespace fs = std::filesystem;
using tandem::test::make_corpus;
using tandem::test::run_tandem;
using tandem::test::step_losses;
using tandem::test::tensors_of;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_shard3_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const std::string kBin = TANDEM_BIN;

// The largest difference between the parameters of two checkpoints, relative to the largest value.
double relative_difference(const std::string& a, const std::string& b) {
  auto ta = tensors_of(a), tb = tensors_of(b);
  double diff = 0, scale = 0;
  int params = 0;
  for (auto& [name, t] : ta) {
    if (name.rfind("param/", 0) != 0) continue;
    ++params;
    auto it = tb.find(name);
    EXPECT_NE(it, tb.end()) << name;
    if (it == tb.end()) return INFINITY;
    const std::vector<float> x = t.to_vector<float>(), y = it->second.to_vector<float>();
    EXPECT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      diff = std::max(diff, std::fabs(double(x[i]) - y[i]));
      scale = std::max(scale, std::fabs(double(y[i])));
    }
  }
  EXPECT_GT(params, 0) << a;
  return diff / std::max(scale, 1e-30);
}

// "Training loss = L" of each epoch.
std::vector<double> epoch_losses(const std::string& out) {
  std::vector<double> v;
  std::regex re(R"(Training loss = ([0-9.eE+-]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

}  // namespace

// A GPT whose token table is also its output layer: under --shard parameters the table is gathered for the
// embeddings and again for the head, forward and backward, and freed when neither holds it. On 2 ranks the
// run is the bits of --shard none's (the same sums in the same order); on 3 within float rounding. Stage 3 sends
// more than the others (each group gathered for forward and again for backward), as --report-comm shows.
TEST(ShardModelsCli, ATiedGptTrainsUnderShardParametersAsUnsharded) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("gpt"), corpus = make_corpus(dir);
  const std::string run = "train --model gpt --gpt-config char --layers 2 --heads 2 --width 32 --context 32 "
                          "--dropout 0 --data " + corpus.string() + " --steps 6 --batch-size 2 --lr 3e-3 --warmup 2 "
                          "--clip-norm 0 --eval-every 0 --eval-steps 2 --threads 1 --timeout 60 --report-comm ";
  for (int ranks : {2, 3}) {
    std::map<std::string, tandem::test::RunResult> out;
    for (const std::string shard : {"none", "optimizer", "gradients", "parameters"}) {
      const std::string ck = (dir / (shard + std::to_string(ranks) + ".ck")).string();
      out[shard] = run_tandem("launch -n " + std::to_string(ranks) + " -- " + kBin + " " + run + "--shard " + shard +
                              " --checkpoint " + ck);
      ASSERT_EQ(out[shard].status, 0) << shard << "\n" << out[shard].output;
      EXPECT_EQ(step_losses(out[shard].output).size(), 6u) << out[shard].output;
    }
    const std::string none = (dir / ("none" + std::to_string(ranks) + ".ck")).string();
    for (const std::string shard : {"optimizer", "gradients", "parameters"}) {
      const std::string ck = (dir / (shard + std::to_string(ranks) + ".ck")).string();
      const double rel = relative_difference(ck, none);
      EXPECT_LT(rel, 1e-5) << "--shard " << shard << " on " << ranks << " ranks";
      const auto la = step_losses(out[shard].output), lb = step_losses(out["none"].output);
      for (auto& [step, loss] : lb) EXPECT_NEAR(la.at(step), loss, 1e-4) << "--shard " << shard << ", step " << step;
    }
    if (ranks == 2) tandem::test::expect_same_tensors((dir / "parameters2.ck").string(), none, "--shard parameters");
  }
  fs::remove_all(dir);
}

// The image models and the bigram: 2 ranks, --shard parameters against --shard gradients.
TEST(ShardModelsCli, EveryModelTrainsUnderShardParameters) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("models");
  if (tandem::test::have_fashion_mnist()) {
    for (const std::string model : {"mlp", "cnn", "resnet18"}) {
      const std::string run = "launch -n 2 -- " + kBin + " train --model " + model + " --epochs 1 --limit-train " +
                              (model == "resnet18" ? "64" : "256") + " --limit-test 64 --batch-size 32 --lr 0.01 "
                              "--momentum 0.9 --threads 1 --progress off --timeout 120 --shard ";
      auto g = run_tandem(run + "gradients");
      auto p = run_tandem(run + "parameters");
      ASSERT_EQ(g.status, 0) << g.output;
      ASSERT_EQ(p.status, 0) << p.output;
      const auto lg = epoch_losses(g.output), lp = epoch_losses(p.output);
      ASSERT_EQ(lp.size(), 1u) << p.output;
      ASSERT_EQ(lg.size(), 1u) << g.output;
      EXPECT_NEAR(lp[0], lg[0], 1e-4 * std::fabs(lg[0])) << model;
    }
  }
  const fs::path corpus = make_corpus(dir);
  const std::string run = "launch -n 2 -- " + kBin + " train --model bigram --data " + corpus.string() +
                          " --steps 4 --context 16 --batch-size 2 --lr 0.05 --eval-every 0 --eval-steps 1 --threads 1 "
                          "--timeout 60 --shard ";
  auto g = run_tandem(run + "gradients");
  auto p = run_tandem(run + "parameters");
  ASSERT_EQ(g.status, 0) << g.output;
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_EQ(step_losses(p.output), step_losses(g.output));
  fs::remove_all(dir);
}
