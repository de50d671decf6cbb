// Ctrl-C (SIGINT) and SIGTERM of `tandem train`, alone and under `tandem launch`: the run stops at a step
// boundary, every rank at the same one, saves --checkpoint there, says what it saved and exits with
// 128 + the signal; the run resumed from that checkpoint ends in the bits of the uninterrupted run. Both
// trainers: the language models' (by steps) and the image models' (by epochs, stopped inside an epoch).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "distributed/process_util.h"
#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"
#include "tandem/checkpoint.h"
#include "text_util.h"

namespace fs = std::filesystem;
using tandem::test::contains;
using tandem::test::expect_same_checkpoints;
using tandem::test::Proc;
using tandem::test::ProcResult;
using tandem::test::run_tandem;

namespace {

const std::string kBin = TANDEM_BIN;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_interrupt_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The words of a command line (no spaces inside an argument here).
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The number the first match of `re` captures in `text`, or -1.
int64_t captured(const std::string& text, const std::string& re) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(re)) ? std::stoll(m[1].str()) : -1;
}

nlohmann::json meta_of(const std::string& checkpoint) {
  return nlohmann::json::parse(tandem::checkpoint_meta(checkpoint));
}

}  // namespace

// One process: Ctrl-C after step 20 of 300 stops at the next step, saving the checkpoint there; resumed,
// the run ends where the uninterrupted one ends. SIGTERM without --checkpoint says that nothing was saved.
TEST(InterruptCli, ALanguageModelStopsAtAStepAndResumesToTheSameEnd) {
  const fs::path dir = temp_dir("lm"), corpus = tandem::test::make_corpus(dir);
  const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
  const std::string run = "train --model bigram --data " + corpus.string() + " --threads 1 --seed 5 --steps 300 "
                          "--warmup 10 --context 128 --batch-size 32 --lr 0.05 --eval-every 100 --eval-steps 2 ";
  auto a = run_tandem(run + "--checkpoint " + whole);
  ASSERT_EQ(a.status, 0) << a.output;

  Proc p(words(kBin + " " + run + "--checkpoint " + parted));
  ASSERT_TRUE(p.read_until("step 20/300", 1, 60)) << p.output();
  kill(p.pid(), SIGINT);
  ProcResult r = p.wait(60);
  ASSERT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_TRUE(contains(r.output, "tandem: interrupted: stopping at the next step boundary, saving the checkpoint '" +
                                     parted + "' there")) << r.output;
  const int64_t step = captured(r.output, R"(tandem: interrupted by SIGINT after step (\d+) of 300: saved the )"
                                          R"(checkpoint ')" + parted + "'");
  ASSERT_GE(step, 20) << r.output;
  ASSERT_LT(step, 300) << r.output;
  EXPECT_EQ(meta_of(parted).value("step", -1), step);
  EXPECT_FALSE(contains(r.output, "done:")) << r.output;

  auto b = run_tandem(run + "--resume --checkpoint " + parted);
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "resuming from '" + parted + "' at step " + std::to_string(step))) << b.output;
  expect_same_checkpoints(whole, parted, 1);

  Proc t(words(kBin + " " + run));
  ASSERT_TRUE(t.read_until("step 20/300", 1, 60)) << t.output();
  kill(t.pid(), SIGTERM);
  ProcResult rt = t.wait(60);
  EXPECT_EQ(rt.exit_code, 128 + SIGTERM) << rt.output;
  EXPECT_TRUE(std::regex_search(rt.output, std::regex(R"(interrupted by SIGTERM after step \d+ of 300: nothing was )"
                                                      R"(saved \(no --checkpoint\))")))
      << rt.output;
  fs::remove_all(dir);
}

// Under tandem launch, Ctrl-C reaches both ranks, which agree on one step to stop after (a rank that
// stopped alone would leave the other waiting in a collective): each saves its own state there, and the
// two-rank run resumed from it ends in the bits of the uninterrupted one.
TEST(InterruptCli, TwoRanksOfALanguageModelStopAtTheSameStep) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("lm2"), corpus = tandem::test::make_corpus(dir);
  const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
  const std::string run = "launch -n 2 -- " + kBin + " train --model bigram --data " + corpus.string() +
                          " --threads 1 --seed 5 --steps 300 --warmup 10 --context 64 --batch-size 16 --lr 0.05 "
                          "--eval-every 0 --eval-steps 2 -d powerSGD --timeout 60 ";
  auto a = run_tandem(run + "--checkpoint " + whole);
  ASSERT_EQ(a.status, 0) << a.output;

  Proc p(words(kBin + " " + run + "--checkpoint " + parted));
  ASSERT_TRUE(p.read_until("step 20/300", 1, 60)) << p.output();
  kill(p.pid(), SIGINT);
  ProcResult r = p.wait(90);
  ASSERT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_TRUE(contains(r.output, "tandem launch: SIGINT: passed to the ranks")) << r.output;
  const int64_t step = captured(r.output, R"(tandem: interrupted by SIGINT after step (\d+) of 300: saved)");
  ASSERT_GE(step, 20) << r.output;
  EXPECT_EQ(meta_of(parted).value("step", -1), step);
  // Both ranks saved their own state at that step, and neither failed in a collective.
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(meta_of(parted + ".rank" + std::to_string(rank)).value("step", -1), step) << rank;
  EXPECT_FALSE(contains(r.output, "error")) << r.output;

  auto b = run_tandem(run + "--resume --checkpoint " + parted);
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_FALSE(contains(b.output, "start afresh")) << b.output;
  expect_same_checkpoints(whole, parted, 2);
  fs::remove_all(dir);
}

// The image models' trainer, two ranks: Ctrl-C inside the second epoch stops both ranks after the same
// batch, saving that point (the batches done, their loss and accuracy so far); resumed there, the run
// goes on from the next batch and ends in the uninterrupted run's bits.
TEST(InterruptCli, TwoRanksOfAnImageModelStopInsideAnEpochAndResumeThere) {
  if (!tandem::test::have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("cnn2");
  const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
  const std::string run = "launch -n 2 -- " + kBin + " train --model cnn --epochs 2 --limit-train 4096 "
                          "--limit-test 128 --batch-size 32 --threads 1 --seed 4 --timeout 60 --progress on ";
  auto a = run_tandem(run + "--checkpoint " + whole);
  ASSERT_EQ(a.status, 0) << a.output;

  Proc p(words(kBin + " " + run + "--checkpoint " + parted));
  ASSERT_TRUE(p.read_until("epoch 1 [", 1, 120)) << p.output();
  kill(p.pid(), SIGINT);
  ProcResult r = p.wait(90);
  ASSERT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  const int64_t batch = captured(r.output, R"(tandem: interrupted by SIGINT in epoch 1 after batch (\d+) of 64 )"
                                           R"(\(step \d+\): saved the checkpoint)");
  ASSERT_GT(batch, 0) << r.output;
  ASSERT_LT(batch, 64) << r.output;
  const auto meta = meta_of(parted);
  EXPECT_EQ(meta.value("epoch", -2), 0);
  EXPECT_EQ(meta["partial_epoch"].value("batches", -1), batch);
  EXPECT_EQ(meta.value("global_step", -1), 64 + batch);
  EXPECT_FALSE(contains(r.output, "error")) << r.output;
  // A stop inside an epoch resumes only on the batches it was cut into (a copy: the original goes on below).
  const std::string copy = (dir / "copy.ck").string();
  for (const std::string suffix : {"", ".rank0", ".rank1"}) fs::copy_file(parted + suffix, copy + suffix);
  auto other = run_tandem(run + "--batch-size 16 --resume --checkpoint " + copy);
  EXPECT_EQ(other.status, 2) << other.output;
  EXPECT_TRUE(contains(other.output, "was saved inside epoch 1 (after batch " + std::to_string(batch) +
                                         ") with --batch-size 32; this run has 16"))
      << other.output;

  auto b = run_tandem(run + "--resume --checkpoint " + parted);
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "resuming from '" + parted + "' inside epoch 1, at batch " +
                                     std::to_string(batch + 1) + " of 64"))
      << b.output;
  EXPECT_EQ(tandem::test::count_lines_with(b.output, "Starting Epoch"), 1) << b.output;
  EXPECT_FALSE(contains(b.output, "start afresh")) << b.output;
  expect_same_checkpoints(whole, parted, 2);
  fs::remove_all(dir);
}
