// CUDA kernels: softmax and softmax cross-entropy (a warp per row), row argmax and correct-prediction counts.
// A label outside [0, classes) cannot be reported without a host sync: the kernel records it in the
// device's error record (synchronize and copy_to_host throw it) and the loss becomes NaN.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

constexpr int kWarpsPerBlock = 8;
constexpr int kFusedThreads = 1024;
constexpr int64_t kFusedLimit = int64_t(1) << 16;  // logits elements one block handles in one launch

__device__ void report_label(ErrorSink sink, int64_t row, int64_t label, int64_t classes) {
  if (atomicCAS(sink.claim, 0, 1) != 0) return;  // another thread already reported
  sink.rec->row = row;
  sink.rec->label = label;
  sink.rec->classes = classes;
  __threadfence_system();
  sink.rec->flag = 1;
}

// A row's maximum and its sum of exp(x - max), which every lane of the warp gets.
struct RowSoftmax {
  float mx;
  double se;
};

// Softmax of the row x (of c) into p, by the warp. Exponentials are f32, their sum double, as on the CPU.
__device__ RowSoftmax softmax_row(const float* __restrict__ x, float* __restrict__ p, int64_t c) {
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int64_t j = lane; j < c; j += 32) mx = fmaxf(mx, x[j]);
  mx = kern::warp_max(mx);
  double se = 0.0;
  for (int64_t j = lane; j < c; j += 32) se += static_cast<double>(expf(x[j] - mx));
  se = kern::warp_sum(se);
  const float inv = static_cast<float>(1.0 / se);
  for (int64_t j = lane; j < c; j += 32) p[j] = expf(x[j] - mx) * inv;
  return {mx, se};
}

// Softmax of one row into probs; returns the row's loss (the same value in every lane), in double.
template <typename L>
__device__ double xent_row(const float* __restrict__ logits, const L* __restrict__ labels, float* __restrict__ probs,
                           int64_t row, int64_t c, ErrorSink sink) {
  const int lane = threadIdx.x & 31;
  const float* x = logits + row * c;
  const RowSoftmax s = softmax_row(x, probs + row * c, c);
  const int64_t label = static_cast<int64_t>(labels[row]);
  if (label < 0 || label >= c) {
    if (lane == 0) report_label(sink, row, label, c);
    return NAN;
  }
  return log(s.se) - (static_cast<double>(x[label]) - static_cast<double>(s.mx));
}

// One element of targets [n, c] (one-hot rows or a distribution per row): the kernels that take labels
// take these in their place, and xent_row below reads a row of them.
struct Target {
  float w;
};

// With targets: the row's loss is sum_j -t_j log softmax_j; a class of target 0 adds nothing.
__device__ double xent_row(const float* __restrict__ logits, const Target* __restrict__ targets,
                           float* __restrict__ probs, int64_t row, int64_t c, ErrorSink) {
  const int lane = threadIdx.x & 31;
  const float* x = logits + row * c;
  const Target* t = targets + row * c;
  const RowSoftmax s = softmax_row(x, probs + row * c, c);
  const double lse = log(s.se);
  double l = 0.0;
  for (int64_t j = lane; j < c; j += 32) {
    const float w = t[j].w;
    if (w != 0.0f) l += static_cast<double>(w) * (lse - (static_cast<double>(x[j]) - static_cast<double>(s.mx)));
  }
  return kern::warp_sum(l);
}

// Small batches: one block does every row and the mean, in one launch.
template <typename L>
__global__ void xent_fused_kernel(const float* __restrict__ logits, const L* __restrict__ labels,
                                  float* __restrict__ probs, float* __restrict__ loss, int64_t n, int64_t c,
                                  ErrorSink sink) {
  __shared__ double scratch[32];
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double acc = 0.0;
  for (int64_t r = warp; r < n; r += warps) acc += xent_row(logits, labels, probs, r, c, sink);
  if ((threadIdx.x & 31) != 0) acc = 0.0;  // each row's loss counted once, from lane 0
  acc = kern::block_sum(acc, scratch);
  if (threadIdx.x == 0) *loss = static_cast<float>(acc / static_cast<double>(n));
}

template <typename L>
__global__ void xent_rows_kernel(const float* __restrict__ logits, const L* __restrict__ labels,
                                 float* __restrict__ probs, double* __restrict__ row_loss, int64_t n, int64_t c,
                                 ErrorSink sink) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = thread_index() >> 5; r < n; r += warps) {
    const double l = xent_row(logits, labels, probs, r, c, sink);
    if ((threadIdx.x & 31) == 0) row_loss[r] = l;
  }
}

__global__ void mean_kernel(const double* __restrict__ v, int64_t n, float* __restrict__ out) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += v[i];
  acc = kern::block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = static_cast<float>(acc / static_cast<double>(n));
}

template <typename L>
__global__ void xent_backward_kernel(const float* __restrict__ probs, const L* __restrict__ labels,
                                     const float* __restrict__ dloss, float* __restrict__ dlogits, int64_t n,
                                     int64_t c, ErrorSink sink) {
  const float scale = static_cast<float>(static_cast<double>(dloss[0]) / static_cast<double>(n));
  const int64_t total = n * c;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t row = i / c, col = i - row * c;
    const int64_t label = static_cast<int64_t>(labels[row]);
    if (col == 0 && (label < 0 || label >= c)) report_label(sink, row, label, c);
    const float d = probs[i] * scale;
    dlogits[i] = col == label ? d - scale : d;
  }
}

// dlogits = (probs * rowsum(targets) - targets) * dloss / n, a warp per row.
__global__ void xent_targets_backward_kernel(const float* __restrict__ probs, const float* __restrict__ targets,
                                             const float* __restrict__ dloss, float* __restrict__ dlogits, int64_t n,
                                             int64_t c) {
  const float scale = static_cast<float>(static_cast<double>(dloss[0]) / static_cast<double>(n));
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = thread_index() >> 5; r < n; r += warps) {
    const float* t = targets + r * c;
    double s = 0.0;
    for (int64_t j = lane; j < c; j += 32) s += static_cast<double>(t[j]);
    const float rs = static_cast<float>(kern::warp_sum(s));
    for (int64_t j = lane; j < c; j += 32) dlogits[r * c + j] = (probs[r * c + j] * rs - t[j]) * scale;
  }
}

// True when candidate (v, i) precedes (best, bi) in the CPU's scan order: the first NaN if there is
// one, else the first maximum. bi == c marks an empty candidate.
__device__ __forceinline__ bool precedes(float v, int64_t i, float best, int64_t bi, int64_t c) {
  if (i == c) return false;
  if (bi == c) return true;
  const bool vn = v != v, bn = best != best;
  if (vn != bn) return vn;
  if (vn || v == best) return i < bi;
  return v > best;
}

// The CPU's argmax of a row, reduced across the warp (every lane gets it).
__device__ int64_t row_argmax(const float* __restrict__ x, int64_t c) {
  const int lane = threadIdx.x & 31;
  float best = 0.0f;
  int64_t bi = c;
  for (int64_t j = lane; j < c; j += 32) {
    const float v = x[j];
    if (precedes(v, j, best, bi, c)) {
      best = v;
      bi = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (precedes(ov, oi, best, bi, c)) {
      best = ov;
      bi = oi;
    }
  }
  return bi;
}

__global__ void argmax_kernel(const float* __restrict__ x, int64_t* __restrict__ out, int64_t n, int64_t c) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = thread_index() >> 5; r < n; r += warps) {
    const int64_t bi = row_argmax(x + r * c, c);
    if ((threadIdx.x & 31) == 0) out[r] = bi;
  }
}

// With loss_sum, the first block also adds the batch's loss to it (the f32 sum binary Add computes).
template <typename L>
__global__ void count_correct_kernel(const float* __restrict__ x, const L* __restrict__ labels,
                                     unsigned long long* __restrict__ out, int64_t n, int64_t c,
                                     const float* __restrict__ loss = nullptr, float* __restrict__ loss_sum = nullptr) {
  __shared__ unsigned long long scratch[32];
  if (loss_sum && blockIdx.x == 0 && threadIdx.x == 0) *loss_sum = __fadd_rn(*loss_sum, *loss);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  unsigned long long hits = 0;
  for (int64_t r = thread_index() >> 5; r < n; r += warps) {
    const int64_t bi = row_argmax(x + r * c, c);
    if ((threadIdx.x & 31) == 0 && bi == static_cast<int64_t>(labels[r])) ++hits;
  }
  hits = kern::block_sum(hits, scratch);
  if (threadIdx.x == 0 && hits) atomicAdd(out, hits);  // integer sums: order does not matter
}

__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, int64_t c) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = thread_index() >> 5; r < n; r += warps) softmax_row(x + r * c, y + r * c, c);
}

// dx = y * (dy - sum_j dy_j y_j) per row, the sum in double as on the CPU.
__global__ void softmax_rows_backward_kernel(const float* __restrict__ dy, const float* __restrict__ y,
                                             float* __restrict__ dx, int64_t n, int64_t c) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = thread_index() >> 5; r < n; r += warps) {
    const float* g = dy + r * c;
    const float* p = y + r * c;
    double dot = 0.0;
    for (int64_t j = lane; j < c; j += 32) dot += static_cast<double>(g[j]) * static_cast<double>(p[j]);
    const float d = static_cast<float>(kern::warp_sum(dot));
    for (int64_t j = lane; j < c; j += 32) dx[r * c + j] = p[j] * (g[j] - d);
  }
}

unsigned row_blocks(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, kern::kMaxBlocks));
}

template <typename F>
void dispatch_labels(const Tensor& labels, const char* op, F&& f) {
  if (labels.dtype() == DType::i32) return f(labels.data<int32_t>());
  TANDEM_CHECK(labels.dtype() == DType::i64, op, ": labels must be i32 or i64, got ", labels.str());
  f(labels.data<int64_t>());
}
}  // namespace

void CudaBackend::softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) {
  require_f32(logits, "softmax_cross_entropy");
  require_f32(loss, "softmax_cross_entropy");
  require_f32(probs, "softmax_cross_entropy");
  TANDEM_ASSERT(logits.dim() == 2 && labels.numel() == logits.size(0) && probs.numel() == logits.numel() &&
                    loss.numel() == 1,
                "softmax_cross_entropy shapes");
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_CHECK(n > 0 && c > 0, "softmax_cross_entropy: empty logits ", logits.str());
  DeviceState& st = state_for(loss);
  dispatch_labels(labels, "softmax_cross_entropy", [&](auto* lab) {
    using L = std::remove_const_t<std::remove_pointer_t<decltype(lab)>>;
    if (n * c <= kFusedLimit) {
      xent_fused_kernel<L><<<1, kFusedThreads, 0, st.stream>>>(logits.data<float>(), lab, probs.data<float>(),
                                                              loss.data<float>(), n, c, st.errors);
      TANDEM_CUDA_LAUNCH_CHECK("xent_fused_kernel");
      return;
    }
    Scratch row_loss(allocator(st.device), static_cast<size_t>(n) * sizeof(double));
    xent_rows_kernel<L><<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(
        logits.data<float>(), lab, probs.data<float>(), row_loss.as<double>(), n, c, st.errors);
    TANDEM_CUDA_LAUNCH_CHECK("xent_rows_kernel");
    mean_kernel<<<1, 1024, 0, st.stream>>>(row_loss.as<double>(), n, loss.data<float>());
    TANDEM_CUDA_LAUNCH_CHECK("mean_kernel");
  });
}

void CudaBackend::softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                                        Tensor& dlogits) {
  require_f32(probs, "softmax_cross_entropy backward");
  require_f32(dloss, "softmax_cross_entropy backward");
  require_f32(dlogits, "softmax_cross_entropy backward");
  TANDEM_ASSERT(probs.dim() == 2 && labels.numel() == probs.size(0) && dlogits.numel() == probs.numel() &&
                    dloss.numel() == 1,
                "softmax_cross_entropy backward shapes");
  const int64_t n = probs.size(0), c = probs.size(1);
  if (n * c == 0) return;
  DeviceState& st = state_for(dlogits);
  dispatch_labels(labels, "softmax_cross_entropy backward", [&](auto* lab) {
    using L = std::remove_const_t<std::remove_pointer_t<decltype(lab)>>;
    xent_backward_kernel<L><<<blocks_for(n * c), kBlock, 0, st.stream>>>(
        probs.data<float>(), lab, dloss.data<float>(), dlogits.data<float>(), n, c, st.errors);
    TANDEM_CUDA_LAUNCH_CHECK("xent_backward_kernel");
  });
}

void CudaBackend::softmax_xent_targets_forward(const Tensor& logits, const Tensor& targets, Tensor& loss,
                                               Tensor& probs) {
  require_f32(logits, "softmax_cross_entropy");
  require_f32(targets, "softmax_cross_entropy");
  require_f32(loss, "softmax_cross_entropy");
  require_f32(probs, "softmax_cross_entropy");
  TANDEM_ASSERT(logits.dim() == 2 && targets.numel() == logits.numel() && probs.numel() == logits.numel() &&
                    loss.numel() == 1,
                "softmax_cross_entropy shapes");
  const int64_t n = logits.size(0), c = logits.size(1);
  TANDEM_CHECK(n > 0 && c > 0, "softmax_cross_entropy: empty logits ", logits.str());
  DeviceState& st = state_for(loss);
  const auto* t = reinterpret_cast<const Target*>(targets.data<float>());
  if (n * c <= kFusedLimit) {
    xent_fused_kernel<Target><<<1, kFusedThreads, 0, st.stream>>>(logits.data<float>(), t, probs.data<float>(),
                                                                   loss.data<float>(), n, c, st.errors);
    TANDEM_CUDA_LAUNCH_CHECK("xent_fused_kernel");
    return;
  }
  Scratch row_loss(allocator(st.device), static_cast<size_t>(n) * sizeof(double));
  xent_rows_kernel<Target><<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(
      logits.data<float>(), t, probs.data<float>(), row_loss.as<double>(), n, c, st.errors);
  TANDEM_CUDA_LAUNCH_CHECK("xent_rows_kernel");
  mean_kernel<<<1, 1024, 0, st.stream>>>(row_loss.as<double>(), n, loss.data<float>());
  TANDEM_CUDA_LAUNCH_CHECK("mean_kernel");
}

void CudaBackend::softmax_xent_targets_backward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                                                Tensor& dlogits) {
  require_f32(probs, "softmax_cross_entropy backward");
  require_f32(targets, "softmax_cross_entropy backward");
  require_f32(dloss, "softmax_cross_entropy backward");
  require_f32(dlogits, "softmax_cross_entropy backward");
  TANDEM_ASSERT(probs.dim() == 2 && targets.numel() == probs.numel() && dlogits.numel() == probs.numel() &&
                    dloss.numel() == 1,
                "softmax_cross_entropy backward shapes");
  const int64_t n = probs.size(0), c = probs.size(1);
  if (n * c == 0) return;
  DeviceState& st = state_for(dlogits);
  xent_targets_backward_kernel<<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(
      probs.data<float>(), targets.data<float>(), dloss.data<float>(), dlogits.data<float>(), n, c);
  TANDEM_CUDA_LAUNCH_CHECK("xent_targets_backward_kernel");
}

void CudaBackend::argmax_rows(const Tensor& x, Tensor& out) {
  require_f32(x, "argmax");
  TANDEM_CHECK(out.dtype() == DType::i64, "argmax: output must be i64, got ", out.str());
  TANDEM_ASSERT(x.dim() == 2 && out.numel() == x.size(0), "argmax shapes");
  const int64_t n = x.size(0), c = x.size(1);
  if (n == 0) return;
  TANDEM_CHECK(c > 0, "argmax: rows of ", x.str(), " are empty");
  DeviceState& st = state_for(out);
  argmax_kernel<<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(x.data<float>(), out.data<int64_t>(), n, c);
  TANDEM_CUDA_LAUNCH_CHECK("argmax_kernel");
}

void CudaBackend::count_correct(const Tensor& logits, const Tensor& labels, Tensor& out, bool accumulate) {
  require_f32(logits, "count_correct");
  TANDEM_CHECK(out.dtype() == DType::i64, "count_correct: output must be i64, got ", out.str());
  TANDEM_ASSERT(logits.dim() == 2 && labels.numel() == logits.size(0) && out.numel() == 1, "count_correct shapes");
  const int64_t n = logits.size(0), c = logits.size(1);
  DeviceState& st = state_for(out);
  if (!accumulate) TANDEM_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, sizeof(int64_t), st.stream));
  if (n == 0) return;
  TANDEM_CHECK(c > 0, "count_correct: rows of ", logits.str(), " are empty");
  dispatch_labels(labels, "count_correct", [&](auto* lab) {
    using L = std::remove_const_t<std::remove_pointer_t<decltype(lab)>>;
    count_correct_kernel<L><<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(
        logits.data<float>(), lab, reinterpret_cast<unsigned long long*>(out.data<int64_t>()), n, c);
    TANDEM_CUDA_LAUNCH_CHECK("count_correct_kernel");
  });
}

void CudaBackend::tally_batch(const Tensor& loss, const Tensor& logits, const Tensor& labels, Tensor& loss_sum,
                              Tensor& correct) {
  require_f32(logits, "tally_batch");
  require_f32(loss, "tally_batch");
  require_f32(loss_sum, "tally_batch");
  TANDEM_CHECK(correct.dtype() == DType::i64, "tally_batch: the count must be i64, got ", correct.str());
  TANDEM_ASSERT(logits.dim() == 2 && labels.numel() == logits.size(0) && correct.numel() == 1 && loss.numel() == 1 &&
                    loss_sum.numel() == 1,
                "tally_batch shapes");
  const int64_t n = logits.size(0), c = logits.size(1);
  if (n == 0 || c == 0) return Backend::tally_batch(loss, logits, labels, loss_sum, correct);
  DeviceState& st = state_for(correct);
  dispatch_labels(labels, "tally_batch", [&](auto* lab) {
    using L = std::remove_const_t<std::remove_pointer_t<decltype(lab)>>;
    count_correct_kernel<L><<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(
        logits.data<float>(), lab, reinterpret_cast<unsigned long long*>(correct.data<int64_t>()), n, c,
        loss.data<float>(), loss_sum.data<float>());
    TANDEM_CUDA_LAUNCH_CHECK("count_correct_kernel");
  });
}

void CudaBackend::softmax_rows(const Tensor& x, int64_t n, int64_t c, Tensor& y) {
  require_f32(x, "softmax");
  require_f32(y, "softmax");
  TANDEM_ASSERT(x.numel() == n * c && y.numel() == n * c, "softmax_rows of ", x.str(), " as [", n, ", ", c, "]");
  if (n * c == 0) return;
  DeviceState& st = state_for(y);
  softmax_rows_kernel<<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(x.data<float>(), y.data<float>(), n, c);
  TANDEM_CUDA_LAUNCH_CHECK("softmax_rows_kernel");
}

void CudaBackend::softmax_rows_backward(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, Tensor& dx) {
  require_f32(dy, "softmax backward");
  require_f32(y, "softmax backward");
  require_f32(dx, "softmax backward");
  TANDEM_ASSERT(dy.numel() == n * c && y.numel() == n * c && dx.numel() == n * c, "softmax_rows_backward shapes");
  if (n * c == 0) return;
  DeviceState& st = state_for(dx);
  softmax_rows_backward_kernel<<<row_blocks(n), kWarpsPerBlock * 32, 0, st.stream>>>(dy.data<float>(), y.data<float>(),
                                                                                     dx.data<float>(), n, c);
  TANDEM_CUDA_LAUNCH_CHECK("softmax_rows_backward_kernel");
}

}  // namespace tandem::backend
