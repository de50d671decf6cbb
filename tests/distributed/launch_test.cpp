// `tandem launch`: arguments, environment, output relay, failure and interrupt handling.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "process_util.h"
#include "tandem/device.h"
#include "text_util.h"

using tandem::test::free_port;
using tandem::test::Proc;
using tandem::test::ProcResult;
using tandem::test::process_exists;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;
const std::string kWorker = TANDEM_DIST_WORKER;

ProcResult launch(const std::vector<std::string>& args, double timeout_s = 30) {
  std::vector<std::string> argv = {kTandem, "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, timeout_s);
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

using tandem::test::contains;

TEST(Launch, RejectsBadArgumentsWithStatus2) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::string not_exec = ::testing::TempDir() + "/tandem_launch_not_executable";
  { std::ofstream(not_exec) << "#!/bin/sh\n"; }
  chmod(not_exec.c_str(), 0644);
  const Case cases[] = {
      {{"-n", "0", "--", "true"}, "-n must be at least 1"},
      {{"-n", "2"}, "no command given"},
      {{"-n", "2", "--"}, "no command given"},
      {{"-n", "2", "--", "./no/such/program"}, "'./no/such/program' does not exist"},
      {{"-n", "2", "--", "no_such_program_in_path_xyz"}, "'no_such_program_in_path_xyz' was not found in PATH"},
      {{"-n", "2", "--", not_exec}, "is not executable"},
      {{"-n", "2", "--", "/"}, "is a directory"},
      {{"-n", "2", "--timeout", "-3", "--", "true"}, "--timeout"},
      {{"--", "true"}, "give the number of ranks"},
  };
  for (const auto& c : cases) {
    ProcResult r = launch(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, c.message)) << "expected '" << c.message << "' in: " << r.output;
  }
}

// The files in dir (each rank of the jobs below makes one).
size_t files_in(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

TEST(Launch, RefusesMoreRanksThanTheMachineHoldsBeforeStartingAny) {
  std::string dir = ::testing::TempDir() + "/tandem_launch_cap_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto job = [&](const std::string& n, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"-n", n};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {"--", "sh", "-c", "touch \"$0\"/rank$TANDEM_RANK"}) args.push_back(a);
    args.push_back(dir);
    return args;
  };

  ProcResult r = launch(job("100000"), 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "pass --oversubscribe to start them anyway")) << r.output;
  EXPECT_EQ(files_in(dir), 0u) << "ranks were started: " << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(-n 100000 is more ranks than this machine runs well: at )"
                                                        R"(most (\d+) CPU ranks on (\d+) cores?)")))
      << r.output;
  const int cap = std::stoi(m[1].str()), cores = std::stoi(m[2].str());
  EXPECT_EQ(cap, std::max(8, 4 * cores));

  // The cap itself is allowed; one more is refused, unless the user says otherwise.
  r = launch(job(std::to_string(cap)), 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir), static_cast<size_t>(cap));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  r = launch(job(std::to_string(cap + 1)), 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(files_in(dir), 0u) << r.output;
  r = launch(job(std::to_string(cap + 1), {"--oversubscribe"}), 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir), static_cast<size_t>(cap + 1));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  // A GPU job gets one GPU per rank: one rank more than this process sees is refused, even when told
  // to oversubscribe.
  const int gpus = tandem::cuda_device_count();
  auto gpu_job = [&](int n) {
    std::vector<std::string> args = job(std::to_string(n), {"--oversubscribe"});
    for (const char* a : {"--device", "cuda"}) args.push_back(a);  // the command's own options ($1, $2)
    return args;
  };
  r = launch(gpu_job(gpus + 1), 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "-n " + std::to_string(gpus + 1) + " with --device cuda needs a GPU for each of its " +
                                     std::to_string(gpus + 1) + " ranks on this machine, but this process sees " +
                                     (gpus == 0 ? std::string("no GPU") : std::to_string(gpus))))
      << r.output;
  EXPECT_EQ(files_in(dir), 0u) << r.output;
  if (gpus > 0) {
    r = launch(gpu_job(gpus), 60);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(files_in(dir), static_cast<size_t>(gpus));
  }
  std::filesystem::remove_all(dir);
}

TEST(Launch, HelpExplainsTheFlags) {
  ProcResult r = launch({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* part : {"-n", "--gpus-per-node", "--timeout", "--oversubscribe", "4 per usable core", "Example",
                           "tandem launch -n"})
    EXPECT_TRUE(contains(r.output, part)) << part << " missing from: " << r.output;
}

TEST(Launch, GivesEachRankItsPlace) {
  ProcResult r = launch({"-n", "3", "--gpus-per-node", "2", "--timeout", "7", "--", "sh", "-c",
                         "echo R=$TANDEM_RANK W=$TANDEM_WORLD_SIZE L=$TANDEM_LOCAL_RANK/$TANDEM_LOCAL_SIZE "
                         "S=${TANDEM_STORE_ADDR%:*} T=${TANDEM_TIMEOUT%%.*}"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "R=0 W=3 L=0/2 S=127.0.0.1 T=7\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] R=1 W=3 L=1/2 S=127.0.0.1 T=7\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] R=2 W=3 L=0/1 S=127.0.0.1 T=7\n")) << r.output;

  r = launch({"-n", "2", "--", "sh", "-c", "echo L=$TANDEM_LOCAL_RANK/$TANDEM_LOCAL_SIZE"});
  EXPECT_TRUE(contains(r.output, "[rank 1] L=1/2")) << r.output;  // default: every rank on one node
}

TEST(Launch, RelaysWholeLinesOnly) {
  // Lines written in pieces, and many lines at once from every rank.
  const char* script =
      "printf 'first-'; sleep 0.2; printf 'half r%s\\n' $TANDEM_RANK; "
      "i=0; while [ $i -lt 300 ]; do echo \"r$TANDEM_RANK-$i-abcdefghijklmnopqrstuvwxyz0123456789\"; "
      "echo \"e$TANDEM_RANK-$i\" >&2; i=$((i+1)); done";
  ProcResult r = launch({"-n", "3", "--", "sh", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::regex line_re(R"(^(\[rank ([12])\] )?(first-half r(\d)|r(\d)-\d+-abcdefghijklmnopqrstuvwxyz0123456789|e(\d)-\d+)$)");
  int counted = 0;
  for (const auto& l : lines_of(r.output)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line_re)) << "mixed or broken line: '" << l << "'";
    std::string prefix_rank = m[2].matched ? m[2].str() : "0";
    std::string body_rank = m[4].matched ? m[4].str() : m[5].matched ? m[5].str() : m[6].str();
    EXPECT_EQ(prefix_rank, body_rank) << l;
    ++counted;
  }
  EXPECT_EQ(counted, 3 * (1 + 300 + 300));
}

TEST(Launch, ExitsZeroWhenEveryRankDoes) {
  ProcResult r = launch({"-n", "4", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
}

TEST(Launch, AFailedRankStopsTheOthers) {
  // The worker joins the job (over Gloo) before rank 1 exits.
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  ProcResult r = launch({"-n", "3", "--", kWorker, "exit3"}, 20);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "tandem launch: rank 1 exited with status 3; stopped the other 2 ranks"))
      << r.output;
}

TEST(Launch, ARankIgnoringSigtermIsKilled) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  ProcResult r = launch({"-n", "2", "--", kWorker, "exit3_stubborn"}, 20);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "rank 1 exited with status 3; stopped the other rank")) << r.output;
}

TEST(Launch, ReportsARankKilledByASignal) {
  ProcResult r = launch({"-n", "2", "--", "sh", "-c", "if [ $TANDEM_RANK = 0 ]; then kill -9 $$; fi; sleep 30"}, 20);
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.output, "tandem launch: rank 0 was killed by signal 9 (Killed)")) << r.output;
}

// Starts `n` sleeping ranks and returns their pids once all reported ready.
std::vector<pid_t> wait_ready(Proc& p, int n) {
  EXPECT_TRUE(p.read_until("ready pid=", n, 10)) << p.output();
  std::vector<pid_t> pids;
  std::regex re(R"(ready pid=(\d+))");
  for (std::sregex_iterator it(p.output().begin(), p.output().end(), re), end; it != end; ++it)
    pids.push_back(static_cast<pid_t>(std::stoi((*it)[1].str())));
  return pids;
}

// Written to one file (as here: the launcher's stdout and stderr are one pipe), a rank's lines keep the
// order it wrote them in across its two streams: a header on stderr comes before the stdout line after it.
TEST(Launch, ARanksLinesKeepTheirOrderAcrossItsTwoStreams) {
  Proc p({kTandem, "launch", "-n", "2", "--", "sh", "-c",
          "i=0; while [ $i -lt 300 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done"});
  ProcResult r = p.wait(30);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string rank0, rank1;
  for (int i = 0; i < 300; ++i) {
    rank0 += "out" + std::to_string(i) + "\nerr" + std::to_string(i) + "\n";
    rank1 += "[rank 1] out" + std::to_string(i) + "\n[rank 1] err" + std::to_string(i) + "\n";
  }
  std::string only0, only1;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[rank 1] ", 0) == 0) only1 += line + "\n";
    else if (line.rfind("out", 0) == 0 || line.rfind("err", 0) == 0) only0 += line + "\n";
  }
  EXPECT_EQ(only0, rank0);
  EXPECT_EQ(only1, rank1);
}

TEST(Launch, CtrlCStopsEveryRank) {
  Proc p({kTandem, "launch", "-n", "3", "--", kWorker, "sleep"});
  std::vector<pid_t> pids = wait_ready(p, 3);
  ASSERT_EQ(pids.size(), 3u);
  kill(p.pid(), SIGINT);
  ProcResult r = p.wait(10);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_TRUE(contains(r.output, "interrupted by SIGINT; stopped 3 ranks")) << r.output;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " survived";
}

TEST(Launch, SecondCtrlCKillsRanksThatIgnoreTheFirst) {
  Proc p({kTandem, "launch", "-n", "2", "--", kWorker, "sleep_ignore_int"});
  std::vector<pid_t> pids = wait_ready(p, 2);
  ASSERT_EQ(pids.size(), 2u);
  kill(p.pid(), SIGINT);
  usleep(300000);
  for (pid_t pid : pids) EXPECT_TRUE(process_exists(pid));  // they ignore SIGINT
  auto start = std::chrono::steady_clock::now();
  kill(p.pid(), SIGINT);
  ProcResult r = p.wait(10);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " survived";
}

TEST(Launch, AKilledRankStopsTheJobWithinASecond) {
  Proc p({kTandem, "launch", "-n", "3", "--", kWorker, "sleep"});
  std::vector<pid_t> pids = wait_ready(p, 3);
  ASSERT_EQ(pids.size(), 3u);
  auto start = std::chrono::steady_clock::now();
  kill(pids[1], SIGKILL);
  ProcResult r = p.wait(10);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 1.0);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_TRUE(contains(r.output, "was killed by signal 9 (Killed); stopped the other 2 ranks")) << r.output;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid));
}

TEST(Launch, SigtermIsForwarded) {
  Proc p({kTandem, "launch", "-n", "2", "--", kWorker, "sleep"});
  std::vector<pid_t> pids = wait_ready(p, 2);
  kill(p.pid(), SIGTERM);
  ProcResult r = p.wait(10);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_TRUE(contains(r.output, "interrupted by SIGTERM")) << r.output;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid));
}

TEST(Launch, OtherLaunchersSpellingsGetHelpfulErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"-np", "2", "--", "true"}, "-np is mpirun's spelling; tandem launch takes -n N"},
      {{"-H", "localhost:2", "true"}, "-H is a host list of mpirun or horovodrun"},
      {{"-n", "2", "--hostfile", "hosts", "true"}, "--hostfile is a host list of mpirun or horovodrun"},
      {{"-n", "2", "-N", "2", "true"}, "tandem launch spells it --nproc-per-node K"},
      {{"-n", "2", "--bogus", "true"}, "unknown option --bogus"},
      {{"-n", "two", "true"}, "-n 'two' is not a number of ranks"},
      {{"--nnodes", "2", "--nproc-per-node", "1", "true"}, "--nnodes 2 needs --master-addr"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1", "--nproc-per-node", "1", "true"},
       "--node-rank 2 is out of range for --nnodes 2 (0 .. 1)"},
      {{"--node-rank", "1", "-n", "2", "true"}, "--node-rank 1 needs --nnodes"},
      {{"-n", "3", "--nproc-per-node", "2", "true"}, "-n 3 does not equal --nproc-per-node 2 x --nnodes 1"},
      {{"-n", "3", "--nnodes", "2", "--master-addr", "127.0.0.1", "true"}, "cannot be spread evenly over --nnodes 2"},
      {{"--nproc-per-node", "2", "--nnodes", "2", "--gpus-per-node", "1", "--master-addr", "h", "true"},
       "--gpus-per-node splits the ranks of one machine"},
      {{"-n", "2", "--max-restarts", "-1", "true"}, "--max-restarts must not be negative"},
  };
  for (const auto& c : cases) {
    ProcResult r = launch(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, c.message)) << "expected '" << c.message << "' in: " << r.output;
  }
}

TEST(Launch, TorchrunSpellingsAndAForgottenSeparatorWork) {
  // --nproc-per-node alone, underscores, and the command without -- (its own options stay its own).
  ProcResult r = launch({"--nproc_per_node=2", "sh", "-c", "echo R=$TANDEM_RANK/$TANDEM_WORLD_SIZE \"$0 $1\"", "-n",
                         "5"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "R=0/2 -n 5\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] R=1/2 -n 5\n")) << r.output;
}

TEST(Launch, MaxRestartsStartsEveryRankAgain) {
  // Rank 1 fails in the first attempt only; every rank of the second sees its attempt number.
  const char* script =
      "if [ $TANDEM_RESTART_COUNT = 0 ] && [ $TANDEM_RANK = 1 ]; then exit 3; fi; "
      "if [ $TANDEM_RESTART_COUNT = 0 ]; then sleep 30; fi; echo attempt=$TANDEM_RESTART_COUNT";
  ProcResult r = launch({"-n", "3", "--max-restarts", "2", "--", "sh", "-c", script}, 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 15);
  EXPECT_TRUE(contains(r.output, "tandem launch: rank 1 exited with status 3; stopped the other 2 ranks")) << r.output;
  EXPECT_TRUE(contains(r.output, "tandem launch: restarting every rank (restart 1 of 2)")) << r.output;
  EXPECT_FALSE(contains(r.output, "restart 2 of 2")) << r.output;
  for (const char* line : {"attempt=1\n", "[rank 1] attempt=1\n", "[rank 2] attempt=1\n"})
    EXPECT_TRUE(contains(r.output, line)) << line << " missing from: " << r.output;

  // A job that keeps failing ends with the failure once the restarts are used up. Only rank 0
  // fails (rank 1 waits to be stopped), so which failure the launcher reports is not a race.
  r = launch({"-n", "2", "--max-restarts", "1", "--", "sh", "-c",
              "if [ $TANDEM_RANK = 0 ]; then exit 4; fi; sleep 30"},
             30);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(contains(r.output, "restarting every rank (restart 1 of 1)")) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 3) << r.output;
}

TEST(Launch, CtrlCIsNotFollowedByARestart) {
  Proc p({kTandem, "launch", "-n", "2", "--max-restarts", "3", "--", kWorker, "sleep"});
  std::vector<pid_t> pids = wait_ready(p, 2);
  kill(p.pid(), SIGINT);
  ProcResult r = p.wait(10);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_FALSE(contains(r.output, "restarting")) << r.output;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid));
}

// Both launchers of a two-machine job, here on one machine (over loopback).
std::vector<std::unique_ptr<Proc>> two_nodes(int port, const std::vector<std::vector<std::string>>& commands,
                                             const std::vector<std::string>& extra = {}, int per_node = 2,
                                             int timeout_s = 30) {
  std::vector<std::unique_ptr<Proc>> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = {kTandem, "launch", "--nnodes", "2", "--node-rank", std::to_string(node),
                                     "--master-addr", "127.0.0.1", "--master-port", std::to_string(port),
                                     "--nproc-per-node", std::to_string(per_node), "--timeout",
                                     std::to_string(timeout_s)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("--");
    argv.insert(argv.end(), commands[static_cast<size_t>(node)].begin(), commands[static_cast<size_t>(node)].end());
    nodes.push_back(std::make_unique<Proc>(argv));
  }
  return nodes;
}

TEST(LaunchNodes, TwoLaunchersMakeOneJob) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  std::vector<std::string> job = {kWorker, "allreduce"};
  auto nodes = two_nodes(free_port(), {job, job});
  ProcResult n0 = nodes[0]->wait(60), n1 = nodes[1]->wait(60);
  EXPECT_EQ(n0.exit_code, 0) << n0.output;
  EXPECT_EQ(n1.exit_code, 0) << n1.output;
  EXPECT_TRUE(contains(n0.output, "rank 0: all_reduce ok on 4 ranks")) << n0.output;
  EXPECT_TRUE(contains(n0.output, "[rank 1] rank 1: all_reduce ok on 4 ranks")) << n0.output;
  EXPECT_TRUE(contains(n1.output, "[rank 2] rank 2: all_reduce ok on 4 ranks")) << n1.output;
  EXPECT_TRUE(contains(n1.output, "[rank 3] rank 3: all_reduce ok on 4 ranks")) << n1.output;
}

TEST(LaunchNodes, AFailureOnOneMachineStopsTheOtherAtOnce) {
  // Rank 3 (node 1) fails; node 0's ranks would sleep for 30 s.
  std::vector<std::string> sleeper = {"sh", "-c", "sleep 30"};
  std::vector<std::string> failing = {"sh", "-c", "if [ $TANDEM_RANK = 3 ]; then sleep 0.5; exit 4; fi; sleep 30"};
  auto nodes = two_nodes(free_port(), {sleeper, failing});
  ProcResult n1 = nodes[1]->wait(30);
  auto failed_at = std::chrono::steady_clock::now();
  ProcResult n0 = nodes[0]->wait(30);
  // Well before node 0's ranks would end on their own (30 s), with room for a loaded machine.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - failed_at).count(), 5.0);
  EXPECT_EQ(n1.exit_code, 4) << n1.output;
  EXPECT_TRUE(contains(n1.output, "tandem launch: rank 3 on node 1 (host ")) << n1.output;
  EXPECT_TRUE(contains(n1.output, ") exited with status 4; stopped the other rank")) << n1.output;
  EXPECT_EQ(n0.exit_code, 4) << n0.output;
  EXPECT_LT(n0.seconds, 10) << n0.output;
  EXPECT_TRUE(contains(n0.output, "tandem launch: rank 3 on node 1 (host ")) << n0.output;
  EXPECT_TRUE(contains(n0.output, ") exited with status 4; stopped this node's 2 ranks")) << n0.output;
}

TEST(LaunchNodes, EveryLauncherNamesTheRankThatWasKilledFirst) {
  // Rank 1 (node 1) is killed; rank 0 (node 0) then fails by itself, moments later: in the first job it
  // exits with status 1 as soon as rank 1 is gone (within 10 ms of node 1's launcher reaping it), in
  // the second with the connection error of its collective. Both launchers see a failure of their own
  // rank at almost the same time: every try is a race that the blame must not depend on.
  std::string dir = ::testing::TempDir() + "/tandem_launch_blame_" + std::to_string(getpid());
  std::vector<std::vector<std::string>> jobs = {
      {"sh", "-c",
       "if [ $TANDEM_RANK = 1 ]; then echo $$ > \"$0\"/pid1.tmp && mv \"$0\"/pid1.tmp \"$0\"/pid1; echo ready pid=$$; "
       "exec sleep 60; fi; "
       "while [ ! -f \"$0\"/pid1 ]; do sleep 0.01; done; p=$(cat \"$0\"/pid1); "
       "while kill -0 $p 2>/dev/null; do sleep 0.01; done; echo 'rank 0: my peer is gone'; exit 1",
       dir}};
  if (TANDEM_TEST_WITH_GLOO) jobs.push_back({kWorker, "reduce_loop"});
  for (const auto& job : jobs) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      SCOPED_TRACE(job[0] + ", try " + std::to_string(attempt + 1));
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
      auto nodes = two_nodes(free_port(), {job, job}, {}, 1);
      std::vector<pid_t> ready = wait_ready(*nodes[1], 1);
      ASSERT_EQ(ready.size(), 1u) << nodes[0]->output();
      kill(ready[0], SIGKILL);
      ProcResult n0 = nodes[0]->wait(30), n1 = nodes[1]->wait(30);
      for (const auto* r : {&n0, &n1}) {
        EXPECT_EQ(r->exit_code, 128 + SIGKILL) << r->output;
        EXPECT_TRUE(std::regex_search(r->output, std::regex(R"(tandem launch: rank 1 on node 1 \(host [^)]+\) was )"
                                                            R"(killed by signal 9 \(Killed\))")))
            << r->output;
      }
      EXPECT_FALSE(contains(n0.output, "tandem launch: rank 0 ")) << n0.output;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(LaunchNodes, TheOthersStopAtOnceWhenNodeZerosLauncherDies) {
  // Node 0's launcher hosts the job's store; killed outright, it takes its ranks along. Node 1 must see
  // it gone and stop, well before its 120 s timeout, naming node 0 rather than its own rank (which, when
  // it reduces, fails with a connection error).
  std::vector<std::vector<std::string>> jobs = {{kWorker, "sleep"}};
  if (TANDEM_TEST_WITH_GLOO) jobs.push_back({kWorker, "reduce_loop"});
  for (const auto& job : jobs) {
    SCOPED_TRACE(job[1]);
    auto nodes = two_nodes(free_port(), {job, job}, {}, 2, 120);
    std::vector<pid_t> ranks = wait_ready(*nodes[1], 2);
    ASSERT_EQ(ranks.size(), 2u) << nodes[1]->output();
    ASSERT_EQ(wait_ready(*nodes[0], 2).size(), 2u) << nodes[0]->output();
    auto killed_at = std::chrono::steady_clock::now();
    kill(nodes[0]->pid(), SIGKILL);
    ProcResult n1 = nodes[1]->wait(60);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    EXPECT_FALSE(n1.timed_out);
    EXPECT_LT(took, 15) << n1.output;  // bounded by noticing the loss, not by --timeout
    EXPECT_EQ(n1.exit_code, 1) << n1.output;
    EXPECT_TRUE(contains(n1.output, "tandem launch: the launcher of node 0 (host ")) << n1.output;
    EXPECT_TRUE(contains(n1.output, ") is gone")) << n1.output;
    if (job[1] == "sleep") {
      EXPECT_TRUE(contains(n1.output, "; stopped this node's 2 ranks")) << n1.output;
    }
    EXPECT_FALSE(contains(n1.output, "tandem launch: rank ")) << n1.output;
    for (pid_t pid : ranks) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " survived";
  }
}

TEST(LaunchNodes, TheOthersNameANodeWhoseLauncherDied) {
  // Node 1's launcher is killed outright and takes its ranks along (they die with it). Node 0's ranks then
  // fail on their own: at once with a connection error when they are in a loop of all-reduces, or not at
  // all while they sleep between collectives. Either way node 0's launcher names node 1's launcher, not its
  // own rank, and stops its ranks: the first within a few seconds, the second once node 1 has been silent
  // for 10 s.
  std::vector<std::pair<std::vector<std::string>, double>> jobs = {{{kWorker, "sleep"}, 25.0}};
  if (TANDEM_TEST_WITH_GLOO) jobs.insert(jobs.begin(), {{kWorker, "reduce_loop"}, 8.0});
  for (const auto& [job, within] : jobs) {
    SCOPED_TRACE(job[1]);
    auto nodes = two_nodes(free_port(), {job, job}, {}, 1, 120);
    std::vector<pid_t> ranks = wait_ready(*nodes[0], 1);
    ASSERT_EQ(ranks.size(), 1u) << nodes[0]->output();
    std::vector<pid_t> theirs = wait_ready(*nodes[1], 1);
    ASSERT_EQ(theirs.size(), 1u) << nodes[1]->output();
    auto killed_at = std::chrono::steady_clock::now();
    kill(nodes[1]->pid(), SIGKILL);
    ProcResult n0 = nodes[0]->wait(60);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    EXPECT_FALSE(n0.timed_out);
    EXPECT_LT(took, within) << n0.output;
    EXPECT_EQ(n0.exit_code, 1) << n0.output;
    EXPECT_TRUE(std::regex_search(n0.output, std::regex(R"(tandem launch: the launcher of node 1 \(host [^)]+\) is )"
                                                        R"(gone: it has given no sign of life for )")))
        << n0.output;
    EXPECT_FALSE(contains(n0.output, "tandem launch: rank 0 ")) << n0.output;
    EXPECT_FALSE(contains(n0.output, "restarting")) << n0.output;
    for (pid_t pid : ranks) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " survived";
    for (pid_t pid : theirs) EXPECT_FALSE(process_exists(pid)) << "node 1's rank " << pid << " survived its launcher";
  }
}

TEST(LaunchNodes, CtrlCOnOneMachineStopsEveryRankOnBoth) {
  std::vector<std::string> job = {kWorker, "sleep"};
  auto nodes = two_nodes(free_port(), {job, job}, {"--max-restarts", "2"});
  std::vector<pid_t> pids = wait_ready(*nodes[0], 2);
  for (pid_t pid : wait_ready(*nodes[1], 2)) pids.push_back(pid);
  ASSERT_EQ(pids.size(), 4u);
  kill(nodes[0]->pid(), SIGINT);
  ProcResult n0 = nodes[0]->wait(10), n1 = nodes[1]->wait(10);
  EXPECT_EQ(n0.exit_code, 128 + SIGINT) << n0.output;
  EXPECT_EQ(n1.exit_code, 128 + SIGINT) << n1.output;
  EXPECT_TRUE(contains(n1.output, "the launcher of node 0 was interrupted by SIGINT; stopped this node's 2 ranks"))
      << n1.output;
  EXPECT_FALSE(contains(n0.output + n1.output, "restarting")) << n0.output << n1.output;
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " survived";
}

TEST(LaunchNodes, RestartsHappenOnEveryMachine) {
  std::vector<std::string> job = {"sh", "-c",
                                  "if [ $TANDEM_RESTART_COUNT = 0 ] && [ $TANDEM_RANK = 2 ]; then exit 5; fi; "
                                  "if [ $TANDEM_RESTART_COUNT = 0 ]; then sleep 30; fi; echo attempt=$TANDEM_RESTART_COUNT"};
  auto nodes = two_nodes(free_port(), {job, job}, {"--max-restarts", "1"});
  ProcResult n0 = nodes[0]->wait(30), n1 = nodes[1]->wait(30);
  EXPECT_EQ(n0.exit_code, 0) << n0.output;
  EXPECT_EQ(n1.exit_code, 0) << n1.output;
  EXPECT_TRUE(contains(n0.output, "restarting every rank (restart 1 of 1)")) << n0.output;
  EXPECT_TRUE(contains(n0.output, "[rank 1] attempt=1")) << n0.output;
  EXPECT_TRUE(contains(n1.output, "[rank 3] attempt=1")) << n1.output;
}

TEST(LaunchNodes, LaunchersThatDisagreeOnTheJobStop) {
  int port = free_port();
  auto n0 = std::make_unique<Proc>(std::vector<std::string>{
      kTandem, "launch", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
      std::to_string(port), "--nproc-per-node", "2", "--timeout", "20", "--", "true"});
  auto n1 = std::make_unique<Proc>(std::vector<std::string>{
      kTandem, "launch", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
      std::to_string(port), "--nproc-per-node", "3", "--timeout", "20", "--", "true"});
  ProcResult a = n0->wait(30), b = n1->wait(30);
  for (const auto* r : {&a, &b}) {
    EXPECT_EQ(r->exit_code, 2) << r->output;
    EXPECT_TRUE(contains(r->output, "start every node's launcher with the same values")) << r->output;
    EXPECT_LT(r->seconds, 10);
  }
  // A node rank taken twice (the job runs long enough for the second claim to meet the first).
  port = free_port();
  auto twice = two_nodes(port, {{"sleep", "2"}, {"sleep", "2"}});
  auto third = std::make_unique<Proc>(std::vector<std::string>{
      kTandem, "launch", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
      std::to_string(port), "--nproc-per-node", "2", "--timeout", "20", "--", "true"});
  ProcResult t = third->wait(30);
  ProcResult zero = twice[0]->wait(30);
  ProcResult one = twice[1]->wait(30);
  EXPECT_TRUE(contains(t.output + one.output, "two launchers joined as --node-rank 1"))
      << t.output << "\n--\n" << one.output << "\n--\n" << zero.output << t.seconds << " " << zero.seconds;
}

}  // namespace

