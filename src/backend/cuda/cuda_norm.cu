// CUDA kernels: batch normalisation over N, H, W per channel. One block owns a channel, so the
// statistics, the running-average update and the normalisation are one launch, reductions are in
// double and in a fixed order (deterministic), and no host synchronisation is needed. The formulas
// follow the CPU backend's, so both round alike.
#include <initializer_list>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

constexpr int kNormBlock = 512;

struct ChannelView {
  int64_t n, c, s;
  /// Offset of element j (in [0, n*s)) of channel ch.
  __device__ __forceinline__ int64_t at(int64_t ch, int64_t j) const {
    const int64_t img = j / s;
    return (img * c + ch) * s + (j - img * s);
  }
};

// Two passes (the mean, then centred squares) keep the variance accurate when |mean| >> std; the
// normalisation is y = x * scale + shift with scale and shift formed in double, as on the CPU.
__global__ void bn_train_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                const float* __restrict__ beta, float* __restrict__ running_mean,
                                float* __restrict__ running_var, float* __restrict__ y, float* __restrict__ save_mean,
                                float* __restrict__ save_invstd, ChannelView v, double momentum, double eps) {
  __shared__ double scratch[32];
  __shared__ float affine[2];
  const int64_t m = v.n * v.s;
  const double md = static_cast<double>(m);
  for (int64_t ch = blockIdx.x; ch < v.c; ch += gridDim.x) {
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) sum += static_cast<double>(x[v.at(ch, j)]);
    const double mean = kern::block_sum(sum, scratch) / md;
    double sq = 0.0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const double d = static_cast<double>(x[v.at(ch, j)]) - mean;
      sq += d * d;
    }
    const double var = kern::block_sum(sq, scratch) / md;
    if (threadIdx.x == 0) {
      const double invstd = 1.0 / sqrt(var + eps);
      save_mean[ch] = static_cast<float>(mean);
      save_invstd[ch] = static_cast<float>(invstd);
      running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mean);
      running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * var * md / (md - 1.0));
      const double scale = invstd * gamma[ch];
      affine[0] = static_cast<float>(scale);
      affine[1] = static_cast<float>(beta[ch] - mean * scale);
    }
    __syncthreads();
    const float scale = affine[0], shift = affine[1];
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const int64_t o = v.at(ch, j);
      y[o] = x[o] * scale + shift;
    }
    __syncthreads();  // affine is rewritten for the next channel
  }
}

__global__ void bn_eval_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                               const float* __restrict__ beta, const float* __restrict__ mean,
                               const float* __restrict__ var, float* __restrict__ y, int64_t total, int64_t c,
                               int64_t s, double eps) {
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t ch = (i / s) % c;
    const double scale = gamma[ch] / sqrt(static_cast<double>(var[ch]) + eps);
    y[i] = x[i] * static_cast<float>(scale) + static_cast<float>(beta[ch] - mean[ch] * scale);
  }
}

// With xhat = (x - mean) * invstd: dbeta = sum dy, dgamma = sum dy * xhat, and
// dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma), folded into dx = dy * k + x * u + w.
__global__ void bn_backward_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                   const float* __restrict__ gamma, const float* __restrict__ save_mean,
                                   const float* __restrict__ save_invstd, float* __restrict__ dx,
                                   float* __restrict__ dgamma, float* __restrict__ dbeta, ChannelView v) {
  __shared__ double scratch[32];
  __shared__ float coef[3];
  const int64_t m = v.n * v.s;
  const double md = static_cast<double>(m);
  for (int64_t ch = blockIdx.x; ch < v.c; ch += gridDim.x) {
    const double mean = save_mean[ch], invstd = save_invstd[ch];
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const int64_t o = v.at(ch, j);
      const double g = dy[o];
      sdy += g;
      sdyx += g * (static_cast<double>(x[o]) - mean);
    }
    sdy = kern::block_sum(sdy, scratch);
    sdyx = kern::block_sum(sdyx, scratch);
    if (threadIdx.x == 0) {
      const double dg = sdyx * invstd;
      dbeta[ch] = static_cast<float>(sdy);
      dgamma[ch] = static_cast<float>(dg);
      const double k = gamma[ch] * invstd;
      const double u = -k * invstd * dg / md;
      coef[0] = static_cast<float>(k);
      coef[1] = static_cast<float>(u);
      coef[2] = static_cast<float>(-k * sdy / md - u * mean);
    }
    __syncthreads();
    const float k = coef[0], u = coef[1], w = coef[2];
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const int64_t o = v.at(ch, j);
      dx[o] = dy[o] * k + x[o] * u + w;
    }
    __syncthreads();
  }
}

ChannelView channel_view(const Tensor& x) {
  TANDEM_ASSERT(x.dim() >= 2, "batch norm of ", x.str());
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, c ? x.numel() / (n * c) : 0};
}

unsigned channel_blocks(int64_t c) { return static_cast<unsigned>(std::min<int64_t>(c, kern::kMaxBlocks)); }
}  // namespace

void CudaBackend::batch_norm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                           Tensor& running_mean, Tensor& running_var, double momentum, double eps,
                                           Tensor& y, Tensor& save_mean, Tensor& save_invstd) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &gamma, &beta, &running_mean, &running_var, &y, &save_mean, &save_invstd})
    require_f32(*t, "batch_norm2d");
  const ChannelView v = channel_view(x);
  TANDEM_CHECK(v.n * v.s > 1, "batch_norm2d: training needs more than one value per channel, got ", x.str());
  if (v.c == 0) return;
  DeviceState& st = state_for(y);
  bn_train_kernel<<<channel_blocks(v.c), kNormBlock, 0, st.stream>>>(
      x.data<float>(), gamma.data<float>(), beta.data<float>(), running_mean.data<float>(), running_var.data<float>(),
      y.data<float>(), save_mean.data<float>(), save_invstd.data<float>(), v, momentum, eps);
  TANDEM_CUDA_LAUNCH_CHECK("bn_train_kernel");
}

void CudaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          const Tensor& running_mean, const Tensor& running_var, double eps,
                                          Tensor& y) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &gamma, &beta, &running_mean, &running_var, &y}) require_f32(*t, "batch_norm2d");
  const ChannelView v = channel_view(x);
  const int64_t total = x.numel();
  if (total == 0) return;
  DeviceState& st = state_for(y);
  bn_eval_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(
      x.data<float>(), gamma.data<float>(), beta.data<float>(), running_mean.data<float>(), running_var.data<float>(),
      y.data<float>(), total, v.c, v.s, eps);
  TANDEM_CUDA_LAUNCH_CHECK("bn_eval_kernel");
}

void CudaBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                      const Tensor& save_invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dy, &x, &gamma, &save_mean, &save_invstd, &dx, &dgamma, &dbeta})
    require_f32(*t, "batch_norm2d backward");
  const ChannelView v = channel_view(x);
  if (v.c == 0) return;
  DeviceState& st = state_for(dx);
  bn_backward_kernel<<<channel_blocks(v.c), kNormBlock, 0, st.stream>>>(
      dy.data<float>(), x.data<float>(), gamma.data<float>(), save_mean.data<float>(), save_invstd.data<float>(),
      dx.data<float>(), dgamma.data<float>(), dbeta.data<float>(), v);
  TANDEM_CUDA_LAUNCH_CHECK("bn_backward_kernel");
}

}  // namespace tandem::backend
