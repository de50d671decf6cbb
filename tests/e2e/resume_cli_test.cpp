// Resuming `tandem train` on several ranks: the run ends where the uninterrupted one ends for every -d
// option (each rank's own state is saved beside the checkpoint), the ranks agree on what they resume
// from, and a checkpoint is not resumed under another -d option.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"
#include "tandem/checkpoint.h"
#include "text_util.h"

namespace fs = std::filesystem;
using tandem::test::count_lines_with;
using tandem::test::expect_same_checkpoints;
using tandem::test::expect_same_tensors;
using tandem::test::have_fashion_mnist;
using tandem::test::run_tandem;
using tandem::test::tensors_of;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_resume_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const std::string kBin = TANDEM_BIN;
const std::string kTrain = " train --model cnn --limit-train 512 --limit-test 64 --batch-size 32 --threads 1 --seed 4 "
                           "--progress off --timeout 60";

std::string launch2(const std::string& args) { return "launch -n 2 -- " + kBin + kTrain + " " + args; }

using tandem::test::contains;

}  // namespace

// Two epochs in one go and one epoch, then a resumed second, end in the same bits for every -d option:
// the model, the optimizer and each rank's own state (residuals, PowerSGD's Q, partialUpdate's
// position and rank-local momentum, the bucket layout).
TEST(ResumeCli, EveryDistOptionResumesWhereTheUninterruptedRunEnds) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  fs::path dir = temp_dir("every");
  // Small buckets, so that partialUpdate cycles through several chunks and the codecs see several buckets.
  for (const char* method : {"plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold", "powerSGD"}) {
    SCOPED_TRACE(method);
    const std::string opts = std::string("-d ") + method + " --bucket-mb 0.05 --first-bucket-mb 0.01" +
                             (std::string(method) == "sparseThreshold" ? " --spars 0.01" : "");
    const std::string whole = (dir / (std::string(method) + "_whole.ck")).string();
    const std::string parted = (dir / (std::string(method) + "_parted.ck")).string();
    auto a = run_tandem(launch2(opts + " --epochs 2 --checkpoint " + whole));
    ASSERT_EQ(a.status, 0) << a.output;
    auto b1 = run_tandem(launch2(opts + " --epochs 1 --checkpoint " + parted));
    ASSERT_EQ(b1.status, 0) << b1.output;
    auto b2 = run_tandem(launch2(opts + " --epochs 2 --resume --checkpoint " + parted));
    ASSERT_EQ(b2.status, 0) << b2.output;
    EXPECT_EQ(count_lines_with(b2.output, "Starting Epoch"), 1) << b2.output;
    EXPECT_FALSE(contains(b2.output, "start afresh")) << b2.output;
    expect_same_checkpoints(whole, parted, 2);
  }
  fs::remove_all(dir);
}

// A rank whose own state file is gone, or a resume on another number of ranks, starts that state afresh
// and says so; training goes on.
TEST(ResumeCli, StateThatCannotBeLoadedStartsAfreshAndIsNamed) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  fs::path dir = temp_dir("afresh");
  const std::string ck = (dir / "ck").string();
  auto first = run_tandem(launch2("-d sparseTopK --epochs 1 --checkpoint " + ck));
  ASSERT_EQ(first.status, 0) << first.output;
  fs::remove(ck + ".rank1");
  auto missing = run_tandem(launch2("-d sparseTopK --epochs 2 --resume --checkpoint " + ck));
  ASSERT_EQ(missing.status, 0) << missing.output;
  EXPECT_TRUE(contains(missing.output, "rank 1: the error-feedback residuals start afresh")) << missing.output;
  EXPECT_TRUE(contains(missing.output, ck + ".rank1")) << missing.output;
  EXPECT_FALSE(contains(missing.output, "rank 0: the error-feedback residuals start afresh")) << missing.output;
  auto one = run_tandem(kTrain.substr(1) + " -d sparseTopK --epochs 3 --resume --checkpoint " + ck);
  ASSERT_EQ(one.status, 0) << one.output;
  // On another number of ranks the residuals are re-cut, not dropped: the saved ranks' average.
  EXPECT_TRUE(contains(one.output, "rank 0: the state each of the 2 saved ranks kept for itself")) << one.output;
  EXPECT_TRUE(contains(one.output, "is their average on the one rank now")) << one.output;
  EXPECT_FALSE(contains(one.output, "start afresh")) << one.output;
  fs::remove_all(dir);
}

// A checkpoint of 3 ranks made with `first` flags, resumed on 2 ranks with `resumed` flags, ends exactly as an
// unsharded 2-rank run resumed from a copy of it: the same model and optimizer state, bit for bit.
namespace {
void expect_three_rank_checkpoint_resumes_on_two(const std::string& name, const std::string& first,
                                                 const std::string& resumed) {
  fs::path dir = temp_dir(name);
  const std::string saved = (dir / "saved.ck").string(), plain = (dir / "plain.ck").string();
  const std::string opts = " --optimizer adamw --lr 1e-3 --bucket-mb 0.05 --first-bucket-mb 0.01";
  auto one = run_tandem("launch -n 3 -- " + kBin + kTrain + opts + " " + first + " --epochs 1 --checkpoint " + saved);
  ASSERT_EQ(one.status, 0) << one.output;
  fs::copy_file(saved, plain);
  for (int r = 0; r < 3; ++r) fs::copy_file(saved + ".rank" + std::to_string(r), plain + ".rank" + std::to_string(r));
  auto again = run_tandem(launch2(opts + " " + resumed + " --epochs 2 --resume --checkpoint " + saved));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "saved by 3 ranks, resuming on 2")) << again.output;
  EXPECT_FALSE(contains(again.output, "start afresh")) << again.output;
  auto unsharded = run_tandem(launch2(opts + " --shard none --epochs 2 --resume --checkpoint " + plain));
  ASSERT_EQ(unsharded.status, 0) << unsharded.output;
  expect_same_tensors(saved, plain, "the checkpoint after the resumed epoch");
  fs::remove_all(dir);
}
}  // namespace

// A checkpoint of 3 ranks under --shard optimizer resumes on 2 ranks under --shard gradients exactly as
// an unsharded 2-rank run resumes from the same checkpoint (the optimizer's state is gathered whole for the
// checkpoint and cut again on load).
TEST(ResumeCli, AShardedCheckpointOfThreeRanksResumesOnTwoAsATwoRankRunWould) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  expect_three_rank_checkpoint_resumes_on_two("reshard", "--shard optimizer", "--shard gradients");
}

// The same with the optimizer and the parameters on the host: a checkpoint of 3 ranks under --offload parameters
// (stage 3's slices and the optimizer's state in host memory) resumes on 2 ranks under --offload optimizer.
TEST(ResumeCli, AnOffloadedCheckpointOfThreeRanksResumesOnTwoAsATwoRankRunWould) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  expect_three_rank_checkpoint_resumes_on_two("reshard_offload", "--offload parameters", "--offload optimizer");
}

// Master weights (--master-weights bf16) on 2 ranks under --shard optimizer: one epoch then a resumed second
// end in the bits of two epochs in one go; the checkpoint holds the f32 masters beside the moments, and the
// parameters hold bf16 values while the masters do not.
TEST(ResumeCli, MasterWeightsResumeWhereTheUninterruptedRunEnds) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  fs::path dir = temp_dir("masters");
  const std::string straight = (dir / "straight.ck").string(), resumed = (dir / "resumed.ck").string();
  const std::string opts = " --optimizer adamw --lr 1e-3 --shard optimizer --master-weights bf16 --bucket-mb 0.05 "
                           "--first-bucket-mb 0.01";
  auto two = run_tandem(launch2(opts + " --epochs 2 --checkpoint " + straight));
  ASSERT_EQ(two.status, 0) << two.output;
  // The start-up line counts each rank's masters (half of them on each of the 2 ranks).
  EXPECT_TRUE(contains(two.output, "master weights ")) << two.output;
  EXPECT_FALSE(contains(two.output, "master weights 0.0 kB")) << two.output;
  auto one = run_tandem(launch2(opts + " --epochs 1 --checkpoint " + resumed));
  ASSERT_EQ(one.status, 0) << one.output;
  auto again = run_tandem(launch2(opts + " --epochs 2 --resume --checkpoint " + resumed));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_FALSE(contains(again.output, "start afresh")) << again.output;
  expect_same_tensors(straight, resumed, "two epochs against one and a resumed second");
  int masters = 0, params = 0, unrounded_masters = 0, unrounded_params = 0;
  for (auto& [name, t] : tensors_of(straight)) {
    const bool master = name.rfind("opt/master/", 0) == 0, param = name.rfind("param/", 0) == 0;
    if (!master && !param) continue;
    tandem::Tensor back = t.to(tandem::DType::bf16).to(tandem::DType::f32);
    const int differ = std::memcmp(back.data_ptr(), t.data_ptr(), t.nbytes()) != 0;
    (master ? masters : params)++;
    (master ? unrounded_masters : unrounded_params) += differ;
  }
  EXPECT_GT(params, 0);
  EXPECT_EQ(masters, params) << "one master per parameter in the checkpoint";
  EXPECT_EQ(unrounded_params, 0) << "parameters that are not bf16 values";
  EXPECT_GT(unrounded_masters, 0) << "the masters hold no more than bf16 values";
  fs::remove_all(dir);
}

// Ranks that see different checkpoints (a disk that is not shared) all stop before training, naming what
// each found and where it looked.
TEST(ResumeCli, RanksThatFindDifferentCheckpointsStopNamingThePaths) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  fs::path dir = temp_dir("unshared");
  fs::create_directories(dir / "node0");
  fs::create_directories(dir / "node1");
  auto first = run_tandem(launch2("--epochs 1 --checkpoint " + (dir / "node0" / "ck").string()));
  ASSERT_EQ(first.status, 0) << first.output;
  // Rank r looks in node<r>/: only rank 0 finds the checkpoint.
  auto r = run_tandem("launch -n 2 -- sh -c '" + kBin + kTrain + " --epochs 2 --resume --checkpoint " +
                      dir.string() + "/node$TANDEM_RANK/ck'");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "what --resume found")) << r.output;
  EXPECT_TRUE(contains(r.output, "the checkpoint of epoch 0 on rank 0 (" + (dir / "node0" / "ck").string()))
      << r.output;
  EXPECT_TRUE(contains(r.output, "no checkpoint on rank 1 (" + (dir / "node1" / "ck").string())) << r.output;
  EXPECT_FALSE(contains(r.output, "Starting Epoch")) << r.output;
  fs::remove_all(dir);
}

// A checkpoint carries its -d option's state: resuming it under another option is refused, naming both.
TEST(ResumeCli, ResumingUnderAnotherDistOptionIsRefused) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  fs::path dir = temp_dir("method");
  const std::string ck = (dir / "ck").string();
  auto first = run_tandem(kTrain.substr(1) + " -d sparseTopK --epochs 1 --checkpoint " + ck);
  ASSERT_EQ(first.status, 0) << first.output;
  auto other = run_tandem(kTrain.substr(1) + " -d plain --epochs 2 --resume --checkpoint " + ck);
  EXPECT_EQ(other.status, 2) << other.output;
  EXPECT_TRUE(contains(other.output, "saved with -d sparseTopK and this run uses -d plain")) << other.output;
  EXPECT_FALSE(contains(other.output, "Starting Epoch")) << other.output;
  fs::remove_all(dir);
}
