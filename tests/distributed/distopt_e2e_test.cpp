// End to end: `tandem train` as two ranks under mpiexec and under `tandem launch`, on a slice of
// Fashion-MNIST, with the replicas checked for bit-identical parameters every 8 steps. Only rank 0
// reports, so each of the guide's lines appears once. Skips when the data set or mpiexec is missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "process_util.h"
#include "tandem/device.h"
#include "text_util.h"

using tandem::test::in_path;
using tandem::test::ProcResult;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;
const std::string kDataDir = "/usr/share/datasets/fashion-mnist";

using tandem::test::contains;

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

bool have_dataset() {
  namespace fs = std::filesystem;
  for (const char* base : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"})
    if (!fs::exists(fs::path(kDataDir) / base) && !fs::exists(fs::path(kDataDir) / (std::string(base) + ".gz")))
      return false;
  return true;
}

#define REQUIRE_DATASET() \
  if (!have_dataset()) GTEST_SKIP() << "Fashion-MNIST is not in " << kDataDir

#define REQUIRE_MPIEXEC()                                                                  \
  do {                                                                                     \
    if (!TANDEM_TEST_WITH_MPI) GTEST_SKIP() << "tandem was built without MPI";             \
    if (!in_path("mpiexec")) GTEST_SKIP() << "mpiexec is not installed";                   \
  } while (0)

#define REQUIRE_TWO_GPUS()                                                                   \
  do {                                                                                       \
    if (!TANDEM_TEST_WITH_NCCL) GTEST_SKIP() << "tandem was built without NCCL";             \
    if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";                     \
    if (tandem::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA GPUs (one per rank)"; \
  } while (0)

#define REQUIRE_GLOO() \
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo"

std::vector<std::string> train_command(const std::string& device) {
  return {kTandem, "train", "--model", "cnn", "--dataset", "fashion-mnist", "--epochs", "1",
          "--limit-train", "2048", "--limit-test", "512", "--check-consistency", "8", "--device", device,
          // One kernel thread per rank: the two ranks share this machine's cores.
          "--threads", "1"};
}

std::vector<std::string> under_tandem_launch(const std::vector<std::string>& cmd) {
  std::vector<std::string> a = {kTandem, "launch", "-n", "2", "--"};
  a.insert(a.end(), cmd.begin(), cmd.end());
  return a;
}

std::vector<std::string> under_mpiexec(const std::vector<std::string>& cmd) {
  // As root, OpenMPI needs to be told that this is intended; two ranks may exceed the cores.
  std::vector<std::string> a = {"mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", "2"};
  a.insert(a.end(), cmd.begin(), cmd.end());
  return a;
}

// The run succeeded, rank 0 alone printed the guide's three lines once, with sane values; returns
// the training line.
std::string expect_one_report(const ProcResult& r, const std::string& backend) {
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "2 ranks (" + backend + ", plain)"), 1) << r.output;
  EXPECT_EQ(count(r.output, "Starting Epoch 0:"), 1) << r.output;
  EXPECT_EQ(count(r.output, "Training loss = "), 1) << r.output;
  EXPECT_EQ(count(r.output, "Evaluation accuracy = "), 1) << r.output;
  EXPECT_FALSE(contains(r.output, "[rank 1] Training")) << r.output;
  std::smatch m;
  std::regex train(R"(Training loss = ([0-9.]+), training accuracy = ([0-9.]+))");
  std::regex eval(R"(Evaluation accuracy = ([0-9.]+), Elapsed Time = ([0-9.]+)s)");
  if (!std::regex_search(r.output, m, train)) {
    ADD_FAILURE() << "no training line:\n" << r.output;
    return "";
  }
  std::string line = m.str(0);
  // 16 batches per rank, two ranks: the loss is a sum of 32 per-batch means, each about ln 10 at the
  // start; well above that, training diverged.
  double loss = std::stod(m.str(1)), acc = std::stod(m.str(2));
  EXPECT_GT(loss, 0.0);
  EXPECT_LT(loss, 32 * 3.0) << "training diverged:\n" << r.output;
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 1.0);
  if (std::regex_search(r.output, m, eval)) {
    EXPECT_GE(std::stod(m.str(1)), 0.0);
    EXPECT_LE(std::stod(m.str(1)), 1.0);
  } else {
    ADD_FAILURE() << "no evaluation line:\n" << r.output;
  }
  return line;
}

TEST(DistOptEndToEnd, TandemLaunchTwoRanksOnTheCpu) {
  REQUIRE_GLOO();
  REQUIRE_DATASET();
  ProcResult r = run_process(under_tandem_launch(train_command("cpu")), {}, 300);
  expect_one_report(r, "gloo");
}

TEST(DistOptEndToEnd, MpiexecTwoRanksOnTheCpuMatchesTandemLaunch) {
  REQUIRE_GLOO();
  REQUIRE_DATASET();
  REQUIRE_MPIEXEC();
  ProcResult r = run_process(under_mpiexec(train_command("cpu")), {}, 300);
  std::string line = expect_one_report(r, "gloo");
  // The same job under the other launcher: the same ranks see the same data, so the same result.
  ProcResult t = run_process(under_tandem_launch(train_command("cpu")), {}, 300);
  EXPECT_EQ(expect_one_report(t, "gloo"), line);
}

TEST(DistOptEndToEnd, TandemLaunchTwoGpus) {
  REQUIRE_TWO_GPUS();
  REQUIRE_DATASET();
  ProcResult r = run_process(under_tandem_launch(train_command("cuda")), {}, 300);
  expect_one_report(r, "nccl");
}

// Two ranks on two GPUs record the step with its NCCL all-reduces and replay it: nothing falls back to
// eager steps, and the figures match a run with every step eager (up to rounding: two processes may
// time their way to different convolution algorithms).
TEST(DistOptEndToEnd, TandemLaunchTwoGpusRecordsTheStepWithItsAllReduces) {
  REQUIRE_TWO_GPUS();
  REQUIRE_DATASET();
  std::vector<std::string> cmd = train_command("cuda");
  for (const char* a : {"--precision", "f32", "--deterministic"}) cmd.push_back(a);
  std::vector<std::string> eager = cmd;
  eager.push_back("--cuda-graph");
  eager.push_back("off");
  ProcResult on = run_process(under_tandem_launch(cmd), {}, 300), off = run_process(under_tandem_launch(eager), {}, 300);
  const std::string a = expect_one_report(on, "nccl"), b = expect_one_report(off, "nccl");
  EXPECT_FALSE(contains(on.output, "run eagerly")) << on.output;
  std::smatch ma, mb;
  const std::regex train(R"(Training loss = ([0-9.]+), training accuracy = ([0-9.]+))");
  ASSERT_TRUE(std::regex_search(a, ma, train) && std::regex_search(b, mb, train)) << a << "\n" << b;
  EXPECT_NEAR(std::stod(ma.str(1)), std::stod(mb.str(1)), 1e-3 * std::stod(mb.str(1))) << a << "\n" << b;
  EXPECT_NEAR(std::stod(ma.str(2)), std::stod(mb.str(2)), 0.01) << a << "\n" << b;
}

TEST(DistOptEndToEnd, MpiexecTwoGpus) {
  REQUIRE_TWO_GPUS();
  REQUIRE_DATASET();
  REQUIRE_MPIEXEC();
  ProcResult r = run_process(under_mpiexec(train_command("cuda")), {}, 300);
  expect_one_report(r, "nccl");
}

}  // namespace
