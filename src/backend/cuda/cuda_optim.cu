// CUDA kernels: multi-tensor SGD, Adam, RMSProp and AdaGrad. Per-tensor pointers and sizes travel in the kernel's
// argument block, so one launch updates up to kMaxTensors tensors; each block updates one chunk of
// one tensor, found from the table of first blocks.
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
constexpr int kMaxTensors = 40;   // keeps the argument block under CUDA's classic 4 KiB
constexpr int64_t kChunk = 1024;  // elements per block: enough blocks to fill the GPU for small models
constexpr int kOptimBlock = 256;

struct TensorTable {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* b0[kMaxTensors];
  float* b1[kMaxTensors];
  void* h[kMaxTensors];  // SGD, Adam: the 16-bit copies (ParamSlot::copy), or null
  int64_t n[kMaxTensors];
  int64_t first_block[kMaxTensors + 1];
  int count;
};

struct SgdScalars {
  float lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, first_step, use_momentum;
};

// p = p * shrink - step * m / (sqrt(v) * inv_sqrt_bc2 + eps), with step = lr / (1 - beta1^t) and
// inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t): the bias-corrected update, folded as the CPU folds it.
// With dyn set, step, inv_sqrt_bc2 and shrink are read from the device (dyn[0], dyn[1], dyn[2]); with
// factor set, every gradient is multiplied by *factor as it is read (rounded as a separate scaling would).
struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, l2, shrink, step, inv_sqrt_bc2;
  const float* dyn;
  const float* factor;
};

// The tensor and the element range this block updates.
__device__ __forceinline__ int locate(const TensorTable& t, int64_t& begin, int64_t& end) {
  const int64_t b = blockIdx.x;
  int k = 0;
  while (k + 1 < t.count && t.first_block[k + 1] <= b) ++k;
  begin = (b - t.first_block[k]) * kChunk;
  end = begin + kChunk < t.n[k] ? begin + kChunk : t.n[k];
  return k;
}

// Four updated parameters' 16-bit copies (CopyT: __half or __nv_bfloat16) in one 8-byte store at h (8-byte aligned).
template <typename CopyT>
__device__ __forceinline__ void store_copies(CopyT* h, const float4& pv) {
  struct alignas(8) Four {
    CopyT e[4];
  } c{{kern::from_float<CopyT>(pv.x), kern::from_float<CopyT>(pv.y), kern::from_float<CopyT>(pv.z),
       kern::from_float<CopyT>(pv.w)}};
  *reinterpret_cast<Four*>(h) = c;
}

// One element's SGD update: the new parameter is returned, the momentum buffer updated in place (read only
// after the first step). The same expressions in both of sgd_kernel's paths.
// Every operation rounded on its own, as AdamElem's: the compiler contracted the four-element and the
// one-element paths (and the instantiations with and without 16-bit copies) into different fused
// multiply-adds, so a parameter's bits depended on its alignment.
struct SgdElem {
  SgdScalars s;
  __device__ __forceinline__ float operator()(float p, float g, float& buf) const {
    const float d = __fadd_rn(g, __fmul_rn(s.weight_decay, p));
    if (!s.use_momentum) return __fsub_rn(p, __fmul_rn(s.lr, d));
    const float b = s.first_step ? d : __fadd_rn(__fmul_rn(s.momentum, buf), __fmul_rn(s.one_minus_dampening, d));
    buf = b;
    return __fsub_rn(p, __fmul_rn(s.lr, s.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, b)) : b));
  }
};

// CopyT: as adam_kernel's. Where the tensor's arrays are 16-byte aligned (its copy 8-byte), each thread updates
// four consecutive elements with 16-byte accesses; the momentum buffer is not read at the first step.
template <typename CopyT>
__global__ void sgd_kernel(TensorTable t, SgdScalars s, const float* guard) {
  if (guard && !isfinite(*guard)) return;  // the step's gradients were not finite: skipped
  int64_t begin, end;
  const int k = locate(t, begin, end);
  float* __restrict__ p = t.p[k];
  const float* __restrict__ g = t.g[k];
  float* __restrict__ buf = t.b0[k];
  CopyT* __restrict__ h = static_cast<CopyT*>(t.h[k]);
  constexpr bool kCopies = !std::is_same_v<CopyT, float>;
  const SgdElem f{s};
  const bool reads_buf = s.use_momentum && !s.first_step;
  int64_t i = begin;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                         (s.use_momentum ? reinterpret_cast<uintptr_t>(buf) : 0);
  if ((addr & 15) == 0 && (begin & 3) == 0 && (!kCopies || (reinterpret_cast<uintptr_t>(h) & 7) == 0)) {
    const int64_t vend = begin + (end - begin) / 4 * 4;
    for (int64_t j = begin + 4 * int64_t(threadIdx.x); j < vend; j += 4 * int64_t(blockDim.x)) {
      float4 pv = *reinterpret_cast<const float4*>(p + j);
      const float4 gv = *reinterpret_cast<const float4*>(g + j);
      float4 bv = reads_buf ? *reinterpret_cast<const float4*>(buf + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      pv.x = f(pv.x, gv.x, bv.x);
      pv.y = f(pv.y, gv.y, bv.y);
      pv.z = f(pv.z, gv.z, bv.z);
      pv.w = f(pv.w, gv.w, bv.w);
      *reinterpret_cast<float4*>(p + j) = pv;
      if (s.use_momentum) *reinterpret_cast<float4*>(buf + j) = bv;
      if constexpr (kCopies)
        if (h) store_copies(h + j, pv);
    }
    i = vend;
  }
  for (i += threadIdx.x; i < end; i += blockDim.x) {
    float b = reads_buf ? buf[i] : 0.f;
    const float pn = f(p[i], g[i], b);
    p[i] = pn;
    if (s.use_momentum) buf[i] = b;
    if constexpr (kCopies)
      if (h) h[i] = kern::from_float<CopyT>(pn);
  }
}

// One element's Adam update: the new parameter is returned, m and v updated in place. Every operation is
// rounded on its own (no contraction into fused multiply-adds), as the CPU computes it: each instantiation
// and code path gives the same bits (a factor read in the step, or the gradients scaled first; with or without
// 16-bit copies; four elements a thread or one), which the compiler's free choice of contractions did not.
struct AdamElem {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, l2, shrink, step, inv_sqrt_bc2, factor;
  bool scaled;
  __device__ __forceinline__ float operator()(float pi, float g, float& m, float& v) const {
    const float gi = __fadd_rn(scaled ? __fmul_rn(g, factor) : g, __fmul_rn(l2, pi));
    const float mi = __fadd_rn(__fmul_rn(beta1, m), __fmul_rn(one_minus_beta1, gi));
    const float vi = __fadd_rn(__fmul_rn(beta2, v), __fmul_rn(__fmul_rn(one_minus_beta2, gi), gi));
    m = mi;
    v = vi;
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), inv_sqrt_bc2), eps);
    return __fsub_rn(__fmul_rn(pi, shrink), __fdiv_rn(__fmul_rn(step, mi), denom));
  }
};

// CopyT: the type of the parameters' 16-bit copies (t.h), written with the parameters; float: none. Where every
// array of the tensor is 16-byte aligned (its copy 8-byte), each thread updates four consecutive elements with
// 16-byte accesses (the chunk's last few, when its length is not a multiple of four, one at a time).
template <typename CopyT>
__global__ void adam_kernel(TensorTable t, AdamScalars s) {
  int64_t begin, end;
  const int k = locate(t, begin, end);
  float* __restrict__ p = t.p[k];
  const float* __restrict__ g = t.g[k];
  float* __restrict__ m = t.b0[k];
  float* __restrict__ v = t.b1[k];
  CopyT* __restrict__ h = static_cast<CopyT*>(t.h[k]);
  const AdamElem f{s.beta1,
                   s.beta2,
                   s.one_minus_beta1,
                   s.one_minus_beta2,
                   s.eps,
                   s.l2,
                   s.dyn ? s.dyn[2] : s.shrink,
                   s.dyn ? s.dyn[0] : s.step,
                   s.dyn ? s.dyn[1] : s.inv_sqrt_bc2,
                   s.factor ? *s.factor : 1.0f,
                   s.factor != nullptr};
  int64_t i = begin;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                         reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v);
  constexpr bool kCopies = !std::is_same_v<CopyT, float>;
  if ((addr & 15) == 0 && (begin & 3) == 0 && (!kCopies || (reinterpret_cast<uintptr_t>(h) & 7) == 0)) {
    const int64_t vend = begin + (end - begin) / 4 * 4;
    for (int64_t j = begin + 4 * int64_t(threadIdx.x); j < vend; j += 4 * int64_t(blockDim.x)) {
      float4 pv = *reinterpret_cast<const float4*>(p + j);
      const float4 gv = *reinterpret_cast<const float4*>(g + j);
      float4 mv = *reinterpret_cast<const float4*>(m + j);
      float4 vv = *reinterpret_cast<const float4*>(v + j);
      pv.x = f(pv.x, gv.x, mv.x, vv.x);
      pv.y = f(pv.y, gv.y, mv.y, vv.y);
      pv.z = f(pv.z, gv.z, mv.z, vv.z);
      pv.w = f(pv.w, gv.w, mv.w, vv.w);
      *reinterpret_cast<float4*>(p + j) = pv;
      *reinterpret_cast<float4*>(m + j) = mv;
      *reinterpret_cast<float4*>(v + j) = vv;
      if constexpr (kCopies)
        if (h) store_copies(h + j, pv);
    }
    i = vend;
  }
  for (i += threadIdx.x; i < end; i += blockDim.x) {
    float mi = m[i], vi = v[i];
    const float pn = f(p[i], g[i], mi, vi);
    m[i] = mi;
    v[i] = vi;
    p[i] = pn;
    if constexpr (kCopies)
      if (h) h[i] = kern::from_float<CopyT>(pn);
  }
}

// RMSProp and AdaGrad share a kernel: v = decay * v + scale * g^2 (RMSProp: decay alpha, scale 1 - alpha;
// AdaGrad: 1 and 1), then p -= lr * g / (sqrt(v) + eps), or / sqrt(v + eps) with eps_inside.
struct SquareScalars {
  float lr, decay, scale, eps, weight_decay;
  bool eps_inside;
};

__global__ void square_avg_kernel(TensorTable t, SquareScalars s, const float* guard) {
  if (guard && !isfinite(*guard)) return;  // the step's gradients were not finite: skipped
  int64_t begin, end;
  const int k = locate(t, begin, end);
  float* __restrict__ p = t.p[k];
  const float* __restrict__ g = t.g[k];
  float* __restrict__ v = t.b0[k];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float pi = p[i], gi = g[i] + s.weight_decay * pi;
    const float vi = s.decay * v[i] + s.scale * gi * gi;
    v[i] = vi;
    p[i] = pi - s.lr * gi / (s.eps_inside ? sqrtf(vi + s.eps) : sqrtf(vi) + s.eps);
  }
}

void check_slot(const Tensor& t, const Tensor& param, const char* op, const char* what) {
  TANDEM_CHECK(t.defined(), op, ": ", what, " of parameter ", param.str(), " is undefined");
  TANDEM_CHECK(t.dtype() == DType::f32 && t.device() == param.device() && t.numel() == param.numel() &&
                   t.is_contiguous(),
               op, ": ", what, " ", t.str(), " does not match parameter ", param.str(),
               " (f32, same device and size, contiguous)");
}

// Fills tables of up to kMaxTensors tensors and launches one kernel per table.
template <typename Launch>
void for_each_table(ParamSlot* slots, int64_t count, bool two_buffers, bool with_buffer, const char* op,
                    Launch&& launch) {
  TensorTable t{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (t.count == 0) return;
    t.first_block[t.count] = blocks;
    launch(t, blocks);
    t = TensorTable{};
    blocks = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const ParamSlot& s = slots[i];
    TANDEM_CHECK(s.param.defined() && s.param.dtype() == DType::f32 && s.param.device().is_cuda() &&
                     s.param.is_contiguous(),
                 op, ": parameters must be contiguous f32 CUDA tensors, got ",
                 s.param.defined() ? s.param.str() : std::string("an undefined tensor"));
    check_slot(s.grad, s.param, op, "gradient");
    if (with_buffer) check_slot(s.buf0, s.param, op, two_buffers ? "first moment" : "state buffer");
    if (two_buffers) check_slot(s.buf1, s.param, op, "second moment");
    const int64_t n = s.param.numel();
    if (n == 0) continue;
    const int k = t.count++;
    t.p[k] = s.param.data<float>();
    t.g[k] = s.grad.data<float>();
    t.b0[k] = with_buffer ? s.buf0.data<float>() : nullptr;
    t.b1[k] = two_buffers ? s.buf1.data<float>() : nullptr;
    t.h[k] = s.copy.defined() ? s.copy.data_ptr() : nullptr;
    t.n[k] = n;
    t.first_block[k] = blocks;
    blocks += (n + kChunk - 1) / kChunk;
    if (t.count == kMaxTensors || blocks > (int64_t(1) << 30)) flush();
  }
  flush();
}

int common_device(ParamSlot* slots, int64_t count, const char* op) {
  int dev = -1;
  for (int64_t i = 0; i < count; ++i) {
    if (!slots[i].param.defined()) continue;
    TANDEM_CHECK(slots[i].param.device().is_cuda(), op, ": parameter ", slots[i].param.str(), " is not on a GPU");
    if (dev < 0) dev = slots[i].param.device().index;
    TANDEM_CHECK(slots[i].param.device().index == dev, op, ": parameters on different GPUs (cuda:", dev, " and ",
                 slots[i].param.device().str(), ")");
  }
  return dev;
}

// The type of the slots' 16-bit copies (ParamSlot::copy; f32: none). The copies of one call share a type (a
// launch writes one kind).
DType copies_type(ParamSlot* slots, int64_t count, const char* op) {
  DType copy_type = DType::f32;
  for (int64_t i = 0; i < count; ++i) {
    const Tensor& c = slots[i].copy;
    if (!c.defined()) continue;
    TANDEM_CHECK((c.dtype() == DType::bf16 || c.dtype() == DType::f16) && c.is_contiguous() &&
                     c.numel() == slots[i].param.numel() && c.device() == slots[i].param.device(),
                 op, ": the copy ", c.str(), " of parameter ", slots[i].param.str(),
                 " is not a contiguous bf16 or f16 tensor of its size on its device");
    TANDEM_CHECK(copy_type == DType::f32 || copy_type == c.dtype(), op, ": copies of two types (",
                 dtype_name(copy_type), " and ", dtype_name(c.dtype()), ") in one step");
    copy_type = c.dtype();
  }
  return copy_type;
}
}  // namespace

void CudaBackend::sgd_step(ParamSlot* slots, int64_t count, const SgdArgs& a) {
  const int dev = common_device(slots, count, "sgd");
  if (dev < 0) return;
  DeviceState& st = state(dev);
  const bool use_momentum = a.momentum != 0.0;
  const SgdScalars s{static_cast<float>(a.lr), static_cast<float>(a.momentum), static_cast<float>(1.0 - a.dampening),
                     static_cast<float>(a.weight_decay), a.nesterov, a.first_step, use_momentum};
  const DType copy_type = copies_type(slots, count, "sgd");
  for_each_table(slots, count, false, use_momentum, "sgd", [&](const TensorTable& t, int64_t blocks) {
    const unsigned grid = static_cast<unsigned>(blocks);
    if (copy_type == DType::bf16)
      sgd_kernel<__nv_bfloat16><<<grid, kOptimBlock, 0, st.stream>>>(t, s, a.guard);
    else if (copy_type == DType::f16)
      sgd_kernel<__half><<<grid, kOptimBlock, 0, st.stream>>>(t, s, a.guard);
    else
      sgd_kernel<float><<<grid, kOptimBlock, 0, st.stream>>>(t, s, a.guard);
    TANDEM_CUDA_LAUNCH_CHECK("sgd_kernel");
  });
}

void CudaBackend::adam_step(ParamSlot* slots, int64_t count, const AdamArgs& a) {
  TANDEM_CHECK(a.step >= 1, "adam: step counts from 1, got ", a.step);
  const int dev = common_device(slots, count, "adam");
  if (dev < 0) return;
  DeviceState& st = state(dev);
  const double t = static_cast<double>(a.step);
  const AdamScalars s{static_cast<float>(a.beta1),
                      static_cast<float>(a.beta2),
                      static_cast<float>(1.0 - a.beta1),
                      static_cast<float>(1.0 - a.beta2),
                      static_cast<float>(a.eps),
                      a.decoupled ? 0.0f : static_cast<float>(a.weight_decay),
                      a.decoupled ? static_cast<float>(1.0 - a.lr * a.weight_decay) : 1.0f,
                      static_cast<float>(a.lr / (1.0 - std::pow(a.beta1, t))),
                      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(a.beta2, t))),
                      a.step_scalars,
                      a.grad_factor};
  const DType copy_type = copies_type(slots, count, "adam");
  for_each_table(slots, count, true, true, "adam", [&](const TensorTable& tt, int64_t blocks) {
    const unsigned grid = static_cast<unsigned>(blocks);
    if (copy_type == DType::bf16)
      adam_kernel<__nv_bfloat16><<<grid, kOptimBlock, 0, st.stream>>>(tt, s);
    else if (copy_type == DType::f16)
      adam_kernel<__half><<<grid, kOptimBlock, 0, st.stream>>>(tt, s);
    else
      adam_kernel<float><<<grid, kOptimBlock, 0, st.stream>>>(tt, s);
    TANDEM_CUDA_LAUNCH_CHECK("adam_kernel");
  });
}

void CudaBackend::rmsprop_step(ParamSlot* slots, int64_t count, const RmsPropArgs& a) {
  const int dev = common_device(slots, count, "rmsprop");
  if (dev < 0) return;
  DeviceState& st = state(dev);
  const SquareScalars s{static_cast<float>(a.lr), static_cast<float>(a.alpha), static_cast<float>(1.0 - a.alpha),
                        static_cast<float>(a.eps), static_cast<float>(a.weight_decay), a.eps_inside_sqrt};
  for_each_table(slots, count, false, true, "rmsprop", [&](const TensorTable& t, int64_t blocks) {
    square_avg_kernel<<<static_cast<unsigned>(blocks), kOptimBlock, 0, st.stream>>>(t, s, a.guard);
    TANDEM_CUDA_LAUNCH_CHECK("square_avg_kernel");
  });
}

void CudaBackend::adagrad_step(ParamSlot* slots, int64_t count, const AdagradArgs& a) {
  const int dev = common_device(slots, count, "adagrad");
  if (dev < 0) return;
  DeviceState& st = state(dev);
  const SquareScalars s{static_cast<float>(a.lr), 1.0f, 1.0f, static_cast<float>(a.eps),
                        static_cast<float>(a.weight_decay), a.eps_inside_sqrt};
  for_each_table(slots, count, false, true, "adagrad", [&](const TensorTable& t, int64_t blocks) {
    square_avg_kernel<<<static_cast<unsigned>(blocks), kOptimBlock, 0, st.stream>>>(t, s, a.guard);
    TANDEM_CUDA_LAUNCH_CHECK("square_avg_kernel");
  });
}

}  // namespace tandem::backend
