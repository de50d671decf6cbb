#include "tandem/device.h"

#include <omp.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "tandem/error.h"

extern "C" void openblas_set_num_threads(int);

namespace tandem {

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "cuda" || s == "gpu") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    std::string_view num = s.substr(5);
    int idx = -1;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), idx);
    TANDEM_CHECK(ec == std::errc() && p == num.data() + num.size() && idx >= 0, "invalid device '", s,
                 "' (expected cpu, cuda or cuda:N)");
    return cuda(idx);
  }
  TANDEM_CHECK(false, "invalid device '", s, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

int cuda_device_count() {
  backend::Backend* b = backend::cuda_backend();
  return b ? b->device_count() : 0;
}

void check_device(Device d) {
  if (d.is_cpu()) return;
  TANDEM_CHECK(backend::cuda_backend() != nullptr, "device ", d.str(),
               " requested, but tandem was built without CUDA: run on the CPU instead (--device cpu on the command "
               "line), or rebuild on a machine with the CUDA toolkit and cuDNN");
  int n = cuda_device_count();
  TANDEM_CHECK(n > 0, "device ", d.str(), " requested, but no CUDA GPU is visible to this process: run on the CPU "
               "instead (--device cpu on the command line), or check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES");
  TANDEM_CHECK(d.index >= 0 && d.index < n, "device ", d.str(), " does not exist: this process sees ", n,
               " GPU", n == 1 ? "" : "s", " (cuda:0", n > 1 ? " .. cuda:" + std::to_string(n - 1) : std::string(),
               ")");
}

std::string device_name(Device d) {
  if (d.is_cpu()) return "cpu";
  check_device(d);
  return backend::backend_for(d).device_name(d.index);
}

void synchronize(Device d) { backend::backend_for(d).synchronize(d.index); }

namespace {
CachingAllocator* caching_allocator(Device d) {
  check_device(d);
  return dynamic_cast<CachingAllocator*>(&backend::backend_for(d).allocator(d.index));
}
}  // namespace

void profile_range(Device d, bool on) { backend::backend_for(d).profile_range(on); }

MemoryStats memory_stats(Device d) {
  MemoryStats m;
  if (CachingAllocator* a = caching_allocator(d)) {
    m.in_use = a->bytes_in_use();
    m.peak_in_use = a->peak_bytes_in_use();
    m.cached = a->bytes_cached();
  }
  if (d.is_cuda()) {
    m.graphs = backend::backend_for(d).captured_pool_bytes(d.index);
    m.graphs_peak_in_use = backend::backend_for(d).captured_pool_peak_bytes(d.index);
  }
  return m;
}

void reset_peak_memory(Device d) {
  if (CachingAllocator* a = caching_allocator(d)) a->reset_peak();
}

namespace {
// A number of bytes read from a file holding one ("max" or nothing: 0).
size_t file_bytes(const char* path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v == "max") return 0;
  size_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  return ec == std::errc() ? n : 0;
}

// /proc/meminfo's field (kB) in bytes, 0 when absent.
size_t meminfo_bytes(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream in(line.substr(key.size() + 1));
    size_t kb = 0;
    in >> kb;
    return kb * 1024;
  }
  return 0;
}
}  // namespace

DeviceMemory device_memory(Device d) {
  DeviceMemory m;
  const size_t cached = memory_stats(d).cached;
  if (d.is_cuda()) {
    size_t free = 0, total = 0;
    if (backend::backend_for(d).memory_info(d.index, free, total)) {
      m.free = free + cached;
      m.total = total;
    }
    return m;
  }
  m.free = meminfo_bytes("MemAvailable");
  m.total = meminfo_bytes("MemTotal");
  // A container's limit (cgroup v2, then v1), where it is lower than the host's.
  size_t limit = file_bytes("/sys/fs/cgroup/memory.max"), used = file_bytes("/sys/fs/cgroup/memory.current");
  if (limit == 0) {
    limit = file_bytes("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = file_bytes("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit > 0 && (m.total == 0 || limit < m.total)) {
    m.total = limit;
    const size_t left = limit > used ? limit - used : 0;
    if (m.free == 0 || left < m.free) m.free = left;
  }
  if (m.free > 0) m.free += cached;
  return m;
}

void set_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace tandem
