#include "tandem/graph.h"

#include <chrono>

#include "backend/backend.h"
#include "tandem/error.h"
#include "tandem/profiler.h"

namespace tandem {

bool DeviceGraph::supported(Device device) { return device.is_cuda() && cuda_device_count() > device.index; }

DeviceGraph::DeviceGraph(Device device, const std::function<void()>& body) : device_(device) {
  TANDEM_CHECK(device.is_cuda(), "a DeviceGraph records CUDA work; ", device.str(), " runs its kernels as they come");
  check_device(device);
  work_ = backend::backend_for(device).capture(device.index, body);
}

DeviceGraph::~DeviceGraph() = default;

void DeviceGraph::replay() {
  if (!profiler::detail::timing(device_, profiler::Phase::Recorded)) {
    work_->replay();
    profiler::end_iteration(device_);
    return;
  }
  // A replay runs its kernels as one launch: profiled, it is timed whole, as one iteration.
  synchronize(device_);
  const auto start = std::chrono::steady_clock::now();
  work_->replay();
  synchronize(device_);
  profiler::detail::add(device_, "recorded_step", profiler::Phase::Recorded,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  profiler::end_iteration(device_);
}

size_t DeviceGraph::pool_bytes() const { return work_->pool_bytes(); }

}  // namespace tandem
