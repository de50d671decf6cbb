// Multi-process collectives on CPU tensors (Gloo), joined through every launcher, and the failures
// of joining and of collectives. Each rank is the dist_worker program checking its own results.
#include <gtest/gtest.h>

#include <memory>
#include <regex>

#include "process_util.h"
#include "tandem/distributed/store.h"
#include "text_util.h"

using tandem::test::free_port;
using tandem::test::in_path;
using tandem::test::Proc;
using tandem::test::ProcResult;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;
const std::string kWorker = TANDEM_DIST_WORKER;

using tandem::test::contains;

// A macro: GTEST_SKIP must return from the test itself, not from a helper.
#define SKIP_WITHOUT_GLOO() \
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo"

ProcResult launch(int n, const std::string& scenario, double timeout_s = 60) {
  return run_process({kTandem, "launch", "-n", std::to_string(n), "--", kWorker, scenario}, {}, timeout_s);
}

void expect_every_rank(const ProcResult& r, int n, const std::string& what) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: " + what)) << r.output;
  for (int k = 1; k < n; ++k)
    EXPECT_TRUE(contains(r.output, "[rank " + std::to_string(k) + "] rank " + std::to_string(k) + ": " + what))
        << r.output;
}

TEST(GlooLaunch, AllReduceTwoRanks) {
  SKIP_WITHOUT_GLOO();
  expect_every_rank(launch(2, "allreduce"), 2, "all_reduce ok on 2 ranks");
}

TEST(GlooLaunch, AllReduceThreeRanks) {
  SKIP_WITHOUT_GLOO();
  expect_every_rank(launch(3, "allreduce"), 3, "all_reduce ok on 3 ranks");
}

TEST(GlooLaunch, ReduceScatterGathersBroadcastBarrierTwoRanks) {
  SKIP_WITHOUT_GLOO();
  ProcResult r = launch(2, "collectives");
  for (const char* what : {"reduce_scatter ok", "all_gather ok", "all_gatherv ok", "broadcast ok", "barrier ok"})
    expect_every_rank(r, 2, what);
}

TEST(GlooLaunch, ReduceScatterGathersBroadcastBarrierThreeRanks) {
  SKIP_WITHOUT_GLOO();
  ProcResult r = launch(3, "collectives");
  for (const char* what : {"reduce_scatter ok", "all_gather ok", "all_gatherv ok", "broadcast ok", "barrier ok"})
    expect_every_rank(r, 3, what);
}

TEST(GlooLaunch, SparseAllReduceTwoAndThreeRanks) {
  SKIP_WITHOUT_GLOO();
  for (int n : {2, 3}) expect_every_rank(launch(n, "sparse"), n, "sparse all-reduce ok");
}

TEST(GlooLaunch, APeerThatDiedFailsTheCollective) {
  SKIP_WITHOUT_GLOO();
  ProcResult r = launch(2, "peer_dies", 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;  // rank 0 checked the error it got
  EXPECT_TRUE(contains(r.output, "rank 0: collective error after")) << r.output;
  EXPECT_LT(r.seconds, 10.0);
}

TEST(GlooLaunch, APeerThatNeverJoinsTheCollectiveTimesOut) {
  SKIP_WITHOUT_GLOO();
  ProcResult r = launch(2, "peer_hangs", 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "collective all_reduce on rank 0 timed out after 1 s (a peer may have died)"))
      << r.output;
  EXPECT_LT(r.seconds, 10.0);
}

TEST(GlooMpiexec, AllCollectivesTwoRanks) {
  SKIP_WITHOUT_GLOO();
#if !TANDEM_TEST_WITH_MPI
  GTEST_SKIP() << "tandem was built without MPI";
#endif
  if (!in_path("mpiexec")) GTEST_SKIP() << "mpiexec is not installed";
  // As root, OpenMPI needs to be told that this is intended; two ranks may exceed the cores.
  std::vector<std::string> mpi = {"mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", "2"};
  auto with = [&](std::vector<std::string> tail) {
    std::vector<std::string> a = mpi;
    a.insert(a.end(), tail.begin(), tail.end());
    return a;
  };
  ProcResult env = run_process(with({kWorker, "env"}), {}, 60);
  ASSERT_EQ(env.exit_code, 0) << env.output;
  EXPECT_TRUE(contains(env.output, "rank=0 world=2 local=0/2 launcher=mpi")) << env.output;
  EXPECT_TRUE(contains(env.output, "rank=1 world=2 local=1/2 launcher=mpi")) << env.output;

  ProcResult r = run_process(with({kWorker, "all"}), {}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* what : {"all_reduce ok on 2 ranks", "all_gather ok", "all_gatherv ok", "broadcast ok",
                           "barrier ok"}) {
    EXPECT_TRUE(contains(r.output, "rank 0: " + std::string(what))) << r.output;
    EXPECT_TRUE(contains(r.output, "rank 1: " + std::string(what))) << r.output;
  }
}

// Starts ranks by hand with the given per-rank environments and waits for all of them.
std::vector<ProcResult> run_ranks(const std::vector<std::map<std::string, std::string>>& envs,
                                  const std::string& scenario, double timeout_s = 30) {
  std::vector<std::unique_ptr<Proc>> procs;
  for (const auto& env : envs) procs.push_back(std::make_unique<Proc>(std::vector<std::string>{kWorker, scenario}, env));
  std::vector<ProcResult> results;
  for (auto& p : procs) results.push_back(p->wait(timeout_s));
  return results;
}

TEST(GlooTorchrunEnv, TwoRanks) {
  SKIP_WITHOUT_GLOO();
  std::string port = std::to_string(free_port());
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < 2; ++r)
    envs.push_back({{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(r)},
                    {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", port}});
  auto results = run_ranks(envs, "env");
  EXPECT_TRUE(contains(results[1].output, "rank=1 world=2 local=1/2 launcher=torchrun")) << results[1].output;
  results = run_ranks(envs, "collectives");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << results[r].output;
    EXPECT_TRUE(contains(results[r].output, "rank " + std::to_string(r) + ": barrier ok")) << results[r].output;
  }
}

std::map<std::string, std::string> tandem_env(int rank, int world, int port, const std::string& timeout = "") {
  std::map<std::string, std::string> e = {{"TANDEM_RANK", std::to_string(rank)},
                                          {"TANDEM_WORLD_SIZE", std::to_string(world)},
                                          {"TANDEM_STORE_ADDR", "127.0.0.1:" + std::to_string(port)}};
  if (!timeout.empty()) e["TANDEM_TIMEOUT"] = timeout;
  return e;
}

TEST(GlooJoin, MismatchedWorldSizesFailClearly) {
  SKIP_WITHOUT_GLOO();
  tandem::dist::StoreServer store(0, "127.0.0.1");
  auto results = run_ranks({tandem_env(0, 2, store.port(), "20"), tandem_env(1, 3, store.port(), "20")}, "join");
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 2) << r.output;  // a mistake in how the job was started
    EXPECT_LT(r.seconds, 10.0) << r.output;  // not a wait for the timeout
    EXPECT_TRUE(contains(r.output, "world size mismatch")) << r.output;
  }
  // Whichever rank notices first explains the difference; the other hears of it.
  std::regex explained(R"(rank [01] was started with world size [23] but rank [01] \(pid \d+ on .+\) with [23])");
  EXPECT_TRUE(std::regex_search(results[0].output + results[1].output, explained))
      << results[0].output << results[1].output;
}

TEST(GlooJoin, AMissingRankIsNamed) {
  SKIP_WITHOUT_GLOO();
  tandem::dist::StoreServer store(0, "127.0.0.1");
  auto results = run_ranks({tandem_env(0, 3, store.port(), "1")}, "join");
  EXPECT_EQ(results[0].exit_code, 1) << results[0].output;
  EXPECT_TRUE(contains(results[0].output, "ranks 1, 2 did not join within 1 s")) << results[0].output;
  EXPECT_LT(results[0].seconds, 10.0);
}

TEST(GlooJoin, TheSameRankTwiceFailsBoth) {
  SKIP_WITHOUT_GLOO();
  tandem::dist::StoreServer store(0, "127.0.0.1");
  auto results = run_ranks({tandem_env(0, 2, store.port(), "20"), tandem_env(0, 2, store.port(), "20")}, "join");
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "two processes joined as rank 0")) << r.output;
    EXPECT_LT(r.seconds, 10.0);
  }
}

TEST(GlooJoin, ByHandWithAGoodEnvironmentWorks) {
  SKIP_WITHOUT_GLOO();
  tandem::dist::StoreServer store(0, "127.0.0.1");
  auto results = run_ranks({tandem_env(0, 2, store.port()), tandem_env(1, 2, store.port())}, "join");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << results[r].output;
    EXPECT_TRUE(contains(results[r].output, "joined gloo group of 2")) << results[r].output;
  }
}

}  // namespace
