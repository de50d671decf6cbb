// Recognising launchers from environment variables (without starting anything).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "distributed/rendezvous/group.h"
#include "tandem/error.h"

using namespace tandem;
using namespace tandem::dist;
using tandem::dist::detail::EnvSpec;

namespace {

EnvSpec read_vars(const std::map<std::string, std::string>& vars) {
  return tandem::dist::detail::read_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    read_vars(vars);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input);
    return e.what();
  }
  return "";
}

TEST(Env, NothingSetIsASingleProcess) {
  EnvSpec s = read_vars({});
  EXPECT_EQ(s.env.launcher, "none");
  EXPECT_EQ(s.env.world_size, 1);
  EXPECT_EQ(s.env.rank, 0);
  EXPECT_FALSE(s.mpi);
  EXPECT_FALSE(s.host_store);
  EXPECT_EQ(s.store_port, 0);
  EXPECT_FALSE(s.timeout.has_value());
}

TEST(Env, TandemLaunch) {
  EnvSpec s = read_vars({{"TANDEM_RANK", "2"}, {"TANDEM_WORLD_SIZE", "4"}, {"TANDEM_LOCAL_RANK", "0"},
                    {"TANDEM_LOCAL_SIZE", "2"}, {"TANDEM_STORE_ADDR", "127.0.0.1:4000"}, {"TANDEM_TIMEOUT", "1.5"},
                    {"RANK", "9"}, {"WORLD_SIZE", "10"}});  // tandem's own variables win
  EXPECT_EQ(s.env.launcher, "tandem");
  EXPECT_EQ(s.env.rank, 2);
  EXPECT_EQ(s.env.world_size, 4);
  EXPECT_EQ(s.env.local_rank, 0);
  EXPECT_EQ(s.env.local_size, 2);
  EXPECT_EQ(s.store_host, "127.0.0.1");
  EXPECT_EQ(s.store_port, 4000);
  EXPECT_FALSE(s.host_store);
  EXPECT_EQ(s.timeout.value(), std::chrono::milliseconds(1500));
}

TEST(Env, TandemLaunchLocalRankDefaultsToRank) {
  EnvSpec s = read_vars({{"TANDEM_RANK", "1"}, {"TANDEM_WORLD_SIZE", "3"}, {"TANDEM_STORE_ADDR", "[::1]:9"}});
  EXPECT_EQ(s.env.local_rank, 1);
  EXPECT_EQ(s.env.local_size, 3);
  EXPECT_EQ(s.store_host, "::1");
  EXPECT_EQ(s.store_port, 9);
}

TEST(Env, BadTandemVariablesAreNamed) {
  const std::map<std::string, std::string> ok = {
      {"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "h:1"}};
  auto with = [&](const std::string& k, const std::string& v) {
    auto m = ok;
    m[k] = v;
    return m;
  };
  auto without = [&](const std::string& k) {
    auto m = ok;
    m.erase(k);
    return m;
  };
  EXPECT_NE(error_of(with("TANDEM_RANK", "2")).find("TANDEM_RANK=2 is out of range for TANDEM_WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(error_of(with("TANDEM_RANK", "x1")).find("TANDEM_RANK='x1' is not an integer"), std::string::npos);
  EXPECT_NE(error_of(with("TANDEM_WORLD_SIZE", "0")).find("TANDEM_WORLD_SIZE"), std::string::npos);
  EXPECT_NE(error_of(without("TANDEM_STORE_ADDR")).find("TANDEM_STORE_ADDR is missing"), std::string::npos);
  EXPECT_NE(error_of(with("TANDEM_STORE_ADDR", "nohostport")).find("TANDEM_STORE_ADDR='nohostport'"),
            std::string::npos);
  EXPECT_NE(error_of(with("TANDEM_STORE_ADDR", "h:99999")).find("not a TCP port"), std::string::npos);
  EXPECT_NE(error_of(with("TANDEM_LOCAL_SIZE", "3")).find("TANDEM_LOCAL_SIZE=3"), std::string::npos);
  EXPECT_NE(error_of(with("TANDEM_TIMEOUT", "soon")).find("TANDEM_TIMEOUT='soon'"), std::string::npos);
  EXPECT_NE(error_of(with("TANDEM_TIMEOUT", "-1")).find("TANDEM_TIMEOUT"), std::string::npos);
}

TEST(Env, MpiLaunchesAreRecognised) {
  EXPECT_TRUE(read_vars({{"OMPI_COMM_WORLD_SIZE", "2"}}).mpi);
  EXPECT_TRUE(read_vars({{"PMI_SIZE", "2"}}).mpi);
  EXPECT_TRUE(read_vars({{"PMIX_RANK", "0"}}).mpi);
  EXPECT_EQ(read_vars({{"PMIX_RANK", "0"}}).env.launcher, "mpi");
  // ... after tandem launch's variables, before torchrun's.
  EXPECT_FALSE(read_vars({{"OMPI_COMM_WORLD_SIZE", "2"}, {"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "1"},
                     {"TANDEM_STORE_ADDR", "h:1"}})
                   .mpi);
  EXPECT_TRUE(read_vars({{"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}}).mpi);
}

TEST(Env, TorchrunStyle) {
  std::map<std::string, std::string> vars = {{"RANK", "0"},        {"WORLD_SIZE", "4"},        {"LOCAL_RANK", "0"},
                                             {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}};
  EnvSpec s = read_vars(vars);
  EXPECT_EQ(s.env.launcher, "torchrun");
  EXPECT_EQ(s.env.world_size, 4);
  EXPECT_EQ(s.env.local_size, 2);
  EXPECT_EQ(s.store_host, "node0");
  EXPECT_EQ(s.store_port, 29500);
  EXPECT_TRUE(s.host_store);  // rank 0 hosts it

  vars["RANK"] = "3";
  vars["LOCAL_RANK"] = "1";
  s = read_vars(vars);
  EXPECT_FALSE(s.host_store);
  EXPECT_EQ(s.env.rank, 3);
  EXPECT_EQ(s.env.local_rank, 1);

  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // torchrun's agent holds MASTER_PORT itself
  EXPECT_EQ(read_vars(vars).store_port, 29501);
  vars["TANDEM_STORE_PORT"] = "31000";
  EXPECT_EQ(read_vars(vars).store_port, 31000);

  vars.erase("MASTER_ADDR");
  EXPECT_NE(error_of(vars).find("MASTER_ADDR"), std::string::npos);
}

TEST(Env, RankAloneIsNotALaunch) {
  EXPECT_EQ(read_vars({{"RANK", "1"}}).env.launcher, "none");
}

TEST(Env, TandemLaunchCarriesTheJobAndItsSecret) {
  EnvSpec s = read_vars({{"TANDEM_RANK", "1"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "127.0.0.1:4000"},
                         {"TANDEM_JOB_ID", "launch-42"}, {"TANDEM_SECRET", std::string(64, 'f')},
                         {"TANDEM_RESTART_COUNT", "2"}});
  EXPECT_EQ(s.auth.job_id, "launch-42");
  EXPECT_EQ(s.auth.secret, std::string(64, 'f'));
  EXPECT_EQ(s.restart, 2);
  EXPECT_TRUE(s.warnings.empty());
}

// ---- torchrun style: the job id, and where rank 0's store listens

std::map<std::string, std::string> torchrun(int rank, const std::string& addr) {
  return {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", addr}, {"MASTER_PORT", "29500"}};
}

TEST(Env, TorchrunStoreListensOnLoopbackWhenEveryRankIsLocal) {
  EnvSpec s = read_vars(torchrun(0, "127.0.0.1"));
  EXPECT_EQ(s.bind_host, "127.0.0.1");  // never every interface
  auto vars = torchrun(0, "node0");
  vars["LOCAL_WORLD_SIZE"] = "4";  // all four ranks are here: nobody needs more than loopback
  s = read_vars(vars);
  EXPECT_EQ(s.bind_host, "127.0.0.1");
  EXPECT_EQ(s.store_host, "127.0.0.1");
  vars["LOCAL_WORLD_SIZE"] = "2";  // ranks elsewhere reach it at MASTER_ADDR
  s = read_vars(vars);
  EXPECT_EQ(s.bind_host, "node0");
  EXPECT_EQ(s.store_host, "node0");
  vars["TANDEM_SOCKET_IFNAME"] = "lo";
  EXPECT_EQ(read_vars(vars).bind_host, "127.0.0.1");
  // Without LOCAL_WORLD_SIZE nothing says that every rank is local.
  EXPECT_EQ(read_vars(torchrun(0, "node0")).bind_host, "node0");
}

TEST(Env, TorchrunJobIdComesFromTheRunId) {
  auto vars = torchrun(1, "node0");
  EXPECT_EQ(read_vars(vars).auth.job_id, "");
  vars["TORCHELASTIC_RUN_ID"] = "run7";
  EXPECT_EQ(read_vars(vars).auth.job_id, "run7");
  vars["TANDEM_JOB_ID"] = "mine";
  EXPECT_EQ(read_vars(vars).auth.job_id, "mine");
}

TEST(Env, PartOfALaunchIsWarnedAbout) {
  for (const auto& vars : std::vector<std::map<std::string, std::string>>{
           {{"WORLD_SIZE", "4"}}, {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1"}}, {{"LOCAL_RANK", "1"}}}) {
    EnvSpec s = read_vars(vars);
    EXPECT_EQ(s.env.launcher, "none");
    ASSERT_EQ(s.warnings.size(), 1u);
    EXPECT_NE(s.warnings[0].find("running as a single process"), std::string::npos) << s.warnings[0];
  }
  EXPECT_TRUE(read_vars({{"WORLD_SIZE", "1"}}).warnings.empty());
  EXPECT_TRUE(read_vars({}).warnings.empty());
}

// ---- secrets

std::string write_file(const std::string& name, const std::string& content, mode_t mode) {
  std::string path = ::testing::TempDir() + "/" + name;
  unlink(path.c_str());
  { std::ofstream(path) << content; }
  chmod(path.c_str(), mode);
  return path;
}

TEST(Env, SecretFromAFileOnlyItsOwnerReads) {
  std::string good = write_file("tandem_secret_good", "0123456789abcdef0123456789abcdef\n", 0600);
  auto vars = torchrun(1, "node0");
  vars["TANDEM_SECRET_FILE"] = good;
  EnvSpec s = read_vars(vars);
  EXPECT_EQ(s.auth.secret, "0123456789abcdef0123456789abcdef");  // the newline is dropped

  vars["TANDEM_SECRET_FILE"] = write_file("tandem_secret_shared", "0123456789abcdef0123", 0644);
  EXPECT_NE(error_of(vars).find("may be read by other users; make it private: chmod 600"), std::string::npos);
  vars["TANDEM_SECRET_FILE"] = write_file("tandem_secret_short", "short", 0600);
  EXPECT_NE(error_of(vars).find("holds 5 bytes; a secret needs at least 16"), std::string::npos);
  vars["TANDEM_SECRET_FILE"] = ::testing::TempDir() + "/no_such_secret_file";
  EXPECT_NE(error_of(vars).find("cannot open the secret file"), std::string::npos);
  std::string fifo = ::testing::TempDir() + "/tandem_secret_fifo";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  vars["TANDEM_SECRET_FILE"] = fifo;  // refused without blocking on the FIFO
  EXPECT_NE(error_of(vars).find("is not a regular file"), std::string::npos);
  vars["TANDEM_SECRET_FILE"] = good;
  vars["TANDEM_SECRET"] = "also a secret of enough length";
  EXPECT_NE(error_of(vars).find("both TANDEM_SECRET and TANDEM_SECRET_FILE are set"), std::string::npos);
  vars.erase("TANDEM_SECRET_FILE");
  vars["TANDEM_SECRET"] = "too short";
  EXPECT_NE(error_of(vars).find("TANDEM_SECRET holds 9 characters"), std::string::npos);
}

// ---- Slurm (srun)

std::map<std::string, std::string> slurm(int procid, int localid) {
  return {{"SLURM_PROCID", std::to_string(procid)}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", std::to_string(localid)},
          {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "1234"}, {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NODELIST", "node[07-08]"}, {"SLURM_NODEID", std::to_string(procid / 2)}};
}

TEST(Env, SlurmStepGivesRanksAndTheStore) {
  EnvSpec s = read_vars(slurm(3, 1));
  EXPECT_EQ(s.env.launcher, "slurm");
  EXPECT_EQ(s.env.rank, 3);
  EXPECT_EQ(s.env.world_size, 4);
  EXPECT_EQ(s.env.local_rank, 1);
  EXPECT_EQ(s.env.local_size, 2);
  EXPECT_EQ(s.store_host, "node07");  // the first host of the step
  EXPECT_EQ(s.auth.job_id, "1234.0");
  EXPECT_FALSE(s.host_store);
  EXPECT_GE(s.store_port, 20000);
  EXPECT_LT(s.store_port, 40000);
  EXPECT_TRUE(s.warnings.empty());
  EnvSpec r0 = read_vars(slurm(0, 0));
  EXPECT_TRUE(r0.host_store);
  EXPECT_EQ(r0.bind_host, "node07");
  EXPECT_EQ(r0.store_port, s.store_port);  // every task derives the same port
  auto next_step = slurm(3, 1);
  next_step["SLURM_STEP_ID"] = "1";
  EXPECT_NE(read_vars(next_step).store_port, s.store_port);  // and the next step another
}

TEST(Env, SlurmOverridesAndTaskCountsPerNode) {
  auto vars = slurm(3, 0);
  vars.erase("SLURM_NTASKS_PER_NODE");
  vars["SLURM_STEP_TASKS_PER_NODE"] = "3,1";  // node 0 runs three tasks, node 1 one
  vars["SLURM_NODEID"] = "1";
  EXPECT_EQ(read_vars(vars).env.local_size, 1);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  EXPECT_EQ(read_vars(vars).env.local_size, 2);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
  EXPECT_NE(error_of(vars).find("is not a Slurm task count list"), std::string::npos);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  vars["MASTER_ADDR"] = "head";
  vars["MASTER_PORT"] = "31000";
  EnvSpec s = read_vars(vars);
  EXPECT_EQ(s.store_host, "head");
  EXPECT_EQ(s.store_port, 31000);
  vars["TANDEM_STORE_PORT"] = "32000";
  EXPECT_EQ(read_vars(vars).store_port, 32000);

  auto one_node = slurm(0, 0);
  one_node["SLURM_NTASKS_PER_NODE"] = "4";
  EnvSpec local = read_vars(one_node);
  EXPECT_EQ(local.bind_host, "127.0.0.1");
  EXPECT_EQ(local.store_host, "127.0.0.1");
  one_node["SLURM_PROCID"] = one_node["SLURM_LOCALID"] = "3";  // and the others go there too
  EXPECT_EQ(read_vars(one_node).store_host, "127.0.0.1");
}

TEST(Env, SlurmWithoutAStepIsASingleProcessAndSaysSo) {
  // A batch script is task 0 of the job but no srun step: running there must not wait for 3 others.
  auto vars = slurm(0, 0);
  vars.erase("SLURM_STEP_ID");
  EnvSpec s = read_vars(vars);
  EXPECT_EQ(s.env.launcher, "none");
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("SLURM_NTASKS=4"), std::string::npos) << s.warnings[0];
  EXPECT_NE(s.warnings[0].find("SLURM_STEP_ID"), std::string::npos) << s.warnings[0];
  EXPECT_NE(s.warnings[0].find("srun"), std::string::npos) << s.warnings[0];
  vars["SLURM_STEP_ID"] = "4294967294";  // the batch step
  EXPECT_EQ(read_vars(vars).env.launcher, "none");
  auto partial = slurm(1, 1);
  partial.erase("SLURM_LOCALID");
  partial.erase("SLURM_NTASKS_PER_NODE");
  s = read_vars(partial);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("SLURM_LOCALID, SLURM_NTASKS_PER_NODE"), std::string::npos) << s.warnings[0];
  auto single = slurm(0, 0);
  single["SLURM_NTASKS"] = "1";
  EXPECT_TRUE(read_vars(single).warnings.empty());
}

TEST(Env, SlurmUnderMpiGoesToMpiWhenBuiltWithIt) {
  auto vars = slurm(1, 1);
  vars["PMIX_RANK"] = "1";
  EXPECT_EQ(read_vars(vars).mpi, tandem::dist::detail::kMpiBuilt);
}

TEST(Env, FirstHostOfASlurmHostList) {
  using tandem::dist::detail::first_slurm_host;
  EXPECT_EQ(first_slurm_host("node[01-03,07],gpu5", "list"), "node01");
  EXPECT_EQ(first_slurm_host("gpu5,node[1-2]", "list"), "gpu5");
  EXPECT_EQ(first_slurm_host("node7", "list"), "node7");
  EXPECT_EQ(first_slurm_host("rack[2-3]-n[010-012]", "list"), "rack2-n010");
  EXPECT_EQ(first_slurm_host("a-b[9,10]", "list"), "a-b9");
  for (const char* bad : {"node[01-03", "node[a-b]", "", "node[]", ",node1", "node]1"}) {
    try {
      first_slurm_host(bad, "SLURM_STEP_NODELIST");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_NODELIST"), std::string::npos) << e.what();
    }
  }
}

}  // namespace

