#pragma once
// DeviceGraph: device work recorded once and replayed whole (a CUDA graph). A training step of a
// small model is hundreds of kernel launches whose host cost exceeds their GPU time; replayed, the
// step costs one launch.
#include <cstddef>
#include <functional>
#include <memory>

#include "tandem/device.h"

namespace tandem {

namespace backend {
class CapturedWork;
}

class DeviceGraph {
 public:
  /// Whether `device` can record graphs (CUDA devices can; the CPU cannot).
  static bool supported(Device device);

  /// Runs `body` once, recording the kernels and copies it queues on `device` instead of running
  /// them. Tensors allocated meanwhile come from memory reserved for this graph: those the body
  /// keeps (its outputs) are rewritten by every replay. Inputs are read from the addresses they had
  /// while recording: give a replay new data by copying it into those tensors. Host-side effects of
  /// the body (counters, generator offsets) happen once, at recording. Throws tandem::Error naming
  /// the call when the body waits for the device or reads a value back to the host; nothing is
  /// recorded then.
  DeviceGraph(Device device, const std::function<void()>& body);
  ~DeviceGraph();
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  /// Queues the recorded work on the device (returns at once; synchronize(device) waits for it).
  void replay();
  Device device() const { return device_; }
  /// Device memory reserved for the graph's tensors.
  size_t pool_bytes() const;

 private:
  Device device_;
  std::unique_ptr<backend::CapturedWork> work_;
};

}  // namespace tandem
