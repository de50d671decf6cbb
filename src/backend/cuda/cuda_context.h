#pragma once
// Internal: CUDA streams and error checks shared by the CUDA backend and the NCCL communicator.
#include <cuda_runtime.h>

namespace tandem::cuda {

/// The stream every kernel of the device runs on (created on first use, non-blocking).
cudaStream_t compute_stream(int device);
/// Makes device current for this thread (cheap when it already is).
void set_device(int device);
/// Throws tandem::Error (kind Runtime) naming the failed call and the CUDA error.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

}  // namespace tandem::cuda

/// Checks a CUDA runtime call.
#define TANDEM_CUDA_CHECK(call)                                                         \
  do {                                                                                  \
    cudaError_t err_ = (call);                                                          \
    if (err_ != cudaSuccess) ::tandem::cuda::throw_cuda_error(err_, #call, __FILE__, __LINE__); \
  } while (0)
