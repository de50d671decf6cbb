#pragma once
// Where a tensor lives.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

enum class DeviceType : uint8_t { CPU, CUDA };

/// A device: the CPU or one CUDA GPU by index.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  /// Parses "cpu", "cuda" or "cuda:N"; throws tandem::Error naming the text otherwise.
  static Device parse(std::string_view s);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

/// Number of CUDA GPUs usable by this process: 0 without the CUDA backend or without GPUs.
int cuda_device_count();
/// True when at least one CUDA GPU is usable.
inline bool cuda_available() { return cuda_device_count() > 0; }
/// The GPU's product name as its driver reports it ("NVIDIA H200"); "cpu" for the CPU.
std::string device_name(Device d);
/// Throws tandem::Error when the device cannot be used in this process (e.g. cuda:3 on a 2-GPU node).
void check_device(Device d);
/// Waits until all work queued on the device is done.
void synchronize(Device d);
/// Memory held through a device's caching allocator, in bytes (sizes as rounded by the allocator).
struct MemoryStats {
  size_t in_use = 0;       // held by live tensors now
  size_t peak_in_use = 0;  // the most held at once since the last reset_peak_memory
  size_t cached = 0;       // freed and kept for reuse
  size_t graphs = 0;       // reserved for the tensors of recorded steps (DeviceGraph), not in the above
  size_t graphs_peak_in_use = 0;  // the most those tensors held at once, summed over the recordings
};
MemoryStats memory_stats(Device d);
/// Starts a new peak measurement at the current use.
void reset_peak_memory(Device d);

/// Memory a device has for tensors, in bytes (0 where it cannot be told).
struct DeviceMemory {
  size_t free = 0;   // CUDA: the driver's free memory, plus the blocks tandem's allocator keeps cached for reuse;
                     // the CPU: the host's available memory (MemAvailable, or the cgroup's limit less its use when
                     // lower), plus the blocks cached
  size_t total = 0;  // the device's (or the host's, or the cgroup's limit)
};
DeviceMemory device_memory(Device d);

/// Marks the start (on) or end of the work an external GPU profiler records when told to wait for it
/// (Nsight Compute's --profile-from-start off); does nothing on the CPU.
void profile_range(Device d, bool on);

/// Sets the number of CPU threads used by kernels and BLAS (0 = all hardware threads).
void set_num_threads(int n);
/// The number of CPU threads kernels use.
int num_threads();

}  // namespace tandem
