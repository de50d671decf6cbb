// The distributed optimizer across processes. Each test starts distopt_worker ranks through
// `tandem launch`; every rank checks its own results against expectations computed from the rank
// numbers and reports "rank R: SCENARIO ok". CPU ranks talk over Gloo; the GPU variants (NCCL, one
// GPU per rank) skip unless the machine has two GPUs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "process_util.h"
#include "tandem/device.h"
#include "text_util.h"

using tandem::test::ProcResult;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;
const std::string kWorker = TANDEM_DISTOPT_WORKER;

using tandem::test::contains;

#define REQUIRE_GLOO()                                                             \
  do {                                                                             \
    if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo"; \
  } while (0)

#define REQUIRE_TWO_GPUS()                                                                             \
  do {                                                                                                 \
    if (!TANDEM_TEST_WITH_NCCL) GTEST_SKIP() << "tandem was built without NCCL";                       \
    if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";                               \
    if (tandem::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA GPUs (one per rank)";           \
  } while (0)

// Runs the scenarios (comma-separated) on n ranks and expects each to be reported ok by every rank.
ProcResult run_scenarios(int n, const std::string& scenarios, const std::string& device = "cpu") {
  ProcResult r = run_process({kTandem, "launch", "-n", std::to_string(n), "--", kWorker, scenarios, "--device", device,
                              "--timeout", "60"},
                             {}, 180);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  size_t start = 0;
  while (start <= scenarios.size()) {
    size_t comma = scenarios.find(',', start);
    std::string s = scenarios.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    for (int k = 0; k < n; ++k)
      EXPECT_TRUE(contains(r.output, "rank " + std::to_string(k) + ": " + s + " ok"))
          << "rank " << k << " did not report " << s << " ok:\n" << r.output;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return r;
}

// ---- CPU ranks over Gloo

TEST(DistOptGloo, KnownGradientsTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "plain,half,topk,threshold,layout");
}

TEST(DistOptGloo, KnownGradientsThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "plain,half,topk,threshold,layout");
}

TEST(DistOptGloo, ErrorFeedbackAndPartialUpdateTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "feedback,partial");
}

TEST(DistOptGloo, ErrorFeedbackAndPartialUpdateThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "feedback,partial");
}

// A parameter no rank used in a step is left alone (no momentum, no weight decay), as the plain optimizer
// and PyTorch DDP leave it; one that any rank used is stepped on every rank.
TEST(DistOptGloo, ParametersNoRankUsedAreLeftAlone) {
  run_scenarios(1, "unused");
  REQUIRE_GLOO();
  run_scenarios(2, "unused");
  run_scenarios(3, "unused");
}

TEST(DistOptGloo, TwoRanksMatchOneRankWithTheWholeBatch) {
  REQUIRE_GLOO();
  run_scenarios(2, "equivalence");
}

TEST(DistOptGloo, BucketsLaunchDuringBackwardInOrder) {
  REQUIRE_GLOO();
  ProcResult r = run_scenarios(2, "overlap");
  EXPECT_TRUE(contains(r.output, "rank 0: trace of a plain step: launch 0;")) << r.output;
}

TEST(DistOptGloo, SyncAndConsistencyChecksTwoRanks) {
  REQUIRE_GLOO();
  ProcResult r = run_scenarios(2, "sync");
  EXPECT_LT(r.seconds, 60.0) << "a mismatch must fail at once, not wait for a timeout";
}

TEST(DistOptGloo, SyncAndConsistencyChecksThreeRanks) {
  REQUIRE_GLOO();
  ProcResult r = run_scenarios(3, "sync");
  // Rank 2's model matches rank 0's, yet it fails too, hearing that rank 1 differs.
  EXPECT_TRUE(contains(r.output, "[rank 2] rank 2: another shape on rank 1: ranks built different models")) << r.output;
}

TEST(DistOptGloo, GradientsAfterAStepAreTheAverageAndSettingsApplyPerCall) {
  REQUIRE_GLOO();
  run_scenarios(2, "grads,clipswitch");
}

TEST(DistOptGloo, ClipGradNormAndAccumulationTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "clipnorm,accumulate");
}

TEST(DistOptGloo, ClipGradNormAndAccumulationThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "clipnorm,accumulate");
}

TEST(DistOptGloo, SyncBatchNormTwoRanksMatchesOneRankAtTwiceTheBatch) {
  REQUIRE_GLOO();
  run_scenarios(2, "syncbn");
}

TEST(DistOptGloo, SyncBatchNormThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "syncbn");
}

TEST(DistOptGloo, PowerSgdReproducesLowRankGradientsTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "powersgd");
}

TEST(DistOptGloo, PowerSgdReproducesLowRankGradientsThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "powersgd");
}

TEST(DistOptGloo, ReducerSeamsTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "introspection,nonfinite,arena16");
}

// f16's loss scaling: an overflow on one rank makes every rank skip the same step.
TEST(DistOptGloo, LossScalingSkipsTheSameStepOnEveryRank) {
  REQUIRE_GLOO();
  run_scenarios(2, "lossscale");
}

// One overflowing step costs one skipped step under every method that carries state between steps, and
// error-feedback residuals survive changes of the loss scale.
TEST(DistOptGloo, NonFiniteStepsAndLossScaleChangesLeaveCarriedStateIntactTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "carried,scaledfeedback");
}

TEST(DistOptGloo, NonFiniteStepsAndLossScaleChangesLeaveCarriedStateIntactThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "carried,scaledfeedback");
}

// update() twice after one backward_and_sync, and a loss that reaches no parameter, refused on every rank.
TEST(DistOptGloo, MisusedStepsAreRefusedTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "misuse");
}

TEST(DistOptGloo, ReducerSeamsThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "introspection,nonfinite,arena16");
}

TEST(DistOptGloo, ShardedStateMatchesTheUnshardedRunTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "shardequal");
}

TEST(DistOptGloo, ShardedStateMatchesTheUnshardedRunThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "shardequal");
}

TEST(DistOptGloo, ClippingInTheShardedStepAndWeightCopiesTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "shardfold");
}

TEST(DistOptGloo, ClippingInTheShardedStepAndWeightCopiesThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "shardfold");
}

TEST(DistOptGloo, OverlappedGathersMatchTheStagesWithoutTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "shardoverlap");
}

TEST(DistOptGloo, OverlappedGathersMatchTheStagesWithoutThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "shardoverlap");
}

TEST(DistOptGloo, MasterWeightsUnderEveryStageTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "shardmasters");
}

TEST(DistOptGloo, MasterWeightsUnderEveryStageThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "shardmasters");
}

TEST(DistOptGloo, ShardedParametersMatchTheUnshardedRunTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "shard3,shard3memory");
}

TEST(DistOptGloo, ShardedParametersMatchTheUnshardedRunThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "shard3,shard3memory");
}

TEST(DistOptGloo, ShardedMemoryTrafficAndRefusalsTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "shardmemory,shardtraffic,shardrefusals");
}

TEST(DistOptGloo, ShardedMemoryTrafficAndRefusalsThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "shardmemory,shardtraffic,shardrefusals");
}

TEST(DistOptGloo, FrozenParametersAreSyncedAndComparedTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "frozensync");
}

TEST(DistOptGloo, FrozenParametersAreSyncedAndComparedThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "frozensync");
}

TEST(DistOptGloo, ShardedSlicesFollowNewParameterGroupsTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "shardregroup");
}

TEST(DistOptGloo, ShardedSlicesFollowNewParameterGroupsThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "shardregroup");
}

TEST(DistOptGloo, UnevenInputsAverageOverTheRanksThatHaveDataTwoRanks) {
  REQUIRE_GLOO();
  run_scenarios(2, "uneven");
}

TEST(DistOptGloo, UnevenInputsAverageOverTheRanksThatHaveDataThreeRanks) {
  REQUIRE_GLOO();
  run_scenarios(3, "uneven");
}

// Checkpoints saved on 3 ranks load on 2 and on 1, and one saved on 2 loads on 3, under every
// --shard (each saved under every --shard): the whole state is found again, bit for bit, and the run
// continues as an unsharded run of the new size from the same state.
TEST(DistOptGloo, CheckpointsReshardToAnotherNumberOfRanks) {
  REQUIRE_GLOO();
  const std::string base = ::testing::TempDir() + "tandem_reshard_" + std::to_string(getpid());
  auto job = [&](int n, const std::string& scenario, const std::string& dir, int from) {
    std::map<std::string, std::string> env = {{"TANDEM_TEST_CKPT_DIR", dir}};
    if (from > 0) env["TANDEM_TEST_CKPT_FROM"] = std::to_string(from);
    std::vector<std::string> argv = {kWorker, scenario, "--timeout", "60"};
    if (n > 1) argv.insert(argv.begin(), {kTandem, "launch", "-n", std::to_string(n), "--"});
    ProcResult r = run_process(argv, env, 180);
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.exit_code, 0) << n << " ranks, " << scenario << " in " << dir << ":\n" << r.output;
    for (int k = 0; k < n; ++k)
      EXPECT_TRUE(contains(r.output, "rank " + std::to_string(k) + ": " + scenario + " ok")) << r.output;
    return r;
  };
  for (int saved : {3, 2}) {
    const std::string dir = base + "_" + std::to_string(saved);
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
    job(saved, "reshardsave", dir, 0);
  }
  ProcResult on_two = job(2, "reshardload", base + "_3", 3);
  EXPECT_TRUE(contains(on_two.output, "is their average on each of the 2 ranks now")) << on_two.output;
  job(1, "reshardload", base + "_3", 3);
  job(3, "reshardload", base + "_2", 2);
  for (int saved : {3, 2}) std::filesystem::remove_all(base + "_" + std::to_string(saved));
}

// One process: the same API with nothing to exchange.
TEST(DistOptSingle, OneProcessStepsLocally) {
  const std::vector<std::string> names = {"plain", "half", "equivalence", "grads", "clipswitch", "introspection",
                                          "nonfinite", "arena16", "clipnorm", "accumulate", "syncbn", "lossscale",
                                          "carried", "scaledfeedback", "misuse", "shardequal", "shardmemory",
                                          "shardtraffic", "shardrefusals", "uneven", "shard3", "shard3memory", "shardfold", "shardoverlap",
                                          "shardmasters"};
  std::string list;
  for (const std::string& s : names) list += (list.empty() ? "" : ",") + s;
  ProcResult r = run_process({kWorker, list}, {}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const std::string& s : names)
    EXPECT_TRUE(contains(r.output, std::string("rank 0: ") + s + " ok")) << r.output;
}

// ---- GPU ranks over NCCL (one GPU each)

TEST(DistOptNccl, KnownGradientsTwoGpus) {
  REQUIRE_TWO_GPUS();
  run_scenarios(2, "plain,half,topk,threshold,layout", "cuda");
}

TEST(DistOptNccl, ErrorFeedbackAndPartialUpdateTwoGpus) {
  REQUIRE_TWO_GPUS();
  run_scenarios(2, "feedback,partial", "cuda");
}

TEST(DistOptNccl, TwoGpusMatchOneGpuWithTheWholeBatch) {
  REQUIRE_TWO_GPUS();
  run_scenarios(2, "equivalence", "cuda");
}

TEST(DistOptNccl, BucketsLaunchDuringBackwardInOrder) {
  REQUIRE_TWO_GPUS();
  run_scenarios(2, "overlap", "cuda");
}

TEST(DistOptNccl, StepApiCodecsSyncBatchNormAndSeams) {
  REQUIRE_TWO_GPUS();
  run_scenarios(2,
                "grads,clipswitch,clipnorm,accumulate,syncbn,powersgd,introspection,nonfinite,arena16,lossscale,carried,"
                "scaledfeedback,shardequal,shardmemory,shardtraffic,shardrefusals,uneven,shard3,shard3memory,shardfold,shardoverlap,shardmasters",
                "cuda");
}

TEST(DistOptNccl, SyncAndConsistencyChecks) {
  REQUIRE_TWO_GPUS();
  run_scenarios(2, "sync", "cuda");
}

}  // namespace
