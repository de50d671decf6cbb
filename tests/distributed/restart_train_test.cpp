// tandem launch --max-restarts with a rank killed in the middle of a training run: every rank starts
// again, resumes from the last checkpoint, and the run ends as an uninterrupted one does.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "process_util.h"
#include "text_util.h"

using tandem::test::Proc;
using tandem::test::ProcResult;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;

using tandem::test::contains;

// The value after the last "<label> = " in the output.
std::string last_value(const std::string& out, const std::string& label) {
  size_t at = out.rfind(label + " = ");
  if (at == std::string::npos) return "";
  size_t start = at + label.size() + 3;
  return out.substr(start, out.find_first_of(",\n", start) - start);
}

// The child of `parent` whose environment says TANDEM_RANK=rank, or -1.
pid_t rank_process(pid_t parent, int rank) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t close = s.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(s.c_str() + close + 2, "%c %d", &state, &ppid) != 2 || ppid != parent) continue;
    std::ifstream env(entry.path() / "environ");
    std::string e((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (e.find(std::string("TANDEM_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

TEST(RestartTraining, AKilledRankIsRestartedAndTheRunEndsAsAnUninterruptedOne) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  std::string dir = ::testing::TempDir() + "/tandem_restart_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::vector<std::string> train = {kTandem, "train", "--model", "cnn", "--epochs", "3", "--limit-train", "1024",
                                          "--limit-test", "128", "--batch-size", "32", "--threads", "1", "--seed", "4",
                                          "--progress", "off"};
  auto launch = [&](std::vector<std::string> extra_launch, std::vector<std::string> extra_train) {
    std::vector<std::string> argv = {kTandem, "launch", "-n", "2"};
    argv.insert(argv.end(), extra_launch.begin(), extra_launch.end());
    argv.push_back("--");
    argv.insert(argv.end(), train.begin(), train.end());
    argv.insert(argv.end(), extra_train.begin(), extra_train.end());
    return argv;
  };

  ProcResult whole = run_process(launch({}, {}), {}, 180);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  const std::string ck = dir + "/ck.bin";
  Proc job(launch({"--max-restarts", "1"}, {"--checkpoint", ck, "--resume"}));
  // "Starting Epoch 1" comes once epoch 0's checkpoint is saved: kill rank 1 in the middle of epoch 1.
  ASSERT_TRUE(job.read_until("Starting Epoch 1", 1, 120)) << job.output();
  pid_t victim = rank_process(job.pid(), 1);
  ASSERT_GT(victim, 0) << "rank 1's process was not found";
  kill(victim, SIGKILL);
  ProcResult r = job.wait(180);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "tandem launch: rank 1 was killed by signal 9 (Killed); stopped the other rank"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "tandem launch: restarting every rank (restart 1 of 1)")) << r.output;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.output, m, std::regex("resuming from '.*ck.bin' at epoch [12]"))) << r.output;
  EXPECT_EQ(last_value(r.output, "Training loss"), last_value(whole.output, "Training loss")) << r.output;
  EXPECT_EQ(last_value(r.output, "Evaluation accuracy"), last_value(whole.output, "Evaluation accuracy"))
      << "uninterrupted:\n" << whole.output << "\nrestarted:\n" << r.output;
  EXPECT_FALSE(last_value(whole.output, "Evaluation accuracy").empty()) << whole.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
