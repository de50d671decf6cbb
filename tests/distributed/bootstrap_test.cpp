// Joining a job started by hand (torchrun style, Slurm style) or by tandem launch: where rank 0's store
// listens, how the job's id and secret keep other processes out, and what is said when there is none.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "process_util.h"
#include "text_util.h"

using tandem::test::free_port;
using tandem::test::Proc;
using tandem::test::ProcResult;
using tandem::test::run_process;
using Env = std::map<std::string, std::string>;

namespace {

const std::string kTandem = TANDEM_BIN;
const std::string kWorker = TANDEM_DIST_WORKER;
const std::string kSecret = "a secret shared by the job's ranks";

#define SKIP_WITHOUT_GLOO() \
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo"
#define SKIP_WITHOUT_OPENSSL() \
  if (!TANDEM_TEST_WITH_OPENSSL) GTEST_SKIP() << "tandem was built without OpenSSL"

using tandem::test::contains;

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

Env torchrun(int rank, int port, Env extra = {}) {
  Env e = {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
           {"MASTER_PORT", std::to_string(port)}, {"TANDEM_TIMEOUT", "20"}};
  for (auto& [k, v] : extra) e[k] = v;
  return e;
}

std::unique_ptr<Proc> start(const Env& env, const std::string& scenario = "join") {
  return std::make_unique<Proc>(std::vector<std::string>{kWorker, scenario}, env);
}

// The local addresses that listen on TCP port `port` (IPv4), as /proc/net/tcp shows them.
std::set<std::string> listening_addresses(int port) {
  std::set<std::string> out;
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    if (state != "0A") continue;  // LISTEN
    unsigned addr = 0, p = 0;
    if (std::sscanf(local.c_str(), "%X:%X", &addr, &p) != 2 || static_cast<int>(p) != port) continue;
    out.insert(std::to_string(addr & 255) + "." + std::to_string((addr >> 8) & 255) + "." +
               std::to_string((addr >> 16) & 255) + "." + std::to_string(addr >> 24));
  }
  return out;
}

TEST(Bootstrap, TorchrunRankZeroListensOnLoopbackOnly) {
  SKIP_WITHOUT_GLOO();
  int port = free_port();
  auto rank0 = start(torchrun(0, port));
  std::set<std::string> addrs;
  for (int i = 0; i < 100 && addrs.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    addrs = listening_addresses(port);
  }
  EXPECT_EQ(addrs, std::set<std::string>{"127.0.0.1"}) << "MASTER_ADDR=127.0.0.1 but the store listens elsewhere";
  auto rank1 = start(torchrun(1, port));
  for (auto* p : {rank0.get(), rank1.get()}) {
    ProcResult r = p->wait(30);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "joined gloo group of 2")) << r.output;
  }
}

TEST(Bootstrap, TwoTorchrunJobsOnOnePortStayApart) {
  SKIP_WITHOUT_GLOO();
  int port = free_port();
  auto a0 = start(torchrun(0, port, {{"TORCHELASTIC_RUN_ID", "job-a"}}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // job A's store is up
  // Job B's rank 1 reaches job A's store: it must be turned away, not take job A's rank 1's place.
  ProcResult b1 = start(torchrun(1, port, {{"TORCHELASTIC_RUN_ID", "job-b"}}))->wait(15);
  EXPECT_EQ(b1.exit_code, 2) << b1.output;
  EXPECT_TRUE(contains(b1.output, "this store serves job 'job-a', not job 'job-b'")) << b1.output;
  EXPECT_LT(b1.seconds, 10);
  auto a1 = start(torchrun(1, port, {{"TORCHELASTIC_RUN_ID", "job-a"}}));
  for (auto* p : {a0.get(), a1.get()}) {
    ProcResult r = p->wait(30);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "joined gloo group of 2")) << r.output;
  }
}

// Without a job id to tell them apart, a second job started on a running job's MASTER_PORT is told about
// the port (its rank 0 cannot listen there; its other ranks reach the running job's store), not to check
// its rank variables; and the running job goes on.
TEST(Bootstrap, ASecondTorchrunJobOnABusyPortIsToldAboutThePort) {
  SKIP_WITHOUT_GLOO();
  int port = free_port();
  auto a0 = start(torchrun(0, port), "reduce_loop");
  auto a1 = start(torchrun(1, port), "reduce_loop");
  ASSERT_TRUE(a0->read_until("ready pid=", 1, 30)) << a0->output();
  ASSERT_TRUE(a1->read_until("ready pid=", 1, 30)) << a1->output();
  auto b0 = start(torchrun(0, port));
  auto b1 = start(torchrun(1, port));
  ProcResult r0 = b0->wait(20), r1 = b1->wait(20);
  EXPECT_EQ(r0.exit_code, 2) << r0.output;
  EXPECT_TRUE(contains(r0.output, "MASTER_PORT=" + std::to_string(port))) << r0.output;
  EXPECT_TRUE(contains(r0.output, "in use")) << r0.output;
  EXPECT_TRUE(contains(r0.output, "give each job its own MASTER_PORT")) << r0.output;
  EXPECT_EQ(r1.exit_code, 2) << r1.output;
  EXPECT_TRUE(contains(r1.output, "already serves a job whose 2 ranks have all joined")) << r1.output;
  EXPECT_TRUE(contains(r1.output, "give each job its own MASTER_PORT")) << r1.output;
  EXPECT_FALSE(contains(r1.output, "check the rank variables")) << r1.output;
  EXPECT_LT(r1.seconds, 15);
  // Job A was not disturbed: both ranks still run their loop of all-reduces.
  EXPECT_TRUE(tandem::test::process_exists(a0->pid()));
  EXPECT_TRUE(tandem::test::process_exists(a1->pid()));
  EXPECT_FALSE(contains(a0->output() + a1->output(), "error")) << a0->output() << a1->output();
}

TEST(Bootstrap, AStoreWithoutSecretIsSaidToBeUnauthenticatedOnce) {
  SKIP_WITHOUT_GLOO();
  int port = free_port();
  auto r0 = start(torchrun(0, port));
  auto r1 = start(torchrun(1, port));
  ProcResult a = r0->wait(30), b = r1->wait(30);
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(count(a.output + b.output, "is unauthenticated"), 1) << a.output << b.output;
  EXPECT_TRUE(contains(a.output, "TANDEM_SECRET_FILE")) << a.output;
}

TEST(Bootstrap, RanksWithTheSecretJoinAndOthersAreTurnedAway) {
  SKIP_WITHOUT_GLOO();
  SKIP_WITHOUT_OPENSSL();
  int port = free_port();
  auto r0 = start(torchrun(0, port, {{"TANDEM_SECRET", kSecret}}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ProcResult wrong = start(torchrun(1, port, {{"TANDEM_SECRET", "another secret, just as long"}}))->wait(15);
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_TRUE(contains(wrong.output, "does not know this job's secret")) << wrong.output;
  ProcResult none = start(torchrun(1, port))->wait(15);
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_TRUE(contains(none.output, "asks for the job's secret and this process has none")) << none.output;
  auto r1 = start(torchrun(1, port, {{"TANDEM_SECRET", kSecret}}));
  ProcResult a = r0->wait(30), b = r1->wait(30);
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_FALSE(contains(a.output, "is unauthenticated")) << a.output;
}

TEST(Bootstrap, TandemLaunchGivesItsRanksTheSecret) {
  SKIP_WITHOUT_GLOO();
  SKIP_WITHOUT_OPENSSL();
  ProcResult r = run_process({kTandem, "launch", "-n", "2", "--", "sh", "-c", "echo secret=${#TANDEM_SECRET}"}, {}, 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "secret=64"), 2) << r.output;
  // A rank without it cannot join its own job's store.
  r = run_process({kTandem, "launch", "-n", "2", "--", "sh", "-c",
                   "if [ \"$TANDEM_RANK\" = 1 ]; then unset TANDEM_SECRET; fi; exec " + kWorker + " join"},
                  {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] rank error: the rendezvous store at 127.0.0.1:")) << r.output;
  EXPECT_TRUE(contains(r.output, "asks for the job's secret and this process has none")) << r.output;
}

TEST(Bootstrap, SlurmTasksJoinWithoutAnyOtherLauncher) {
  SKIP_WITHOUT_GLOO();
  // What srun gives two tasks on one node (the node list is never resolved then: loopback suffices).
  auto task = [&](int id) {
    return Env{{"SLURM_PROCID", std::to_string(id)}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", std::to_string(id)},
               {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"},
               {"SLURM_STEP_NODELIST", "nodeA[1-2]"}, {"SLURM_NODEID", "0"}, {"TANDEM_STORE_PORT", std::to_string(free_port())},
               {"TANDEM_TIMEOUT", "20"}};
  };
  Env t0 = task(0), t1 = task(1);
  t1["TANDEM_STORE_PORT"] = t0["TANDEM_STORE_PORT"];
  ProcResult env = run_process({kWorker, "env"}, t1, 10);
  EXPECT_TRUE(contains(env.output, "rank=1 world=2 local=1/2 launcher=slurm")) << env.output;
  auto p0 = start(t0, "collectives"), p1 = start(t1, "collectives");
  ProcResult a = p0->wait(60), b = p1->wait(60);
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "rank 1: barrier ok")) << b.output;
}

}  // namespace
