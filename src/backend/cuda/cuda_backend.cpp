// CUDA backend: device discovery, per-device state, memory, copies, synchronisation and GEMM.
#include "backend/cuda/cuda_backend.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "tandem/precision.h"

namespace tandem::backend {

namespace {
constexpr size_t kCublasWorkspace = size_t(32) << 20;  // what cuBLAS asks for on Hopper

// A machine without a driver or without a GPU must see zero devices, never an exception: CPU-only
// builds and CI link this code too.
int count_devices() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess) return n;
  (void)cudaGetLastError();
  bool expected = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorStubLibrary;
  if (!expected)
    std::fprintf(stderr, "tandem: CUDA is unusable in this process (%s: %s); running without GPUs\n",
                 cudaGetErrorName(err), cudaGetErrorString(err));
  return 0;
}
}  // namespace

Backend* make_cuda_backend() { return new CudaBackend(); }

void require_f32(const Tensor& t, const char* op) {
  TANDEM_CHECK(t.dtype() == DType::f32, op, ": dtype ", dtype_name(t.dtype()),
               " is not supported on CUDA (the CUDA kernels take f32)");
}

CudaBackend::CudaBackend() : device_count_(count_devices()) {
  for (int d = 0; d < device_count_; ++d) {
    allocators_.push_back(std::make_unique<CachingAllocator>(
        "cuda:" + std::to_string(d) + " memory",
        [d](size_t n) -> void* {
          int prev = cuda::cached_device();
          cuda::set_device(d);
          void* p = nullptr;
          cudaError_t err = cudaMalloc(&p, n);
          if (prev >= 0) cuda::set_device(prev);
          if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();  // not sticky: clear it so the retry after emptying the cache can succeed
            return nullptr;
          }
          if (err != cudaSuccess) cuda::throw_cuda_error(err, "cudaMalloc", __FILE__, __LINE__);
          return p;
        },
        [d](void* p) {
          int prev = cuda::cached_device();
          cuda::set_device(d);
          // Kernels queued before the block was cached may still use it.
          TANDEM_CUDA_CHECK(cudaStreamSynchronize(cuda::compute_stream(d)));
          TANDEM_CUDA_CHECK(cudaFree(p));
          if (prev >= 0) cuda::set_device(prev);
        }));
    states_.push_back(nullptr);
  }
  state_once_ = std::make_unique<InitOnce[]>(static_cast<size_t>(device_count_ > 0 ? device_count_ : 1));
  pinned_ = std::make_unique<PinnedAllocator>(device_count_);
}

Allocator& CudaBackend::allocator(int device) {
  TANDEM_CHECK(device >= 0 && device < device_count_, "cuda:", device, " does not exist: this process sees ",
               device_count_, " GPU(s)");
  if (Allocator* pool = capture_pool(device)) return *pool;
  return *allocators_[static_cast<size_t>(device)];
}

void* CudaBackend::take_cached_block(int device, size_t nbytes) {
  return allocators_[static_cast<size_t>(device)]->take_cached(nbytes);
}

DeviceState& CudaBackend::state(int device) {
  TANDEM_CHECK(device >= 0 && device < device_count_, "cuda:", device, " does not exist: this process sees ",
               device_count_, " GPU(s)");
  cuda::set_device(device);
  state_once_[static_cast<size_t>(device)]([&] {
    auto s = std::make_unique<DeviceState>();
    s->device = device;
    s->stream = cuda::compute_stream(device);
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, device));
    int major = 0, minor = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    s->compute_capability = major * 10 + minor;
    TANDEM_CUBLAS_CHECK(cublasCreate(&s->cublas));
    TANDEM_CUBLAS_CHECK(cublasSetStream(s->cublas, s->stream));
    // Default math: no TF32, so products agree with the CPU to f32 rounding.
    TANDEM_CUBLAS_CHECK(cublasSetMathMode(s->cublas, CUBLAS_DEFAULT_MATH));
    void* ws = allocators_[static_cast<size_t>(device)]->allocate(kCublasWorkspace);  // kept for the process
    TANDEM_CUBLAS_CHECK(cublasSetWorkspace(s->cublas, ws, kCublasWorkspace));
    s->cublas_workspace = ws;
    s->cublas_workspace_bytes = kCublasWorkspace;
    s->errors.claim = static_cast<int*>(allocators_[static_cast<size_t>(device)]->allocate(sizeof(int)));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(s->errors.claim, 0, sizeof(int), s->stream));
    s->replays = static_cast<unsigned long long*>(allocators_[static_cast<size_t>(device)]->allocate(8));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(s->replays, 0, 8, s->stream));
    void* rec = nullptr;
    TANDEM_CUDA_CHECK(cudaHostAlloc(&rec, sizeof(LabelErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(rec, 0, sizeof(LabelErrorRecord));
    s->error_host = static_cast<LabelErrorRecord*>(rec);
    void* dev_rec = nullptr;
    TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&dev_rec, rec, 0));
    s->errors.rec = static_cast<LabelErrorRecord*>(dev_rec);
    states_[static_cast<size_t>(device)] = std::move(s);
  });
  return *states_[static_cast<size_t>(device)];
}

DeviceState& CudaBackend::state_for(const Tensor& t) {
  TANDEM_ASSERT(t.device().is_cuda(), "CUDA kernel given ", t.str());
  return state(t.device().index);
}

void CudaBackend::check_errors(int device) {
  DeviceState& s = state(device);
  check_index_errors(device);
  volatile LabelErrorRecord* rec = s.error_host;
  if (!rec->flag) return;
  long long row = rec->row, label = rec->label, classes = rec->classes;
  const int kind = rec->kind;
  rec->flag = 0;
  rec->kind = 0;
  TANDEM_CUDA_CHECK(cudaMemsetAsync(s.errors.claim, 0, sizeof(int), s.stream));
  if (kind == 1)
    detail::throw_error(Error::Kind::Input,
                        detail::cat("embedding: index ", label, " at position ", row, " is outside [0, ", classes,
                                    ") on cuda:", device, " (its output row was zeros)"));
  detail::throw_error(Error::Kind::Input,
                      detail::cat("softmax_cross_entropy: label ", label, " in row ", row, " is outside [0, ",
                                  classes, ") on cuda:", device, " (the loss of that step is NaN)"));
}

void CudaBackend::copy_from_host(const void* src, void* dst, size_t nbytes, int device) {
  if (nbytes == 0) return;
  DeviceState& s = state(device);
  // Pageable sources are staged before the call returns; pinned ones are read later, which the
  // pinned allocator accounts for when the block is released.
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s.stream));
}

void CudaBackend::copy_to_host(const void* src, void* dst, size_t nbytes, int device) {
  DeviceState& s = state(device);
  if (nbytes) TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s.stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  check_errors(device);
}

void CudaBackend::copy_bytes(const void* src, void* dst, size_t nbytes, int device) {
  if (nbytes == 0 || src == dst) return;
  DeviceState& s = state(device);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s.stream));
}

std::string CudaBackend::device_name(int device) {
  TANDEM_CHECK(device >= 0 && device < device_count_, "cuda:", device, " does not exist: this process sees ",
               device_count_, " GPU(s)");
  cudaDeviceProp prop{};
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

bool CudaBackend::memory_info(int device, size_t& free, size_t& total) {
  if (device < 0 || device >= device_count_) return false;
  int prev = cuda::cached_device();
  cuda::set_device(device);
  const cudaError_t err = cudaMemGetInfo(&free, &total);
  if (prev >= 0) cuda::set_device(prev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

void CudaBackend::profile_range(bool on) { TANDEM_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop()); }

void CudaBackend::synchronize(int device) {
  DeviceState& s = state(device);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  check_errors(device);
}

void CudaBackend::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                       const Tensor& b, double beta, Tensor& c) {
  TANDEM_CHECK(a.dtype() == b.dtype() && a.dtype() == c.dtype(), "gemm: ", a.str(), ", ", b.str(), " and ", c.str(),
               " differ in dtype");
  TANDEM_CHECK(c.dtype() == DType::f32 || c.dtype() == DType::f16 || c.dtype() == DType::bf16, "gemm: dtype ",
               dtype_name(c.dtype()), " is not supported on CUDA (use f32, f16 or bf16)");
  TANDEM_ASSERT(a.numel() == m * k && b.numel() == k * n && c.numel() == m * n, "gemm shapes ", a.str(), " ",
                b.str(), " ", c.str(), " for m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = beta * C (and beta == 0 must not read C)
    if (beta == 0.0)
      fill(c, 0.0);
    else
      affine(c, beta, 0.0, c);
    return;
  }
  // 16-bit products into a fresh C take cuBLASLt's fastest algorithm where tuning is on.
  if (c.dtype() != DType::f32 && beta == 0.0 && gemm_tuning_enabled() &&
      lt_matmul(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, GemmFusion{}))
    return;
  DeviceState& s = state_for(c);
  const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
  // cuBLAS is column-major: the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
  // so the operands swap and each matrix is read as its own transpose.
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const bool small = std::max({m, n, k}) <= INT_MAX;  // the 32-bit entry points cost the host less per call
  std::lock_guard<std::mutex> lock(s.cublas_mu);
  if (c.dtype() == DType::f32 && current_precision() == Precision::f32) {  // exact f32
    const auto* pa = static_cast<const float*>(a.data_ptr());
    const auto* pb = static_cast<const float*>(b.data_ptr());
    auto* pc = static_cast<float*>(c.data_ptr());
    if (small)
      TANDEM_CUBLAS_CHECK(cublasSgemm(s.cublas, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                      static_cast<int>(k), &al, pb, static_cast<int>(ldb), pa, static_cast<int>(lda),
                                      &be, pc, static_cast<int>(n)));
    else
      TANDEM_CUBLAS_CHECK(cublasSgemm_64(s.cublas, op_b, op_a, n, m, k, &al, pb, ldb, pa, lda, &be, pc, n));
    return;
  }
  // TF32 tensor cores for f32 data; 16-bit data with f32 accumulation.
  const cudaDataType_t t = c.dtype() == DType::f32 ? CUDA_R_32F : c.dtype() == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  const cublasComputeType_t compute = c.dtype() == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (small)
    TANDEM_CUBLAS_CHECK(cublasGemmEx(s.cublas, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                     &al, b.data_ptr(), t, static_cast<int>(ldb), a.data_ptr(), t, static_cast<int>(lda),
                                     &be, c.data_ptr(), t, static_cast<int>(n), compute, CUBLAS_GEMM_DEFAULT));
  else
    TANDEM_CUBLAS_CHECK(cublasGemmEx_64(s.cublas, op_b, op_a, n, m, k, &al, b.data_ptr(), t, ldb, a.data_ptr(), t, lda,
                                        &be, c.data_ptr(), t, n, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace tandem::backend
