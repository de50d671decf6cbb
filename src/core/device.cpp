#include "tandem/device.h"

#include <omp.h>

#include <charconv>
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

void set_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace tandem
