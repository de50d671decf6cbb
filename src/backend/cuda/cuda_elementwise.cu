// CUDA kernels: elementwise arithmetic, activations and their derivatives, bias broadcast and
// reduction, and whole-tensor sums.
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

template <Binary OP, typename T>
__device__ __forceinline__ T apply_binary(T a, T b) {
  if constexpr (OP == Binary::Add) return a + b;
  if constexpr (OP == Binary::Sub) return a - b;
  if constexpr (OP == Binary::Mul) return a * b;
  if constexpr (OP == Binary::Div) return a / b;
  // Floats: a NaN in either operand propagates; ties give the second operand (as on the CPU).
  if constexpr (OP == Binary::Max) {
    if constexpr (std::is_floating_point_v<T>)
      return (a > b || a != a) ? a : b;
    else
      return a > b ? a : b;
  }
  if constexpr (OP == Binary::Min) {
    if constexpr (std::is_floating_point_v<T>)
      return (a < b || a != a) ? a : b;
    else
      return a < b ? a : b;
  }
}

template <Binary OP, typename T>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) out[i] = apply_binary<OP>(a[i], b[i]);
}

template <Unary OP>
__device__ __forceinline__ float apply_unary(float x) {
  if constexpr (OP == Unary::Neg) return -x;
  if constexpr (OP == Unary::Relu) return x < 0.0f ? 0.0f : x;
  if constexpr (OP == Unary::Sigmoid) return 1.0f / (1.0f + expf(-x));
  if constexpr (OP == Unary::Tanh) return tanhf(x);
  if constexpr (OP == Unary::Exp) return expf(x);
  if constexpr (OP == Unary::Log) return logf(x);
  if constexpr (OP == Unary::Abs) return fabsf(x);
  if constexpr (OP == Unary::Sqrt) return sqrtf(x);
}

template <Unary OP>
__global__ void unary_kernel(const float* a, float* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) out[i] = apply_unary<OP>(a[i]);
}

template <Unary OP>
__global__ void unary_backward_kernel(const float* g, const float* y, float* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    const float yi = y[i];
    if constexpr (OP == Unary::Relu) out[i] = yi > 0.0f ? g[i] : 0.0f;
    if constexpr (OP == Unary::Sigmoid) out[i] = g[i] * yi * (1.0f - yi);
    if constexpr (OP == Unary::Tanh) out[i] = g[i] * (1.0f - yi * yi);
  }
}

__global__ void affine_kernel(const float* a, float alpha, float beta, float* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) out[i] = fmaf(alpha, a[i], beta);
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) y[i] = fmaf(alpha, x[i], y[i]);
}

__global__ void bias_add_rows_kernel(const float* x, const float* b, float* out, int64_t total, int64_t c) {
  for (int64_t i = thread_index(); i < total; i += thread_count()) out[i] = x[i] + b[i % c];
}

__global__ void bias_add_planes_kernel(const float* x, const float* b, float* out, int64_t total, int64_t c,
                                       int64_t s) {
  for (int64_t i = thread_index(); i < total; i += thread_count()) out[i] = x[i] + b[(i / s) % c];
}

// out[c] = sum over rows of g [n, c]: a block covers 32 columns, its 8 thread rows stride over n.
constexpr int kColTile = 32, kRowThreads = 8;
__global__ void bias_grad_rows_kernel(const float* g, float* out, int64_t n, int64_t c) {
  __shared__ double part[kRowThreads][kColTile + 1];
  for (int64_t col0 = int64_t(blockIdx.x) * kColTile; col0 < c; col0 += int64_t(gridDim.x) * kColTile) {
    const int64_t col = col0 + threadIdx.x;
    double acc = 0.0;
    if (col < c)
      for (int64_t r = threadIdx.y; r < n; r += kRowThreads) acc += g[r * c + col];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
      double t = 0.0;
      for (int k = 0; k < kRowThreads; ++k) t += part[k][threadIdx.x];
      out[col] = static_cast<float>(t);
    }
    __syncthreads();
  }
}

// out[c] = sum over n and s of g [n, c, s]: a block per channel.
__global__ void bias_grad_planes_kernel(const float* g, float* out, int64_t n, int64_t c, int64_t s) {
  __shared__ double scratch[32];
  const int64_t per_channel = n * s;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < per_channel; j += blockDim.x) {
      const int64_t img = j / s;
      acc += g[(img * c + ch) * s + (j - img * s)];
    }
    acc = kern::block_sum(acc, scratch);
    if (threadIdx.x == 0) out[ch] = static_cast<float>(acc);
  }
}

// Floats are summed in double, integers in int64; a single-block grid writes the result directly,
// a larger one leaves one partial per block for sum_finish_kernel (a fixed order: deterministic).
template <typename T>
using SumAcc = std::conditional_t<std::is_floating_point_v<T>, double, long long>;

constexpr int kSumBlocks = 1024;

template <typename T, typename Out>
__global__ void sum_kernel(const T* x, int64_t n, SumAcc<T>* partial, Out* out) {
  __shared__ SumAcc<T> scratch[32];
  SumAcc<T> acc = 0;
  for (int64_t i = thread_index(); i < n; i += thread_count()) acc += static_cast<SumAcc<T>>(x[i]);
  acc = kern::block_sum(acc, scratch);
  if (threadIdx.x != 0) return;
  if (gridDim.x == 1)
    *out = static_cast<Out>(acc);
  else
    partial[blockIdx.x] = acc;
}

template <typename Acc, typename Out>
__global__ void sum_finish_kernel(const Acc* partial, int count, Out* out) {
  __shared__ Acc scratch[32];
  Acc acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = kern::block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = static_cast<Out>(acc);
}

template <typename T, typename Out>
void launch_sum(const T* x, int64_t n, Out* out, Allocator& alloc, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(n, 512), kSumBlocks));
  if (blocks == 1) {
    sum_kernel<T, Out><<<1, 512, 0, stream>>>(x, n, nullptr, out);
    TANDEM_CUDA_LAUNCH_CHECK("sum_kernel");
    return;
  }
  Scratch partial(alloc, blocks * sizeof(SumAcc<T>));
  sum_kernel<T, Out><<<blocks, 512, 0, stream>>>(x, n, partial.as<SumAcc<T>>(), out);
  TANDEM_CUDA_LAUNCH_CHECK("sum_kernel");
  sum_finish_kernel<SumAcc<T>, Out><<<1, 1024, 0, stream>>>(partial.as<SumAcc<T>>(), static_cast<int>(blocks), out);
  TANDEM_CUDA_LAUNCH_CHECK("sum_finish_kernel");
}

template <typename T>
void launch_binary(Binary op, const T* a, const T* b, T* out, int64_t n, cudaStream_t st) {
  const unsigned g = blocks_for(n);
  switch (op) {
    case Binary::Add: binary_kernel<Binary::Add><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Sub: binary_kernel<Binary::Sub><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Mul: binary_kernel<Binary::Mul><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Div: binary_kernel<Binary::Div><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Max: binary_kernel<Binary::Max><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Min: binary_kernel<Binary::Min><<<g, kBlock, 0, st>>>(a, b, out, n); break;
  }
  TANDEM_CUDA_LAUNCH_CHECK("binary_kernel");
}
}  // namespace

void CudaBackend::binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) {
  TANDEM_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "binary: operands of dtypes ",
               dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), " and ", dtype_name(out.dtype()), " differ");
  TANDEM_ASSERT(a.numel() == out.numel() && b.numel() == out.numel(), "binary ", a.str(), " ", b.str(), " ", out.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceState& st = state_for(out);
  switch (out.dtype()) {
    case DType::f32:
      return launch_binary(op, a.data<float>(), b.data<float>(), out.data<float>(), n, st.stream);
    case DType::i32:
      return launch_binary(op, a.data<int32_t>(), b.data<int32_t>(), out.data<int32_t>(), n, st.stream);
    case DType::i64:
      return launch_binary(op, a.data<int64_t>(), b.data<int64_t>(), out.data<int64_t>(), n, st.stream);
    default:
      TANDEM_CHECK(false, "binary: dtype ", dtype_name(out.dtype()), " is not supported on CUDA (use f32, i32 or i64)");
  }
}

void CudaBackend::unary(Unary op, const Tensor& a, Tensor& out) {
  require_f32(a, "unary");
  require_f32(out, "unary");
  TANDEM_ASSERT(a.numel() == out.numel(), "unary ", a.str(), " ", out.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceState& st = state_for(out);
  const float* x = a.data<float>();
  float* y = out.data<float>();
  const unsigned g = blocks_for(n);
  switch (op) {
    case Unary::Neg: unary_kernel<Unary::Neg><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
    case Unary::Relu: unary_kernel<Unary::Relu><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
    case Unary::Sigmoid: unary_kernel<Unary::Sigmoid><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
    case Unary::Tanh: unary_kernel<Unary::Tanh><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
    case Unary::Exp: unary_kernel<Unary::Exp><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
    case Unary::Log: unary_kernel<Unary::Log><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
    case Unary::Abs: unary_kernel<Unary::Abs><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
    case Unary::Sqrt: unary_kernel<Unary::Sqrt><<<g, kBlock, 0, st.stream>>>(x, y, n); break;
  }
  TANDEM_CUDA_LAUNCH_CHECK("unary_kernel");
}

void CudaBackend::affine(const Tensor& a, double alpha, double beta, Tensor& out) {
  require_f32(a, "affine");
  require_f32(out, "affine");
  TANDEM_ASSERT(a.numel() == out.numel(), "affine ", a.str(), " ", out.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceState& st = state_for(out);
  affine_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(a.data<float>(), static_cast<float>(alpha),
                                                          static_cast<float>(beta), out.data<float>(), n);
  TANDEM_CUDA_LAUNCH_CHECK("affine_kernel");
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  require_f32(x, "axpy");
  require_f32(y, "axpy");
  TANDEM_ASSERT(x.numel() == y.numel(), "axpy ", x.str(), " ", y.str());
  const int64_t n = y.numel();
  if (n == 0) return;
  DeviceState& st = state_for(y);
  axpy_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(static_cast<float>(alpha), x.data<float>(), y.data<float>(), n);
  TANDEM_CUDA_LAUNCH_CHECK("axpy_kernel");
}

void CudaBackend::unary_backward(Unary op, const Tensor& grad, const Tensor& y, Tensor& out) {
  require_f32(grad, "unary_backward");
  require_f32(y, "unary_backward");
  require_f32(out, "unary_backward");
  TANDEM_ASSERT(grad.numel() == out.numel() && y.numel() == out.numel(), "unary_backward shapes");
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceState& st = state_for(out);
  const unsigned g = blocks_for(n);
  const float *gp = grad.data<float>(), *yp = y.data<float>();
  float* op_ = out.data<float>();
  switch (op) {
    case Unary::Relu: unary_backward_kernel<Unary::Relu><<<g, kBlock, 0, st.stream>>>(gp, yp, op_, n); break;
    case Unary::Sigmoid: unary_backward_kernel<Unary::Sigmoid><<<g, kBlock, 0, st.stream>>>(gp, yp, op_, n); break;
    case Unary::Tanh: unary_backward_kernel<Unary::Tanh><<<g, kBlock, 0, st.stream>>>(gp, yp, op_, n); break;
    default:
      TANDEM_CHECK(false, "unary_backward: only relu, sigmoid and tanh are differentiated from their output");
  }
  TANDEM_CUDA_LAUNCH_CHECK("unary_backward_kernel");
}

void CudaBackend::bias_add(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) {
  require_f32(x, "bias_add");
  require_f32(b, "bias_add");
  require_f32(out, "bias_add");
  const int64_t total = n * c * s;
  TANDEM_ASSERT(x.numel() == total && out.numel() == total && b.numel() == c, "bias_add ", x.str(), " + ", b.str(),
                " as [", n, ", ", c, ", ", s, "]");
  if (total == 0) return;
  DeviceState& st = state_for(out);
  if (s == 1)
    bias_add_rows_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(x.data<float>(), b.data<float>(),
                                                                      out.data<float>(), total, c);
  else
    bias_add_planes_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(x.data<float>(), b.data<float>(),
                                                                        out.data<float>(), total, c, s);
  TANDEM_CUDA_LAUNCH_CHECK("bias_add_kernel");
}

void CudaBackend::bias_grad(const Tensor& g, int64_t n, int64_t c, int64_t s, Tensor& out) {
  require_f32(g, "bias_grad");
  require_f32(out, "bias_grad");
  TANDEM_ASSERT(g.numel() == n * c * s && out.numel() == c, "bias_grad ", g.str(), " -> ", out.str());
  if (c == 0) return;
  DeviceState& st = state_for(out);
  if (n * s == 0) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), st.stream));
    return;
  }
  if (s == 1) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((c + kColTile - 1) / kColTile, kern::kMaxBlocks));
    bias_grad_rows_kernel<<<blocks, dim3(kColTile, kRowThreads), 0, st.stream>>>(g.data<float>(), out.data<float>(),
                                                                                 n, c);
  } else {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(c, kern::kMaxBlocks));
    bias_grad_planes_kernel<<<blocks, kBlock, 0, st.stream>>>(g.data<float>(), out.data<float>(), n, c, s);
  }
  TANDEM_CUDA_LAUNCH_CHECK("bias_grad_kernel");
}

void CudaBackend::sum(const Tensor& x, Tensor& out) {
  TANDEM_ASSERT(out.numel() == 1, "sum into ", out.str());
  DeviceState& st = state_for(out);
  Allocator& alloc = allocator(st.device);
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::f32:
      TANDEM_CHECK(out.dtype() == DType::f32, "sum: an f32 tensor sums into f32, not ", dtype_name(out.dtype()));
      return launch_sum(x.data<float>(), n, out.data<float>(), alloc, st.stream);
    case DType::i32:
      if (out.dtype() == DType::i32) return launch_sum(x.data<int32_t>(), n, out.data<int32_t>(), alloc, st.stream);
      TANDEM_CHECK(out.dtype() == DType::i64, "sum: an i32 tensor sums into i32 or i64, not ",
                   dtype_name(out.dtype()));
      return launch_sum(x.data<int32_t>(), n, out.data<int64_t>(), alloc, st.stream);
    case DType::i64:
      TANDEM_CHECK(out.dtype() == DType::i64, "sum: an i64 tensor sums into i64, not ", dtype_name(out.dtype()));
      return launch_sum(x.data<int64_t>(), n, out.data<int64_t>(), alloc, st.stream);
    default:
      TANDEM_CHECK(false, "sum: dtype ", dtype_name(x.dtype()), " is not supported on CUDA (use f32, i32 or i64)");
  }
}

}  // namespace tandem::backend
