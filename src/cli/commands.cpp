// What the subcommands that start ranks share: threads per rank, the device of a rank.
#include <algorithm>
#include <thread>

#include "cli/commands.h"

namespace tandem::cli {
int default_threads_per_rank(int local_size) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_size));
}

Device device_for_rank(const std::string& spec, const dist::DistEnv& env) {
  Device device = Device::parse(spec);
  if (device.is_cuda() && spec == "cuda") device = Device::cuda(env.local_rank);
  check_device(device);
  return device;
}
}  // namespace tandem::cli
