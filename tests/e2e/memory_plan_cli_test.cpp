// The memory plan `tandem train` and `tandem bench train` print before the first step, against what the CPU
// allocator measures: bench train's RESULT carries both (planned_peak_bytes, peak_memory_bytes over the timed
// steps), train's last line both over the run. GPT and Llama at a few shapes, f32 on the CPU (the CPU computes
// in f32 only), recompute none, selective and full, one rank and two Gloo ranks under --shard parameters: each within 10%
// of the allocator's peak. A run whose plan does not fit stops before the model is built, with the table and the
// flags that would fit; --no-memory-check runs it all the same.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"
#include "text_util.h"

namespace fs = std::filesystem;
using tandem::test::contains;
using tandem::test::make_corpus;
using tandem::test::run_tandem;

namespace {

const std::string kBin = TANDEM_BIN;

using tandem::test::result_of;

// Two timed steps after two untimed ones (the first creates the optimizer's state; on two ranks the second lays
// the buckets out again in the order gradients arrived): the steady state's peak.
std::string bench(const std::string& flags) {
  return "bench train --steps 2 --warmup 2 --threads 1 " + flags;
}

// Checks a bench run's planned peak against its measured one; returns the ratio.
double planned_over_measured(const tandem::test::RunResult& r, const std::string& what) {
  EXPECT_EQ(r.status, 0) << what << "\n" << r.output;
  const nlohmann::json j = result_of(r.output);
  if (!j.is_object() || !j.contains("planned_peak_bytes") || !j.contains("peak_memory_bytes")) {
    ADD_FAILURE() << what << ": no planned and measured peaks in\n" << r.output;
    return 0.0;
  }
  const double planned = j["planned_peak_bytes"].get<double>(), measured = j["peak_memory_bytes"].get<double>();
  const double ratio = planned / measured;
  EXPECT_NEAR(ratio, 1.0, 0.10) << what << ": planned " << planned << " bytes (at "
                                << j["planned"].value("peak_at", std::string("?")) << "), measured " << measured;
  return ratio;
}

const char* kShapes[] = {
    "--model gpt --layers 2 --heads 4 --width 64 --context 64 --vocab 256 --batch-size 4",
    "--model gpt --layers 3 --heads 2 --width 48 --context 32 --vocab 512 --batch-size 8",
    "--model llama --layers 2 --heads 4 --kv-heads 2 --width 64 --mlp-hidden 176 --context 64 --vocab 256 --batch-size 4",
    "--model llama --layers 3 --heads 4 --kv-heads 4 --width 96 --mlp-hidden 256 --context 48 --vocab 300 "
    "--batch-size 2 --untied",
};

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_plan_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(MemoryPlanCli, BenchPlanMatchesTheAllocatorsPeakOnOneRank) {
  for (const char* shape : kShapes)
    for (const char* recompute : {"none", "selective", "full"}) {
      const std::string flags = std::string(shape) + " --recompute " + recompute;
      planned_over_measured(run_tandem(bench(flags)), flags);
    }
  // Dropout: a mask per residual branch (and the GPT's embeddings), the branches added to the stream apart.
  for (const char* shape : {kShapes[0], kShapes[2]}) {
    const std::string flags = std::string(shape) + " --dropout 0.1";
    planned_over_measured(run_tandem(bench(flags)), flags);
  }
  // The optimizer's state offloaded (on the CPU backend the host is the device: it stays in the count).
  for (const char* shape : {kShapes[0], kShapes[2]})
    for (const char* what : {"optimizer", "parameters"}) {
      const std::string flags = std::string(shape) + " --offload " + what;
      planned_over_measured(run_tandem(bench(flags)), flags);
    }
  // Gradient buckets smaller than a block: allocated one by one as backward reaches them.
  const std::string buckets = std::string(kShapes[2]) + " --bucket-mb 0.25 --first-bucket-mb 0.05";
  planned_over_measured(run_tandem(bench(buckets)), buckets);
}

TEST(MemoryPlanCli, BenchPlanMatchesTheAllocatorsPeakOnTwoRanksUnderShardParameters) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  for (const char* shape : {kShapes[0], kShapes[3]})
    for (const char* recompute : {"none", "full"}) {
      const std::string flags = std::string(shape) + " --shard parameters --recompute " + recompute;
      planned_over_measured(run_tandem("launch -n 2 -- " + kBin + " " + bench(flags)), "2 ranks: " + flags);
    }
  // Error feedback's residuals on two ranks: moved with their parameters when the buckets are laid out again,
  // the old arena freed (the plan holds one).
  const std::string flags = std::string(kShapes[1]) + " -d powerSGD";
  planned_over_measured(run_tandem("launch -n 2 -- " + kBin + " " + bench(flags)), "2 ranks: " + flags);
}

// train prints the table before its first line and the measured peak beside the planned one at the end: with
// validation (the evaluation's whole logits), a checkpoint and accumulated micro-batches.
TEST(MemoryPlanCli, TrainPrintsThePlanAndMeasuresItsPeak) {
  const fs::path dir = temp_dir("train"), corpus = make_corpus(dir);
  const std::regex line(R"(tandem: memory: peak ([0-9.]+ \w+) per rank measured, ([0-9.]+ \w+) planned \(([-+0-9.]+)%\))");
  const char* models[] = {"--model gpt --layers 2 --heads 4 --width 64",
                          "--model llama --layers 2 --heads 4 --kv-heads 2 --width 64 --mlp-hidden 176 --recompute full "
                          "--total-batch-tokens 512"};
  for (const std::string extra : models) {
    auto r = run_tandem("train " + extra + " --context 64 --data " + corpus.string() +
                        " --steps 3 --batch-size 4 --eval-every 2 --eval-steps 2 --threads 1 --checkpoint " +
                        (dir / "m.ck").string());
    ASSERT_EQ(r.status, 0) << r.output;
    const size_t table = r.output.find("tandem: memory per rank |"), first = r.output.find("step 0/3");
    EXPECT_NE(table, std::string::npos) << r.output;
    EXPECT_LT(table, first) << "the plan comes before the first step:\n" << r.output;
    EXPECT_TRUE(contains(r.output, "tandem: (planned)")) << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, line)) << r.output;
    EXPECT_LE(std::fabs(std::stod(m[3])), 10.0) << m[0];
    fs::remove(dir / "m.ck");
  }
  fs::remove_all(dir);
}

TEST(MemoryPlanCli, ARunThatDoesNotFitStopsBeforeAllocatingAndSaysWhatWould) {
  const fs::path dir = temp_dir("refuse"), corpus = make_corpus(dir);
  const std::string run = "train --model gpt --layers 2 --heads 4 --width 64 --context 64 --data " + corpus.string() +
                          " --steps 2 --batch-size 8 --eval-steps 0 --threads 1";
  // A device of 5.5 MiB: below what the step needs, above what recompute or a smaller micro-batch needs.
  auto limited = [&](const std::string& cmd) {
    const std::string full = "TANDEM_MEMORY_LIMIT_MIB=5.5 " + kBin + " " + cmd + " 2>&1";
    tandem::test::RunResult out;
    FILE* p = popen(full.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.output.append(buf, n);
    const int st = pclose(p);
    out.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
  };
  auto no = limited(run);
  EXPECT_NE(no.status, 0) << no.output;
  EXPECT_TRUE(contains(no.output, "tandem: memory per rank |")) << no.output;
  EXPECT_TRUE(contains(no.output, "tandem: error: the planned peak of ")) << no.output;
  EXPECT_TRUE(contains(no.output, "5.5 MiB available on cpu (TANDEM_MEMORY_LIMIT_MIB)")) << no.output;
  EXPECT_TRUE(contains(no.output, "planned to fit: --recompute full")) << no.output;
  EXPECT_TRUE(contains(no.output, "--batch-size 4 --total-batch-tokens 512")) << no.output;
  EXPECT_FALSE(contains(no.output, "parameters) on ")) << "the model was built:\n" << no.output;
  EXPECT_FALSE(contains(no.output, "step 1/2")) << no.output;
  // Each flag offered runs.
  for (const char* flags : {" --recompute full", " --batch-size 4 --total-batch-tokens 512"}) {
    auto yes = limited(run + flags);
    EXPECT_EQ(yes.status, 0) << flags << "\n" << yes.output;
    EXPECT_TRUE(contains(yes.output, "step 2/2")) << yes.output;
  }
  // --no-memory-check runs it all the same, and says so.
  auto forced = limited(run + " --no-memory-check");
  EXPECT_EQ(forced.status, 0) << forced.output;
  EXPECT_TRUE(contains(forced.output, "--no-memory-check runs it all the same")) << forced.output;
  EXPECT_TRUE(contains(forced.output, "step 2/2")) << forced.output;
  // bench train refuses a model that does not fit without building it (llama-8b: about 120 GiB in f32), offers
  // only what fits, and --plan-only reports the plan in its RESULT.
  auto big = limited("bench train --model llama --llama-config llama-8b --batch-size 1 --threads 1");
  EXPECT_EQ(big.status, 2) << big.output;
  EXPECT_TRUE(contains(big.output, "tandem: error: the planned peak of ")) << big.output;
  EXPECT_TRUE(contains(big.output, "builds the model whole")) << big.output;
  auto plan = limited("bench train --model llama --llama-config llama-8b --batch-size 1 --plan-only");
  EXPECT_EQ(plan.status, 0) << plan.output;
  const nlohmann::json j = result_of(plan.output);
  ASSERT_TRUE(j.is_object()) << plan.output;
  EXPECT_FALSE(j.value("fits", true));
  EXPECT_GT(j.value("planned_peak_bytes", int64_t(0)), int64_t(100) << 30);
  EXPECT_EQ(j.value("parameters", int64_t(0)), int64_t(8030261248));
  fs::remove_all(dir);
}
