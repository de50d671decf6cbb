// CUDA kernels: elementwise arithmetic, activations and their derivatives, bias broadcast and
// reduction, and whole-tensor sums.
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_channel.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::from_float;
using kern::kBlock;
using kern::to_float;
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
  // Comparisons: 1 or 0 (false wherever a NaN takes part).
  if constexpr (OP == Binary::Gt) return static_cast<T>(a > b);
  if constexpr (OP == Binary::Ge) return static_cast<T>(a >= b);
  if constexpr (OP == Binary::Lt) return static_cast<T>(a < b);
  if constexpr (OP == Binary::Le) return static_cast<T>(a <= b);
  if constexpr (OP == Binary::Eq) return static_cast<T>(a == b);
}

// Floating operands in 16-byte packs (n a multiple of the pack width, pointers aligned).
template <Binary OP, typename T, int V>
__global__ void binary_pack_kernel(const T* a, const T* b, T* out, int64_t packs) {
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    const chan::Pack<T, V> av = chan::load_pack<V>(a, p * V), bv = chan::load_pack<V>(b, p * V);
    chan::Pack<T, V> ov;
#pragma unroll
    for (int u = 0; u < V; ++u) ov.v[u] = from_float<T>(apply_binary<OP>(to_float(av.v[u]), to_float(bv.v[u])));
    chan::store_pack<V>(out, p * V, ov);
  }
}

template <Binary OP, typename T>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    if constexpr (std::is_integral_v<T> || std::is_same_v<T, float>)
      out[i] = apply_binary<OP>(a[i], b[i]);
    else
      out[i] = from_float<T>(apply_binary<OP>(to_float(a[i]), to_float(b[i])));
  }
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

template <Unary OP, typename T>
__global__ void unary_kernel(const T* a, T* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) out[i] = from_float<T>(apply_unary<OP>(to_float(a[i])));
}

template <Unary OP, typename T>
__global__ void unary_backward_kernel(const T* g, const T* y, T* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    const float yi = to_float(y[i]), gi = to_float(g[i]);
    if constexpr (OP == Unary::Relu) out[i] = from_float<T>(yi > 0.0f ? gi : 0.0f);
    if constexpr (OP == Unary::Sigmoid) out[i] = from_float<T>(gi * yi * (1.0f - yi));
    if constexpr (OP == Unary::Tanh) out[i] = from_float<T>(gi * (1.0f - yi * yi));
  }
}

template <typename T>
__global__ void affine_kernel(const T* a, float alpha, float beta, T* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) out[i] = from_float<T>(fmaf(alpha, to_float(a[i]), beta));
}

template <typename T>
__global__ void axpy_kernel(float alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_count())
    y[i] = from_float<T>(fmaf(alpha, to_float(x[i]), to_float(y[i])));
}

using chan::load_pack;
using chan::Pack;
using chan::store_pack;

// out = x + b[c] (B: the bias type, f32 or T), then max(., 0) with RELU; b may be null (ReLU only).
template <typename T, typename B, bool RELU>
struct BiasOp {
  const T* x;
  const B* b;
  T* out;
  template <int V, int STEP, typename I>
  __device__ __forceinline__ chan::Coef<V, 1> coef(I ch0) const {
    if (!b) return {};
    return chan::load_coef<V, STEP>(ch0, {b});
  }
  template <int V, typename I>
  __device__ __forceinline__ void apply(I i0, const chan::Coef<V, 1>& k) const {
    const Pack<T, V> xv = load_pack<V>(x, i0);
    Pack<T, V> ov;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      float v = to_float(xv.v[u]) + k.v[0][u];
      if (RELU) v = v > 0.0f ? v : 0.0f;
      ov.v[u] = from_float<T>(v);
    }
    store_pack<V>(out, i0, ov);
  }
};

// Sum per channel of g (masked by y > 0 with RELU, the masked values written to dx when dx is not null).
template <typename T, bool RELU>
struct BiasGradElem {
  const T *g, *y;
  T* dx;
  template <int V>
  struct L {
    Pack<T, V> g, y;
  };
  template <int V, typename I>
  __device__ __forceinline__ L<V> load(I off) const {
    L<V> l;
    l.g = load_pack<V>(g, off);
    if (RELU) l.y = load_pack<V>(y, off);
    return l;
  }
  template <int V, typename I>
  __device__ __forceinline__ void add(I off, const L<V>& l, double (&s)[1][V]) const {
    Pack<T, V> mv;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const float v = !RELU || to_float(l.y.v[u]) > 0.0f ? to_float(l.g.v[u]) : 0.0f;
      mv.v[u] = from_float<T>(v);
      s[0][u] += v;
    }
    if (RELU && dx) store_pack<V>(dx, off, mv);
  }
};

template <typename O>
struct StoreSum {
  O* out;
  __device__ __forceinline__ void operator()(int64_t ch, const double (&t)[1]) const {
    out[ch] = from_float<O>(static_cast<float>(t[0]));
  }
};

template <typename T>
struct ReluMaskOp {
  const T *g, *y;
  T* dx;
  struct None {};
  template <int V, int STEP, typename I>
  __device__ __forceinline__ None coef(I) const {
    return {};
  }
  template <int V, typename I>
  __device__ __forceinline__ void apply(I i0, None) const {
    const Pack<T, V> gv = load_pack<V>(g, i0), yv = load_pack<V>(y, i0);
    Pack<T, V> ov;
#pragma unroll
    for (int u = 0; u < V; ++u) ov.v[u] = to_float(yv.v[u]) > 0.0f ? gv.v[u] : from_float<T>(0.0f);
    store_pack<V>(dx, i0, ov);
  }
};

// Floats are summed in double, integers in int64; a single-block grid writes the result directly,
// a larger one leaves one partial per block for sum_finish_kernel (a fixed order: deterministic).
template <typename T>
using SumAcc = std::conditional_t<std::is_integral_v<T>, long long, double>;

template <typename T>
__device__ __forceinline__ SumAcc<T> sum_value(T v) {
  if constexpr (std::is_integral_v<T> || std::is_same_v<T, float>)
    return static_cast<SumAcc<T>>(v);
  else
    return static_cast<double>(to_float(v));
}

constexpr int kSumBlocks = 1024;

template <typename T, typename Out>
__global__ void sum_kernel(const T* x, int64_t n, SumAcc<T>* partial, Out* out) {
  __shared__ SumAcc<T> scratch[32];
  SumAcc<T> acc = 0;
  for (int64_t i = thread_index(); i < n; i += thread_count()) acc += sum_value(x[i]);
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
  if constexpr (!std::is_integral_v<T>) {
    constexpr int V = chan::pack_width<T>();
    if (n % V == 0 && chan::aligned16({a, b, out})) {
      const int64_t packs = n / V;
      const unsigned g = blocks_for(packs);
      switch (op) {
        case Binary::Add: binary_pack_kernel<Binary::Add, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Sub: binary_pack_kernel<Binary::Sub, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Mul: binary_pack_kernel<Binary::Mul, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Div: binary_pack_kernel<Binary::Div, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Max: binary_pack_kernel<Binary::Max, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Min: binary_pack_kernel<Binary::Min, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Gt: binary_pack_kernel<Binary::Gt, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Ge: binary_pack_kernel<Binary::Ge, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Lt: binary_pack_kernel<Binary::Lt, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Le: binary_pack_kernel<Binary::Le, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
        case Binary::Eq: binary_pack_kernel<Binary::Eq, T, V><<<g, kBlock, 0, st>>>(a, b, out, packs); break;
      }
      TANDEM_CUDA_LAUNCH_CHECK("binary_pack_kernel");
      return;
    }
  }
  const unsigned g = blocks_for(n);
  switch (op) {
    case Binary::Add: binary_kernel<Binary::Add><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Sub: binary_kernel<Binary::Sub><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Mul: binary_kernel<Binary::Mul><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Div: binary_kernel<Binary::Div><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Max: binary_kernel<Binary::Max><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Min: binary_kernel<Binary::Min><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Gt: binary_kernel<Binary::Gt><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Ge: binary_kernel<Binary::Ge><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Lt: binary_kernel<Binary::Lt><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Le: binary_kernel<Binary::Le><<<g, kBlock, 0, st>>>(a, b, out, n); break;
    case Binary::Eq: binary_kernel<Binary::Eq><<<g, kBlock, 0, st>>>(a, b, out, n); break;
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
  auto run = [&](auto tag) {
    using T = decltype(tag);
    launch_binary(op, static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()),
                  static_cast<T*>(out.data_ptr()), n, st.stream);
  };
  switch (out.dtype()) {
    case DType::i32: return run(int32_t{});
    case DType::i64: return run(int64_t{});
    default: return kern::dispatch_float(out.dtype(), "binary", run);
  }
}

void CudaBackend::unary(Unary op, const Tensor& a, Tensor& out) {
  TANDEM_CHECK(a.dtype() == out.dtype(), "unary: input ", a.str(), " and output ", out.str(), " differ in dtype");
  TANDEM_ASSERT(a.numel() == out.numel(), "unary ", a.str(), " ", out.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceState& st = state_for(out);
  const unsigned g = blocks_for(n);
  kern::dispatch_float(a.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
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
  });
  TANDEM_CUDA_LAUNCH_CHECK("unary_kernel");
}

void CudaBackend::affine(const Tensor& a, double alpha, double beta, Tensor& out) {
  TANDEM_CHECK(a.dtype() == out.dtype(), "affine: input ", a.str(), " and output ", out.str(), " differ in dtype");
  TANDEM_ASSERT(a.numel() == out.numel(), "affine ", a.str(), " ", out.str());
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceState& st = state_for(out);
  kern::dispatch_float(a.dtype(), "affine", [&](auto tag) {
    using T = decltype(tag);
    affine_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(static_cast<const T*>(a.data_ptr()),
                                                            static_cast<float>(alpha), static_cast<float>(beta),
                                                            static_cast<T*>(out.data_ptr()), n);
  });
  TANDEM_CUDA_LAUNCH_CHECK("affine_kernel");
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  TANDEM_CHECK(x.dtype() == y.dtype(), "axpy: ", x.str(), " and ", y.str(), " differ in dtype");
  TANDEM_ASSERT(x.numel() == y.numel(), "axpy ", x.str(), " ", y.str());
  const int64_t n = y.numel();
  if (n == 0) return;
  DeviceState& st = state_for(y);
  kern::dispatch_float(y.dtype(), "axpy", [&](auto tag) {
    using T = decltype(tag);
    axpy_kernel<<<blocks_for(n), kBlock, 0, st.stream>>>(static_cast<float>(alpha), static_cast<const T*>(x.data_ptr()),
                                                          static_cast<T*>(y.data_ptr()), n);
  });
  TANDEM_CUDA_LAUNCH_CHECK("axpy_kernel");
}

void CudaBackend::unary_backward(Unary op, const Tensor& grad, const Tensor& y, Tensor& out) {
  TANDEM_CHECK(grad.dtype() == out.dtype() && y.dtype() == out.dtype(), "unary_backward: ", grad.str(), ", ",
               y.str(), " and ", out.str(), " differ in dtype");
  TANDEM_ASSERT(grad.numel() == out.numel() && y.numel() == out.numel(), "unary_backward shapes");
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceState& st = state_for(out);
  const unsigned g = blocks_for(n);
  kern::dispatch_float(out.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *gp = static_cast<const T*>(grad.data_ptr()), *yp = static_cast<const T*>(y.data_ptr());
    T* op_ = static_cast<T*>(out.data_ptr());
    switch (op) {
      case Unary::Relu: unary_backward_kernel<Unary::Relu><<<g, kBlock, 0, st.stream>>>(gp, yp, op_, n); break;
      case Unary::Sigmoid: unary_backward_kernel<Unary::Sigmoid><<<g, kBlock, 0, st.stream>>>(gp, yp, op_, n); break;
      case Unary::Tanh: unary_backward_kernel<Unary::Tanh><<<g, kBlock, 0, st.stream>>>(gp, yp, op_, n); break;
      default:
        TANDEM_CHECK(false, "unary_backward: only relu, sigmoid and tanh are differentiated from their output");
    }
  });
  TANDEM_CUDA_LAUNCH_CHECK("unary_backward_kernel");
}

namespace {
// Checks the operands of a per-channel map: out like x, a bias of c values in f32 or x's type.
void check_bias(const Tensor& x, const Tensor& b, const Tensor& out, int64_t n, int64_t c, int64_t s, const char* op) {
  TANDEM_CHECK(x.dtype() == out.dtype(), op, ": input ", x.str(), " and output ", out.str(), " differ in dtype");
  TANDEM_CHECK(!b.defined() || b.dtype() == x.dtype() || b.dtype() == DType::f32, op, ": bias ", b.str(),
               " must be f32 or of the input's dtype ", dtype_name(x.dtype()));
  TANDEM_ASSERT(x.numel() == n * c * s && out.numel() == n * c * s && (!b.defined() || b.numel() == c), op, " ",
                x.str(), " as [", n, ", ", c, ", ", s, "]");
}

template <bool RELU>
void launch_bias(const Tensor& x, const Tensor& b, const chan::Layout& l, Tensor& out, cudaStream_t stream) {
  kern::dispatch_float(x.dtype(), RELU ? "bias_relu" : "bias_add", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (b.defined() && b.dtype() == DType::f32)
      chan::map<T>(l, stream, BiasOp<T, float, RELU>{px, b.data<float>(), po}, {px, po});
    else
      chan::map<T>(l, stream, BiasOp<T, T, RELU>{px, b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr, po},
                   {px, po});
  });
}

template <bool RELU>
void launch_bias_grad(CudaBackend& be, int device, const Tensor& g, const Tensor& y, const chan::Layout& l,
                      Tensor* dx, Tensor& db) {
  kern::dispatch_float(g.dtype(), "bias_grad", [&](auto tag) {
    using T = decltype(tag);
    const BiasGradElem<T, RELU> elem{static_cast<const T*>(g.data_ptr()),
                                     y.defined() ? static_cast<const T*>(y.data_ptr()) : nullptr,
                                     dx ? static_cast<T*>(dx->data_ptr()) : nullptr};
    const std::initializer_list<const void*> io{elem.g, elem.y, elem.dx};
    if (db.dtype() == DType::f32)
      chan::reduce<1, T>(be, device, l, elem, StoreSum<float>{db.data<float>()}, io);
    else
      chan::reduce<1, T>(be, device, l, elem, StoreSum<T>{static_cast<T*>(db.data_ptr())}, io);
  });
}
}  // namespace

void CudaBackend::bias_add(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) {
  check_bias(x, b, out, n, c, s, "bias_add");
  if (n * c * s == 0) return;
  launch_bias<false>(x, b, chan::layout_of(n, c, s, false), out, state_for(out).stream);
}

void CudaBackend::bias_relu(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) {
  check_bias(x, b, out, n, c, s, "bias_relu");
  if (n * c * s == 0) return;
  launch_bias<true>(x, b, chan::layout_of(n, c, s, false), out, state_for(out).stream);
}

void CudaBackend::bias_grad(const Tensor& g, int64_t n, int64_t c, int64_t s, Tensor& out) {
  check_bias(g, out, g, n, c, s, "bias_grad");
  if (c == 0) return;
  DeviceState& st = state_for(out);
  if (n * s == 0) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), st.stream));
    return;
  }
  launch_bias_grad<false>(*this, st.device, g, Tensor(), chan::layout_of(n, c, s, false), nullptr, out);
}

void CudaBackend::relu_bias_grad(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, int64_t s, Tensor& dx,
                                 Tensor& db) {
  TANDEM_CHECK(dy.dtype() == y.dtype() && dy.dtype() == dx.dtype(), "relu_bias_grad: ", dy.str(), ", ", y.str(),
               " and ", dx.str(), " differ in dtype");
  if (db.defined()) check_bias(dy, db, dx, n, c, s, "relu_bias_grad");
  const chan::Layout l = chan::layout_of(n, c, s, false);
  if (l.total() == 0) {
    if (db.defined() && c) TANDEM_CUDA_CHECK(cudaMemsetAsync(db.data_ptr(), 0, db.nbytes(), state_for(db).stream));
    return;
  }
  DeviceState& st = state_for(dx);
  if (db.defined()) {
    launch_bias_grad<true>(*this, st.device, dy, y, l, &dx, db);
    return;
  }
  kern::dispatch_float(dy.dtype(), "relu_bias_grad", [&](auto tag) {
    using T = decltype(tag);
    chan::map<T>(l, st.stream,
                 ReluMaskOp<T>{static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(y.data_ptr()),
                               static_cast<T*>(dx.data_ptr())},
                 {dy.data_ptr(), y.data_ptr(), dx.data_ptr()});
  });
}

namespace chan {
unsigned* reduce_counters(CudaBackend& be, int device, int64_t needed) {
  DeviceState& st = be.state(device);
  if (needed > st.reduce_counter_count) {
    // Grows rarely (a wider layer than any before). Queued reductions and recorded steps may still
    // use the old array, so it stays allocated (its counters are zero between launches).
    if (st.reduce_counters) st.outgrown_counters.push_back(st.reduce_counters);
    st.reduce_counters = nullptr;
    st.reduce_counter_count = 0;
    const int64_t count = std::max<int64_t>(needed, 4096);
    TANDEM_CUDA_CHECK(cudaMalloc(&st.reduce_counters, static_cast<size_t>(count) * sizeof(unsigned)));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(st.reduce_counters, 0, static_cast<size_t>(count) * sizeof(unsigned), st.stream));
    st.reduce_counter_count = count;
  }
  return st.reduce_counters;
}
}  // namespace chan

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
    case DType::f16:
    case DType::bf16:
      TANDEM_CHECK(out.dtype() == DType::f32, "sum: a 16-bit tensor sums into f32, not ", dtype_name(out.dtype()));
      return kern::dispatch_float(x.dtype(), "sum", [&](auto tag) {
        using T = decltype(tag);
        launch_sum(static_cast<const T*>(x.data_ptr()), n, out.data<float>(), alloc, st.stream);
      });
    default:
      TANDEM_CHECK(false, "sum: dtype ", dtype_name(x.dtype()), " is not supported on CUDA (use f32, f16, bf16, i32 or i64)");
  }
}

}  // namespace tandem::backend
