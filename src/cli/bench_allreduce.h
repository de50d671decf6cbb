#pragma once
// Internal: `tandem bench allreduce`.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::cli {

struct AllReduceBenchConfig {
  std::string min_size = "1K";
  std::string max_size = "1G";
  int factor = 2;  // each size is the previous one times this
  int iters = 20;
  int warmup = 5;
  std::string device = "auto";  // cuda when this process sees a GPU, else cpu
  bool raw = true;  // also time the raw NCCL call in the same run
  std::string json_path;
};

void add_allreduce_options(CLI::App& app, AllReduceBenchConfig& cfg);
int run_allreduce_bench(const AllReduceBenchConfig& cfg);

/// Parses "64", "1K", "16M", "1G" (powers of 1024) into bytes.
int64_t parse_size(const std::string& s);

/// The message sizes of a sweep from lo to hi bytes, each factor times the last, rounded down to
/// whole f32 elements.
std::vector<int64_t> sweep_sizes(int64_t lo, int64_t hi, int factor);

}  // namespace tandem::cli
