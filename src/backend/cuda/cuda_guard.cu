// CUDA kernels that keep a step's verdict on the device: scaling by a factor held on the device,
// restoring carried state after a non-finite step, counting skips, dynamic loss scaling and
// partialUpdate's chunk index. None of them waits for the host, so a step using them can be recorded.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

__global__ void scale_by_kernel(const float* x, const float* factor, float* out, int64_t n) {
  const float f = *factor;
  for (int64_t i = thread_index(); i < n; i += thread_count()) out[i] = x[i] * f;
}

// Four values a thread: both pointers 16-byte aligned, n a multiple of 4.
__global__ void scale_by4_kernel(const float4* x, const float* factor, float4* out, int64_t n4) {
  const float f = *factor;
  for (int64_t i = thread_index(); i < n4; i += thread_count()) {
    float4 v = x[i];
    v.x *= f, v.y *= f, v.z *= f, v.w *= f;
    out[i] = v;
  }
}

// 16-byte words when both pointers and the size allow, else bytes.
__global__ void restore_kernel(const float* verdict, const uint4* saved, uint4* dst, int64_t words) {
  if (isfinite(*verdict)) return;
  for (int64_t i = thread_index(); i < words; i += thread_count()) dst[i] = saved[i];
}

__global__ void restore_bytes_kernel(const float* verdict, const unsigned char* saved, unsigned char* dst,
                                     int64_t n) {
  if (isfinite(*verdict)) return;
  for (int64_t i = thread_index(); i < n; i += thread_count()) dst[i] = saved[i];
}

__global__ void count_nonfinite_kernel(const float* verdict, long long* counter) {
  if (!isfinite(*verdict)) ++*counter;
}

__global__ void loss_scale_kernel(const float* verdict, float* scale, long long* counts, float growth, float backoff,
                                  long long interval) {
  float next = scale[0];
  if (!isfinite(*verdict)) {
    next = scale[0] * backoff;
    counts[0] = 0;
    ++counts[1];
  } else if (++counts[0] >= interval) {
    counts[0] = 0;
    const float grown = scale[0] * growth;
    if (isfinite(grown)) next = grown;
  }
  if (next > 0.0f && next != scale[0]) {
    scale[0] = next;
    scale[1] = 1.0f / next;
  }
}

__global__ void copy_chunk_kernel(const float* src, float* dst, const long long* index, int64_t chunk,
                                  bool into_chunk, const float* verdict) {
  if (verdict && !isfinite(*verdict)) return;
  const int64_t base = *index * chunk;
  for (int64_t i = thread_index(); i < chunk; i += thread_count()) {
    if (into_chunk)
      dst[base + i] = src[i];
    else
      dst[i] = src[base + i];
  }
}

__global__ void advance_counter_kernel(long long* counter, long long modulo, const float* verdict) {
  if (verdict && !isfinite(*verdict)) return;
  *counter = (*counter + 1) % modulo;
}



void check_verdict(const Tensor& v, const char* op) {
  TANDEM_CHECK(v.numel() == 1 && v.dtype() == DType::f32 && v.device().is_cuda(), op,
               ": a verdict is one f32 value on a GPU, got ", v.str());
}

const float* optional_verdict(const Tensor& v, const char* op) {
  if (!v.defined()) return nullptr;
  check_verdict(v, op);
  return v.data<float>();
}

void check_counter(const Tensor& c, int64_t n, const char* op) {
  TANDEM_CHECK(c.dtype() == DType::i64 && c.numel() == n && c.device().is_cuda(), op, ": expected ", n,
               " i64 value(s) on a GPU, got ", c.str());
}

}  // namespace

void CudaBackend::scale_by(const Tensor& x, const Tensor& factor, Tensor& out) {
  require_f32(x, "scale_by");
  require_f32(out, "scale_by");
  check_verdict(factor, "scale_by");
  TANDEM_CHECK(x.numel() == out.numel(), "scale_by: ", x.str(), " into ", out.str());
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceState& st = state_for(x);
  const bool vec = n % 4 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
  if (vec) {
    scale_by4_kernel<<<blocks_for(n / 4), kBlock, 0, st.stream>>>(
        reinterpret_cast<const float4*>(x.data<float>()), factor.data<float>(),
        reinterpret_cast<float4*>(out.data<float>()), n / 4);
    TANDEM_CUDA_LAUNCH_CHECK("scale_by4_kernel");
    return;
  }
  scale_by_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(x.data<float>(), factor.data<float>(),
                                                           out.data<float>(), n);
  TANDEM_CUDA_LAUNCH_CHECK("scale_by_kernel");
}

void CudaBackend::restore_if_nonfinite(const Tensor& verdict, const Tensor& saved, Tensor& dst) {
  check_verdict(verdict, "restore_if_nonfinite");
  TANDEM_CHECK(saved.nbytes() == dst.nbytes(), "restore_if_nonfinite: ", saved.str(), " into ", dst.str());
  const int64_t n = static_cast<int64_t>(dst.nbytes());
  if (n == 0) return;
  DeviceState& st = state_for(dst);
  const auto a = reinterpret_cast<uintptr_t>(saved.data_ptr()), b = reinterpret_cast<uintptr_t>(dst.data_ptr());
  if (a % 16 == 0 && b % 16 == 0 && n % 16 == 0) {
    restore_kernel<<<blocks_for(n / 16), kBlock, 0, st.stream>>>(
        verdict.data<float>(), static_cast<const uint4*>(saved.data_ptr()), static_cast<uint4*>(dst.data_ptr()),
        n / 16);
    TANDEM_CUDA_LAUNCH_CHECK("restore_kernel");
  } else {
    restore_bytes_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(
        verdict.data<float>(), static_cast<const unsigned char*>(saved.data_ptr()),
        static_cast<unsigned char*>(dst.data_ptr()), n);
    TANDEM_CUDA_LAUNCH_CHECK("restore_bytes_kernel");
  }
}

void CudaBackend::count_nonfinite(const Tensor& verdict, Tensor& counter) {
  check_verdict(verdict, "count_nonfinite");
  check_counter(counter, 1, "count_nonfinite");
  DeviceState& st = state_for(counter);
  count_nonfinite_kernel<<<1, 1, 0, st.stream>>>(verdict.data<float>(),
                                                 static_cast<long long*>(counter.data_ptr()));
  TANDEM_CUDA_LAUNCH_CHECK("count_nonfinite_kernel");
}

void CudaBackend::loss_scale_update(const Tensor& verdict, Tensor& scale, Tensor& counts, double growth,
                                    double backoff, int64_t interval) {
  check_verdict(verdict, "loss_scale_update");
  check_counter(counts, 2, "loss_scale_update");
  TANDEM_CHECK(scale.dtype() == DType::f32 && scale.numel() == 2 && scale.device().is_cuda(),
               "loss_scale_update: the scale is two f32 values on a GPU, got ", scale.str());
  DeviceState& st = state_for(scale);
  loss_scale_kernel<<<1, 1, 0, st.stream>>>(verdict.data<float>(), scale.data<float>(),
                                            static_cast<long long*>(counts.data_ptr()), static_cast<float>(growth),
                                            static_cast<float>(backoff), static_cast<long long>(interval));
  TANDEM_CUDA_LAUNCH_CHECK("loss_scale_kernel");
}

void CudaBackend::copy_chunk(const Tensor& src, Tensor& dst, const Tensor& index, bool into_chunk,
                             const Tensor& verdict) {
  require_f32(src, "copy_chunk");
  require_f32(dst, "copy_chunk");
  check_counter(index, 1, "copy_chunk");
  const int64_t chunk = into_chunk ? src.numel() : dst.numel();
  const int64_t whole = into_chunk ? dst.numel() : src.numel();
  TANDEM_CHECK(chunk > 0 && whole % chunk == 0, "copy_chunk: ", whole, " elements are not whole chunks of ", chunk);
  DeviceState& st = state_for(dst);
  copy_chunk_kernel<<<blocks_for(chunk), kBlock, 0, st.stream>>>(
      src.data<float>(), dst.data<float>(), static_cast<const long long*>(index.data_ptr()), chunk, into_chunk,
      optional_verdict(verdict, "copy_chunk"));
  TANDEM_CUDA_LAUNCH_CHECK("copy_chunk_kernel");
}

void CudaBackend::advance_counter(Tensor& counter, int64_t modulo, const Tensor& verdict) {
  check_counter(counter, 1, "advance_counter");
  TANDEM_CHECK(modulo > 0, "advance_counter: modulo ", modulo);
  DeviceState& st = state_for(counter);
  advance_counter_kernel<<<1, 1, 0, st.stream>>>(static_cast<long long*>(counter.data_ptr()),
                                                  static_cast<long long>(modulo),
                                                  optional_verdict(verdict, "advance_counter"));
  TANDEM_CUDA_LAUNCH_CHECK("advance_counter_kernel");
}

}  // namespace tandem::backend
