// What the subcommands that start ranks share: threads per rank, the device of a rank.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cli/commands.h"

namespace tandem::cli {
int default_threads_per_rank(int local_size) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_size));
}

int cuda_index_for_rank(int local_rank, const char* visible_devices) {
  // srun --gpus-per-task and similar launchers give each rank one GPU of its own through
  // CUDA_VISIBLE_DEVICES; that GPU is then device 0 of the rank.
  const bool one_visible = visible_devices && *visible_devices && !std::strchr(visible_devices, ',');
  return one_visible ? 0 : local_rank;
}

Device device_for_rank(const std::string& spec, const dist::DistEnv& env) {
  Device device = Device::parse(spec);
  if (device.is_cuda() && spec == "cuda")
    device = Device::cuda(cuda_index_for_rank(env.local_rank, std::getenv("CUDA_VISIBLE_DEVICES")));
  check_device(device);
  return device;
}
void add_cuda_graph_option(CLI::App& app, bool& on) {
  app.add_option_function<std::string>(
         "--cuda-graph", [&on](const std::string& v) { on = v == "on"; },
         "on: after a few eager steps of one batch shape, record the step once (a CUDA graph) and replay it; "
         "steps that cannot be recorded run eagerly, saying why (default on)")
      ->check(CLI::IsMember({"on", "off"}));
}

}  // namespace tandem::cli
