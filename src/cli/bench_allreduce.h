#pragma once
// Internal: `tandem bench allreduce`.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace tandem::cli {

struct AllReduceBenchConfig {
  std::string min_size = "1K";
  std::string max_size = "1G";
  int iters = 20;
  int warmup = 5;
  std::string device = "cuda";
  bool raw = true;  // also time the raw NCCL call in the same run
  std::string json_path;
};

void add_allreduce_options(CLI::App& app, AllReduceBenchConfig& cfg);
int run_allreduce_bench(const AllReduceBenchConfig& cfg);

/// Parses "64", "1K", "16M", "1G" (powers of 1024) into bytes.
int64_t parse_size(const std::string& s);

}  // namespace tandem::cli
