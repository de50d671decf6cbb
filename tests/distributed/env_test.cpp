// Recognising launchers from environment variables (without starting anything).
#include <gtest/gtest.h>

#include <map>

#include "distributed/group.h"
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

}  // namespace
