#include "tandem/graph.h"

#include "backend/backend.h"
#include "tandem/error.h"

namespace tandem {

bool DeviceGraph::supported(Device device) { return device.is_cuda() && cuda_device_count() > device.index; }

DeviceGraph::DeviceGraph(Device device, const std::function<void()>& body) : device_(device) {
  TANDEM_CHECK(device.is_cuda(), "a DeviceGraph records CUDA work; ", device.str(), " runs its kernels as they come");
  check_device(device);
  work_ = backend::backend_for(device).capture(device.index, body);
}

DeviceGraph::~DeviceGraph() = default;

void DeviceGraph::replay() { work_->replay(); }

size_t DeviceGraph::pool_bytes() const { return work_->pool_bytes(); }

}  // namespace tandem
