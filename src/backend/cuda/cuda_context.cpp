// CUDA streams, current-device caching and the error reporting shared by every CUDA source.
#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "core/init_once.h"
#include "tandem/error.h"

namespace tandem::cuda {

namespace {
constexpr int kMaxDevices = 64;

struct StreamSlot {
  InitOnce once;
  cudaStream_t stream = nullptr;
  std::atomic<bool> created{false};
};
std::array<StreamSlot, kMaxDevices> g_streams;

// cudaSetDevice is cheap but not free, and kernels call set_device on every launch.
thread_local int t_device = -1;

const char* file_name(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}
}  // namespace

int cached_device() { return t_device; }

void set_device(int device) {
  if (t_device == device) return;
  TANDEM_ASSERT(device >= 0 && device < kMaxDevices, "CUDA device index ", device);
  TANDEM_CUDA_CHECK(cudaSetDevice(device));
  t_device = device;
}

cudaStream_t compute_stream(int device) {
  TANDEM_ASSERT(device >= 0 && device < kMaxDevices, "CUDA device index ", device);
  StreamSlot& slot = g_streams[static_cast<size_t>(device)];
  // A creation that throws leaves the flag unset, so a later call retries.
  slot.once([&] {
    set_device(device);
    cudaStream_t s = nullptr;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    slot.stream = s;
    slot.created.store(true, std::memory_order_release);
  });
  return slot.stream;
}

bool stream_created(int device) {
  return device >= 0 && device < kMaxDevices &&
         g_streams[static_cast<size_t>(device)].created.load(std::memory_order_acquire);
}

namespace {
std::string device_name() { return t_device >= 0 ? "cuda:" + std::to_string(t_device) : std::string("no device yet"); }
}  // namespace

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Reading the error clears it unless it is sticky (then the context is lost anyway).
  (void)cudaGetLastError();
  detail::throw_error(Error::Kind::Runtime,
                      detail::cat(call, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") on ",
                                  device_name(), " at ", file_name(file), ":", line));
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  detail::throw_error(Error::Kind::Runtime,
                      detail::cat(call, " failed: ", cublasGetStatusName(st), " (", cublasGetStatusString(st), ") on ",
                                  device_name(), " at ", file_name(file), ":", line));
}

void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file, int line) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  detail::throw_error(Error::Kind::Runtime,
                      detail::cat(call, " failed: ", cudnnGetErrorString(st), " on ", device_name(), " at ",
                                  file_name(file), ":", line, last[0] ? " (" : "", last, last[0] ? ")" : ""));
}

}  // namespace tandem::cuda
