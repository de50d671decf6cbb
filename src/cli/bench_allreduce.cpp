// All-reduce sweep in the nccl-tests convention: algbw = bytes / time, busbw = algbw * 2(n-1)/n,
// with a correctness check at every size.
#include "cli/bench_allreduce.h"
#include "cli/commands.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/safe_file.h"
#include "distributed/comm/raw_nccl.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/error.h"

namespace tandem::cli {

int64_t parse_size(const std::string& s) {
  TANDEM_CHECK(!s.empty(), "empty size");
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    TANDEM_CHECK(false, "invalid size '", s, "' (examples: 1024, 1K, 16M, 1G)");
  }
  std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "KiB" || unit == "k") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1048576.0;
  else if (unit == "G" || unit == "GiB") mult = 1073741824.0;
  else TANDEM_CHECK(unit.empty() || unit == "B", "invalid size unit in '", s, "' (use K, M or G)");
  TANDEM_CHECK(v > 0, "size must be positive: '", s, "'");
  return static_cast<int64_t>(v * mult);
}

std::vector<int64_t> sweep_sizes(int64_t lo, int64_t hi, int factor) {
  TANDEM_CHECK(lo >= 4 && hi >= lo, "need 4 bytes <= -b/--min <= -e/--max; got ", lo, " and ", hi);
  TANDEM_CHECK(factor >= 2, "-f/--factor must be at least 2, got ", factor);
  std::vector<int64_t> sizes;
  for (int64_t b = lo;; b *= factor) {
    sizes.push_back(b / 4 * 4);
    if (b > hi / factor) break;  // the next size would pass hi (or overflow)
  }
  return sizes;
}

void add_allreduce_options(CLI::App& app, AllReduceBenchConfig& cfg) {
  // Short names as in nccl-tests (all_reduce_perf -b 8 -e 128M -f 2 -n 20 -w 5).
  app.add_option("-b,--min", cfg.min_size, "Smallest message (bytes; K, M, G suffixes)")->capture_default_str();
  app.add_option("-e,--max", cfg.max_size, "Largest message")->capture_default_str();
  app.add_option("-f,--factor", cfg.factor, "Each size is the previous one times this")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("-n,--iters", cfg.iters, "Timed iterations per size")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("-w,--warmup", cfg.warmup, "Untimed iterations per size")->check(CLI::Range(0, 100000))->capture_default_str();
  app.add_option("--device", cfg.device, "auto (cuda when a GPU is visible, else cpu), cuda (NCCL) or cpu (Gloo)")
      ->capture_default_str();
  app.add_flag("!--no-raw", cfg.raw, "Skip timing the raw NCCL call beside tandem's");
  app.add_option("--json", cfg.json_path,
                 "Append one JSON line per size to this file (a regular file, not a symbolic link)");
}

int run_allreduce_bench(const AllReduceBenchConfig& cfg) {
  const std::vector<int64_t> sizes = sweep_sizes(parse_size(cfg.min_size), parse_size(cfg.max_size), cfg.factor);
  dist::DistEnv env = dist::detect_env();
  // Opened before joining the other ranks: a --json path that cannot be used ends the run at once.
  io::UniqueFd json;
  if (env.rank == 0 && !cfg.json_path.empty()) json = io::open_for_append(cfg.json_path, "--json file");
  const std::string spec = cfg.device != "auto" ? cfg.device : cuda_device_count() > 0 ? "cuda" : "cpu";
  Device device = device_for_rank(spec, env);
  auto comm = dist::init_communicator(device);
  const int rank = comm->rank(), world = comm->size();
  const bool lead = rank == 0;
  const double bus = world > 1 ? 2.0 * (world - 1) / world : 1.0;

  std::vector<double> raw;
  bool have_raw = cfg.raw && device.is_cuda() && world > 1;
  if (have_raw) raw = dist::raw_nccl_allreduce_seconds(sizes, cfg.iters, cfg.warmup, device.index);
  have_raw = have_raw && raw.size() == sizes.size();

  // One rank has no one to exchange with: its all-reduce moves no byte, and a time or a bandwidth of it would
  // read as a measurement. The results are still checked.
  const bool alone = world == 1;
  if (alone)
    std::fprintf(stderr, "tandem: bench allreduce runs as a single rank: an all-reduce of one rank moves no data, "
                 "so there is nothing to time (only the results are checked). Start two or more ranks: `tandem "
                 "launch -n 2 -- tandem bench allreduce ...` (--device cpu for Gloo), or mpiexec -n 2\n");
  if (lead) {
    std::printf("# tandem all-reduce, %d rank%s, %s, f32, in place; algbw = bytes / time, busbw = algbw x 2(n-1)/n "
                "(nccl-tests)\n", world, world == 1 ? "" : "s", comm->backend_name().c_str());
    std::printf("%12s %12s %10s %12s %12s %15s %8s %6s\n", "bytes", "count", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", have_raw ? "raw_busbw(GB/s)" : "", have_raw ? "ratio" : "", "check");
  }
  int failures = 0;
  for (size_t si = 0; si < sizes.size(); ++si) {
    int64_t n = sizes[si] / 4;
    // Element i of rank r holds (r + 1) * (i % 7 + 1): the sum is known from the ranks alone.
    std::vector<float> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>((rank + 1) * (i % 7 + 1));
    Tensor buf = Tensor::from_vector(host, {n}, device);
    comm->all_reduce(buf, dist::ReduceOp::Sum)->wait();
    std::vector<float> got = buf.to_vector<float>();
    const double ranks_sum = world * (world + 1) / 2.0;
    bool ok = true;
    for (int64_t i = 0; i < n && ok; ++i)
      ok = got[static_cast<size_t>(i)] == static_cast<float>(ranks_sum * static_cast<double>(i % 7 + 1));
    failures += ok ? 0 : 1;
    // Timing uses averages, which keep the (now identical) values unchanged from one call to the next.
    for (int i = 0; i < cfg.warmup; ++i) comm->all_reduce(buf, dist::ReduceOp::Avg)->wait();
    synchronize(device);
    comm->barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < cfg.iters; ++i) comm->all_reduce(buf, dist::ReduceOp::Avg)->wait();
    synchronize(device);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / cfg.iters;
    double algbw = static_cast<double>(sizes[si]) / dt / 1e9, busbw = algbw * bus;
    double raw_busbw = have_raw ? static_cast<double>(sizes[si]) / raw[si] / 1e9 * bus : 0.0;
    if (lead) {
      if (alone)
        std::printf("%12lld %12lld %10s %12s %12s %15s %8s %6s\n", static_cast<long long>(sizes[si]),
                    static_cast<long long>(n), "-", "-", "-", "", "", ok ? "ok" : "FAIL");
      else if (have_raw)
        std::printf("%12lld %12lld %10.1f %12.2f %12.2f %15.2f %8.3f %6s\n", static_cast<long long>(sizes[si]),
                    static_cast<long long>(n), dt * 1e6, algbw, busbw, raw_busbw, busbw / raw_busbw, ok ? "ok" : "FAIL");
      else
        std::printf("%12lld %12lld %10.1f %12.2f %12.2f %15s %8s %6s\n", static_cast<long long>(sizes[si]),
                    static_cast<long long>(n), dt * 1e6, algbw, busbw, "", "", ok ? "ok" : "FAIL");
      std::fflush(stdout);
      if (json) {
        nlohmann::json j{{"bytes", sizes[si]}, {"world", world}, {"backend", comm->backend_name()}, {"correct", ok}};
        if (!alone) {  // one rank measures nothing
          j["time_us"] = dt * 1e6;
          j["algbw_GBps"] = algbw;
          j["busbw_GBps"] = busbw;
        }
        if (have_raw) j["raw_busbw_GBps"] = raw_busbw;
        const std::string line = j.dump() + "\n";
        io::write_all(json.get(), line.data(), line.size(), cfg.json_path, "--json file");
      }
    }
  }
  TANDEM_RUNTIME_CHECK(failures == 0, failures, " message size(s) gave a wrong all-reduce result on rank ", rank);
  return 0;
}

}  // namespace tandem::cli
