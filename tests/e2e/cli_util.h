#pragma once
// Runs the tandem executable and captures what it printed and how it ended.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::test {

struct RunResult {
  int status = -1;  // exit status, or -1 when killed by a signal
  std::string output;  // stdout and stderr together
};

/// Runs `TANDEM_BIN args` through the shell.
inline RunResult run_tandem(const std::string& args) {
  RunResult r;
  std::string cmd = std::string(TANDEM_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

inline bool have_fashion_mnist() {
  return std::filesystem::exists(std::string(kFashionDir) + "/train-images-idx3-ubyte.gz");
}

/// Number of lines of `text` that contain `needle`.
inline int count_lines_with(const std::string& text, const std::string& needle) {
  int n = 0;
  size_t pos = 0;
  while ((pos = text.find(needle, pos)) != std::string::npos) {
    ++n;
    pos += needle.size();
  }
  return n;
}

/// The last "RESULT {...}" line of a bench command's output, parsed (null when there is none or it is not JSON).
inline nlohmann::json result_of(const std::string& out) {
  const size_t at = out.rfind("RESULT ");
  if (at == std::string::npos) return nullptr;
  const size_t end = out.find('\n', at);
  return nlohmann::json::parse(out.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7), nullptr,
                               false);
}

}  // namespace tandem::test
