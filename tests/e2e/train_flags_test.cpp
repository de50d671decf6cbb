// `tandem train`'s distributed-training flags end to end on two CPU ranks, and the version source.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"

using tandem::test::run_tandem;

namespace {

// The version CMake's project() declares, read from the top-level CMakeLists.txt.
std::string project_version() {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/CMakeLists.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::smatch m;
  std::string text = ss.str();
  return std::regex_search(text, m, std::regex(R"(project\(tandem VERSION ([0-9.]+))")) ? m.str(1) : "";
}

}  // namespace

TEST(Version, OneSourceForEveryPlaceThatPrintsIt) {
  std::string v = project_version();
  ASSERT_FALSE(v.empty()) << "no project(tandem VERSION ...) in CMakeLists.txt";
  auto flag = run_tandem("--version");
  EXPECT_EQ(flag.status, 0) << flag.output;
  EXPECT_EQ(flag.output, "tandem " + v + "\n");
  auto info = run_tandem("info");
  EXPECT_EQ(info.status, 0) << info.output;
  EXPECT_EQ(info.output.rfind("tandem " + v + "\n", 0), 0u) << info.output;
}

namespace {

using tandem::test::have_fashion_mnist;

#define REQUIRE_TWO_CPU_RANKS()                                                                          \
  do {                                                                                                   \
    if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)"; \
    if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";                         \
  } while (0)

// One short epoch on two CPU ranks with the given extra flags; returns rank 0's output.
std::string two_rank_run(const std::string& flags) {
  auto r = run_tandem("launch -n 2 -- " + std::string(TANDEM_BIN) +
                      " train --epochs 1 --limit-train 1024 --limit-test 256 --threads 1 --progress off " + flags);
  EXPECT_EQ(r.status, 0) << flags << "\n" << r.output;
  return r.output;
}

// The run's training line ("Training loss = L, training accuracy = A").
std::string two_rank_training_line(const std::string& flags) {
  std::string out = two_rank_run("--batch-size 32 " + flags);
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(Training loss = [0-9.]+, training accuracy = [0-9.]+)"))) {
    ADD_FAILURE() << "no training line for " << flags << ":\n" << out;
    return "";
  }
  return m.str(0);
}

// The figures a run reports: training loss, training accuracy, evaluation accuracy.
std::array<double, 3> two_rank_figures(const std::string& flags) {
  std::string out = two_rank_run(flags);
  std::smatch t, e;
  bool ok = std::regex_search(out, t, std::regex(R"(Training loss = ([0-9.]+), training accuracy = ([0-9.]+))")) &&
            std::regex_search(out, e, std::regex(R"(Evaluation accuracy = ([0-9.]+))"));
  if (!ok) {
    ADD_FAILURE() << "no figures for " << flags << ":\n" << out;
    return {-1, -1, -1};
  }
  return {std::stod(t.str(1)), std::stod(t.str(2)), std::stod(e.str(1))};
}

}  // namespace

// Every -d method trains from the command line on two ranks, reporting its name.
TEST(TrainFlags, EveryMethodRuns) {
  REQUIRE_TWO_CPU_RANKS();
  for (const char* method : {"plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold", "powerSGD"}) {
    auto r = run_tandem("launch -n 2 -- " + std::string(TANDEM_BIN) + " train -d " + method +
                        " --epochs 1 --limit-train 256 --limit-test 64 --batch-size 32 --threads 1 --progress off");
    EXPECT_EQ(r.status, 0) << method << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string("2 ranks (gloo, ") + method + ")"), std::string::npos) << r.output;
    EXPECT_EQ(tandem::test::count_lines_with(r.output, "Evaluation accuracy"), 1) << r.output;
  }
}

// Sharded state trains the run the unsharded one trains (two ranks add their gradients in either order
// alike, and SGD steps each slice as it would its whole parameter), and the start-up line says what
// each rank keeps: SGD's momentum, and under --shard gradients the gradients too, split over the ranks.
TEST(TrainFlags, ShardedStateTrainsTheSameRunAndSaysWhatEachRankKeeps) {
  REQUIRE_TWO_CPU_RANKS();
  std::string none_line;
  double none_params = 0;
  for (const char* shard : {"none", "optimizer", "gradients", "parameters"}) {
    std::string out = two_rank_run(std::string("--model mlp --batch-size 32 --shard ") + shard);
    std::smatch t, m;
    ASSERT_TRUE(std::regex_search(out, t, std::regex(R"(Training loss = [0-9.]+, training accuracy = [0-9.]+)"))) << out;
    if (none_line.empty()) none_line = t.str(0);
    EXPECT_EQ(t.str(0), none_line) << "--shard " << shard;
    ASSERT_TRUE(std::regex_search(out, m, std::regex(std::string(R"(model state per rank \(--shard )") + shard +
                                                     R"(\): parameters ([0-9.]+) MB, gradients ([0-9.]+) MB, )"
                                                     R"(optimizer state ([0-9.]+) MB, master weights 0.0 kB)")))
        << out;
    const double params = std::stod(m.str(1)), grads = std::stod(m.str(2)), state = std::stod(m.str(3));
    if (none_params == 0) none_params = params;
    const std::string s = shard;
    const bool shards_params = s == "parameters", shards_grads = s == "gradients" || shards_params,
               shards_state = s != "none";
    EXPECT_NEAR(params, shards_params ? none_params / 2 : none_params, 0.1) << out;
    EXPECT_NEAR(grads, shards_grads ? none_params / 2 : none_params, 0.1) << out;
    EXPECT_NEAR(state, shards_state ? none_params / 2 : none_params, 0.1) << out;
    if (std::string(shard) != "none") {
      EXPECT_NE(out.find(std::string("shard ") + shard + ")"), std::string::npos) << out;
    }
  }
  auto refused = run_tandem("launch -n 2 -- " + std::string(TANDEM_BIN) +
                            " train --epochs 1 --limit-train 256 --limit-test 64 --threads 1 --progress off "
                            "--shard optimizer -d sparseTopK");
  EXPECT_NE(refused.status, 0) << refused.output;
  EXPECT_NE(refused.output.find("-d sparseTopK cannot be combined with --shard optimizer"), std::string::npos)
      << refused.output;
}

// --clip bounds each gradient value before the half-precision average: a bound below the gradients'
// size changes the run, one above all of them leaves it exactly as it was.
TEST(TrainFlags, ClipBoundsTheHalfGradients) {
  REQUIRE_TWO_CPU_RANKS();
  std::string none = two_rank_training_line("-d half");
  EXPECT_NE(two_rank_training_line("-d half --clip 0.0001"), none);
  EXPECT_EQ(two_rank_training_line("-d half --clip 1000000"), none);
  auto plain = run_tandem("train -d plain --clip 1 --epochs 1 --limit-train 64 --limit-test 64");
  EXPECT_EQ(plain.status, 2) << plain.output;
  EXPECT_NE(plain.output.find("--clip"), std::string::npos) << plain.output;
}

// --clip-norm scales the averaged gradients down to a global norm: far above the gradients' norm
// it changes nothing, far below it slows training down to almost nothing.
TEST(TrainFlags, ClipNormBoundsTheAveragedGradients) {
  REQUIRE_TWO_CPU_RANKS();
  std::string none = two_rank_training_line("");
  EXPECT_EQ(two_rank_training_line("--clip-norm 1e9"), none);
  EXPECT_NE(two_rank_training_line("--clip-norm 1e-6"), none);
}

// --accumulate 2 at batch 32 takes the same steps over the same samples as batch 64: the same
// figures within f32 rounding. (Were the flag ignored, 32 steps of batch 32 would report a loss
// summed over twice as many batches.)
TEST(TrainFlags, AccumulatingTwoBatchesOf32IsOneBatchOf64) {
  REQUIRE_TWO_CPU_RANKS();
  std::array<double, 3> whole = two_rank_figures("--batch-size 64"),
                        halves = two_rank_figures("--batch-size 32 --accumulate 2");
  EXPECT_NEAR(halves[0], whole[0], 1e-4 * whole[0]) << "training loss";
  EXPECT_NEAR(halves[1], whole[1], 1.5 / 1024) << "training accuracy: at most a sample apart";
  EXPECT_NEAR(halves[2], whole[2], 1.5 / 256) << "evaluation accuracy: at most a sample apart";
}

// --sync-bn on a ResNet: the batch statistics are reduced over both ranks in every forward (and
// their gradients in backward); the replicas stay identical step by step. Models without batch
// norm refuse the flag.
TEST(TrainFlags, SyncBatchNormOnAResNet) {
  REQUIRE_TWO_CPU_RANKS();
  auto r = run_tandem("launch -n 2 -- " + std::string(TANDEM_BIN) +
                      " train --model resnet18 --sync-bn --epochs 1 --limit-train 64 --limit-test 32 --batch-size 16 "
                      "--threads 1 --check-consistency 1 --progress off");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(tandem::test::count_lines_with(r.output, "Evaluation accuracy"), 1) << r.output;
  auto cnn = run_tandem("train --model cnn --sync-bn --epochs 1 --limit-train 64 --limit-test 64");
  EXPECT_EQ(cnn.status, 2) << cnn.output;
  EXPECT_NE(cnn.output.find("--sync-bn"), std::string::npos) << cnn.output;
}

// --recompute full on a ResNet: each residual block runs again in backward, and the run ends in the same
// parameters and batch-norm running statistics, bit for bit: on one rank, and on two with --sync-bn (whose
// statistics are reduced again in the second run) under --shard parameters. Models without blocks, and
// selective (the transformer blocks'), are refused.
TEST(TrainFlags, RecomputeOnAResNetEndsWhereTheRunWithoutEnds) {
  REQUIRE_TWO_CPU_RANKS();
  const std::string dir = ::testing::TempDir() + "tandem_resnet_recompute_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string one = "train --model resnet18 --epochs 1 --limit-train 48 --limit-test 16 --batch-size 16 "
                          "--threads 1 --progress off --checkpoint " + dir + "/";
  for (const char* policy : {"none", "full"}) {
    auto r = run_tandem(one + "one_" + policy + ".ck --recompute " + policy);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  tandem::test::expect_same_tensors(dir + "/one_full.ck", dir + "/one_none.ck", "--recompute full, one rank");
  const std::string two = "launch -n 2 -- " + std::string(TANDEM_BIN) +
                          " train --model resnet18 --sync-bn --shard parameters --epochs 1 --limit-train 64 "
                          "--limit-test 16 --batch-size 16 --threads 1 --progress off --checkpoint " + dir + "/";
  for (const char* policy : {"none", "full"}) {
    auto r = run_tandem(two + "two_" + policy + ".ck --recompute " + policy);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  tandem::test::expect_same_tensors(dir + "/two_full.ck", dir + "/two_none.ck", "--recompute full, 2 ranks");
  auto cnn = run_tandem("train --model cnn --recompute full --epochs 1 --limit-train 64 --limit-test 64");
  EXPECT_EQ(cnn.status, 2) << cnn.output;
  EXPECT_NE(cnn.output.find("it takes --model gpt, llama or a resnet"), std::string::npos) << cnn.output;
  auto selective = run_tandem("train --model resnet18 --recompute selective --epochs 1 --limit-train 16 "
                              "--limit-test 16");
  EXPECT_EQ(selective.status, 2) << selective.output;
  EXPECT_NE(selective.output.find("a ResNet takes none or full"), std::string::npos) << selective.output;
  std::filesystem::remove_all(dir);
}

// -d powerSGD --rank R: a fraction of plain's bytes per step; --rank belongs to powerSGD only.
TEST(TrainFlags, PowerSgdSendsFarFewerBytes) {
  REQUIRE_TWO_CPU_RANKS();
  auto bytes = [](const std::string& out) {
    std::smatch m;
    return std::regex_search(out, m, std::regex(R"(Communication \(rank 0\): ([0-9.]+) MB sent)")) ? std::stod(m.str(1))
                                                                                                   : -1.0;
  };
  std::string plain = two_rank_run("--report-comm"), low = two_rank_run("-d powerSGD --rank 4 --report-comm");
  EXPECT_NE(low.find("2 ranks (gloo, powerSGD)"), std::string::npos) << low;
  ASSERT_GT(bytes(low), 0.0) << low;
  EXPECT_GE(bytes(plain) / bytes(low), 10.0) << plain << low;
  auto misplaced = run_tandem("train -d plain --rank 4 --epochs 1 --limit-train 64 --limit-test 64");
  EXPECT_EQ(misplaced.status, 2) << misplaced.output;
  EXPECT_NE(misplaced.output.find("--rank"), std::string::npos) << misplaced.output;
}

// Every floating-point flag of train, bench train and launch refuses NaN, the infinities and values
// below its range with an input error that names the flag and the value; NaN used to pass the range
// check and then read as "off" (--clip-norm nan trained without clipping).
TEST(TrainFlags, NonFiniteAndNegativeNumbersAreInputErrors) {
  const std::string small = " --epochs 1 --limit-train 64 --limit-test 64 --threads 1 --progress off";
  const std::string bench = " --steps 1 --warmup 0 --device cpu --threads 1";
  struct Case {
    std::string command, flag, rest;
  };
  std::vector<Case> cases;
  for (const char* flag : {"--clip-norm", "--clip", "--lr", "--momentum", "--weight-decay", "--spars", "--bucket-mb",
                           "--first-bucket-mb", "--timeout"})
    cases.push_back({"train", flag, small});
  for (const char* flag : {"--clip", "--spars", "--bucket-mb", "--first-bucket-mb"})
    cases.push_back({"bench train", flag, bench});
  cases.push_back({"launch -n 1", "--timeout", " -- true"});
  for (const Case& c : cases)
    for (const char* value : {"nan", "NaN", "inf", "-inf", "-1"}) {
      const std::string args = c.command + " " + c.flag + "=" + value + c.rest;
      auto r = run_tandem(args);
      EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
      EXPECT_NE(r.output.find(c.flag), std::string::npos) << args << "\n" << r.output;
      EXPECT_NE(r.output.find(value), std::string::npos) << args << "\n" << r.output;
      const bool finite = std::string(value) == "-1";
      EXPECT_NE(r.output.find(finite ? "is outside [" : "is not a finite number"), std::string::npos)
          << args << "\n" << r.output;
    }
}
