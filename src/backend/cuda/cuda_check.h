#pragma once
// Internal: error checks for cuBLAS, cuDNN and kernel launches, next to TANDEM_CUDA_CHECK.
#include <cublas_v2.h>
#include <cudnn.h>

#include "backend/cuda/cuda_context.h"

namespace tandem::cuda {

/// Throws tandem::Error (kind Runtime) naming the failed cuBLAS call and its status.
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line);
/// Throws tandem::Error (kind Runtime) naming the failed cuDNN call, its status and cuDNN's last message.
[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file, int line);
/// The device this thread last made current through set_device (-1 before the first call).
int cached_device();
/// True once compute_stream(device) has created the device's stream (never creates it).
bool stream_created(int device);

}  // namespace tandem::cuda

/// Checks a cuBLAS call.
#define TANDEM_CUBLAS_CHECK(call)                                                           \
  do {                                                                                      \
    cublasStatus_t st_ = (call);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) ::tandem::cuda::throw_cublas_error(st_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks a cuDNN call.
#define TANDEM_CUDNN_CHECK(call)                                                            \
  do {                                                                                      \
    cudnnStatus_t st_ = (call);                                                             \
    if (st_ != CUDNN_STATUS_SUCCESS) ::tandem::cuda::throw_cudnn_error(st_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks that the kernel launched just before was accepted (bad configuration, missing image, ...).
#define TANDEM_CUDA_LAUNCH_CHECK(kernel_name)                                               \
  do {                                                                                      \
    cudaError_t err_ = cudaGetLastError();                                                  \
    if (err_ != cudaSuccess) ::tandem::cuda::throw_cuda_error(err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)
