// `tandem train`'s distributed-training flags end to end on two CPU ranks, and the version source.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "e2e/cli_util.h"

using tandem::test::run_tandem;

namespace {

// The version CMake's project() declares, read from the top-level CMakeLists.txt.
std::string project_version() {
  std::ifstream f(std::string(TANDEM_SOURCE_DIR) + "/CMakeLists.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::smatch m;
  std::string text = ss.str();
  return std::regex_search(text, m, std::regex(R"(project\(tandem VERSION ([0-9.]+))")) ? m.str(1) : "";
}

}  // namespace

TEST(Version, OneSourceForEveryPlaceThatPrintsIt) {
  std::string v = project_version();
  ASSERT_FALSE(v.empty()) << "no project(tandem VERSION ...) in CMakeLists.txt";
  auto flag = run_tandem("--version");
  EXPECT_EQ(flag.status, 0) << flag.output;
  EXPECT_EQ(flag.output, "tandem " + v + "\n");
  auto info = run_tandem("info");
  EXPECT_EQ(info.status, 0) << info.output;
  EXPECT_EQ(info.output.rfind("tandem " + v + "\n", 0), 0u) << info.output;
}
