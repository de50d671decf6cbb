// A job over two "hosts": two network namespaces joined by a veth pair, each with its own /etc/hosts
// naming both (a mount namespace). Nothing of the machine's own network is touched, and the namespaces
// go with the processes that hold them. Needs root (CI runs as root); skipped elsewhere, saying why.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "process_util.h"
#include "text_util.h"

using tandem::test::in_path;
using tandem::test::Proc;
using tandem::test::ProcResult;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;
const char* kFashion = "/usr/share/datasets/fashion-mnist";

using tandem::test::contains;

class TwoHosts {
 public:
  TwoHosts() { why_not_ = setup(); }
  ~TwoHosts() {
    holders_.clear();  // the namespaces, and the veth pair in them, go with these processes
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  bool ok() const { return why_not_.empty(); }
  const std::string& why_not() const { return why_not_; }
  const std::string& secret_file() const { return secret_file_; }

  /// Starts argv on host h (0 or 1), in its network and mount namespaces.
  std::unique_ptr<Proc> start(int h, const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> a = {"nsenter", "-t", std::to_string(holders_[static_cast<size_t>(h)]->pid()), "-n", "-m",
                                  "--"};
    a.insert(a.end(), argv.begin(), argv.end());
    return std::make_unique<Proc>(a, env);
  }

 private:
  // Makes the two hosts; "" when done, else why they cannot be made here.
  std::string setup() {
    if (geteuid() != 0) return "making network namespaces needs root";
    for (const char* tool : {"unshare", "nsenter", "ip", "mount"})
      if (!in_path(tool)) return std::string(tool) + " is not installed";
    dir_ = ::testing::TempDir() + "/tandem_two_hosts_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    { std::ofstream(dir_ + "/hosts") << "127.0.0.1 localhost\n10.77.0.1 tnode1\n10.77.0.2 tnode2\n"; }
    for (int h = 0; h < 2; ++h) {
      holders_.push_back(std::make_unique<Proc>(std::vector<std::string>{
          "unshare", "--net", "--mount", "sh", "-c", "mount --bind " + dir_ + "/hosts /etc/hosts && echo ready && exec sleep 600"}));
      if (!holders_.back()->read_until("ready", 1, 10))
        return "cannot make a network and mount namespace here: " + holders_.back()->output();
    }
    std::string p1 = std::to_string(holders_[0]->pid()), p2 = std::to_string(holders_[1]->pid());
    ProcResult link = run_process({"nsenter", "-t", p1, "-n", "ip", "link", "add", "veth-t1", "type", "veth", "peer",
                                   "name", "veth-t2", "netns", p2}, {}, 10);
    if (link.exit_code != 0) return "cannot make a veth pair: " + link.output;
    for (int h = 0; h < 2; ++h) {
      std::string n = std::to_string(h + 1);
      ProcResult up = run_process({"nsenter", "-t", h == 0 ? p1 : p2, "-n", "sh", "-c",
                                   "ip addr add 10.77.0." + n + "/24 dev veth-t" + n + " && ip link set veth-t" + n +
                                       " up && ip link set lo up"}, {}, 10);
      if (up.exit_code != 0) return "cannot configure the veth pair: " + up.output;
    }
    secret_file_ = dir_ + "/secret";
    { std::ofstream(secret_file_) << "two hosts, one job, one secret"; }
    chmod(secret_file_.c_str(), 0600);
    return "";
  }

  std::string dir_, secret_file_, why_not_;
  std::vector<std::unique_ptr<Proc>> holders_;
};

// A short training run: one epoch of a small MLP on part of Fashion-MNIST, one thread per rank.
std::vector<std::string> train_command() {
  return {kTandem, "train", "--model", "mlp", "--hidden", "32", "--epochs", "1", "--limit-train", "1024",
          "--limit-test", "512", "--batch-size", "64", "--device", "cpu", "--threads", "1", "--progress", "off"};
}

#define TWO_HOSTS_OR_SKIP(hosts)                                                                         \
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";                          \
  if (!std::filesystem::exists(std::string(kFashion) + "/train-images-idx3-ubyte.gz"))                  \
    GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";                           \
  TwoHosts hosts;                                                                                        \
  if (!hosts.ok()) GTEST_SKIP() << "two network namespaces are needed: " << hosts.why_not()

TEST(TwoHosts, LaunchWithNnodes) {
  TWO_HOSTS_OR_SKIP(hosts);
  std::vector<std::unique_ptr<Proc>> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = {kTandem, "launch", "--nnodes", "2", "--node-rank", std::to_string(node),
                                     "--master-addr", "tnode1", "--master-port", "29400", "--nproc-per-node", "1",
                                     "--timeout", "60", "--"};
    for (const auto& a : train_command()) argv.push_back(a);
    nodes.push_back(hosts.start(node, argv, {{"TANDEM_SECRET_FILE", hosts.secret_file()}}));
  }
  ProcResult n0 = nodes[0]->wait(120), n1 = nodes[1]->wait(120);
  EXPECT_EQ(n0.exit_code, 0) << n0.output;
  EXPECT_EQ(n1.exit_code, 0) << n1.output;
  EXPECT_TRUE(contains(n0.output, "2 ranks (gloo")) << n0.output;
  EXPECT_TRUE(contains(n0.output, "Evaluation accuracy = ")) << n0.output;
  EXPECT_FALSE(contains(n0.output + n1.output, "unauthenticated")) << n0.output;
  EXPECT_LT(n0.seconds, 60);
}

TEST(TwoHosts, SlurmVariables) {
  TWO_HOSTS_OR_SKIP(hosts);
  std::vector<std::unique_ptr<Proc>> tasks;
  for (int id = 0; id < 2; ++id)
    tasks.push_back(hosts.start(id, train_command(),
                                {{"SLURM_PROCID", std::to_string(id)}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                                 {"SLURM_NTASKS_PER_NODE", "1"}, {"SLURM_NODEID", std::to_string(id)},
                                 {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NODELIST", "tnode[1-2]"},
                                 {"TANDEM_SECRET_FILE", hosts.secret_file()}, {"TANDEM_TIMEOUT", "60"}}));
  ProcResult t0 = tasks[0]->wait(120), t1 = tasks[1]->wait(120);
  EXPECT_EQ(t0.exit_code, 0) << t0.output;
  EXPECT_EQ(t1.exit_code, 0) << t1.output;
  EXPECT_TRUE(contains(t0.output, "2 ranks (gloo")) << t0.output;
  EXPECT_TRUE(contains(t0.output, "Evaluation accuracy = ")) << t0.output;
  EXPECT_LT(t0.seconds, 60);
}

}  // namespace
