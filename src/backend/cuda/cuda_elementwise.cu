// CUDA backend: the elementwise entry points (their walks and launches; the kernel is in
// cuda_elementwise.cuh), bias broadcast and reduction kernels, and whole-tensor sums.
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_channel.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "backend/cuda/cuda_elementwise.cuh"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::from_float;
using kern::kBlock;
using kern::to_float;
using kern::thread_count;
using kern::thread_index;

// Checks an elementwise call's dtypes (one for all, one the backend takes for the op: floats, and i32 /
// i64 where ints) and builds its launch: the walk of out and the operands, over broadcast copies of
// them when it has more dimensions than a walk holds.
struct Prepared {
  ewcuda::Launch launch;
  Tensor copies[ew::kMaxArgs - 1];
};

void prepare(Prepared& p, const std::string& op, bool ints, Tensor& out, std::initializer_list<const Tensor*> operands,
             cudaStream_t stream) {
  for (const Tensor* t : operands)
    TANDEM_CHECK(t->dtype() == out.dtype(), op, ": operands of dtypes ", dtype_name(t->dtype()), " and ",
                 dtype_name(out.dtype()), " differ (", t->str(), " into ", out.str(), ")");
  const DType dt = out.dtype();
  const bool takes = dt == DType::f32 || dt == DType::f16 || dt == DType::bf16 ||
                     (ints && (dt == DType::i32 || dt == DType::i64));
  TANDEM_CHECK(takes, op, ": dtype ", dtype_name(dt), " is not supported on CUDA (use f32, f16 or bf16",
               ints ? ", or i32 or i64)" : ")");
  ewcuda::Launch& l = p.launch;
  l.dtype = dt;
  l.out = out.data_ptr();
  l.stream = stream;
  const int n = static_cast<int>(operands.size());
  const Tensor* use[ew::kMaxArgs - 1];
  int k = 0;
  for (const Tensor* t : operands) use[k++] = t;
  if (!ew::make_geometry(out, std::span<const Tensor* const>(use, n), l.g)) {
    for (k = 0; k < n; ++k) {
      p.copies[k] = ew::broadcast_copy(*use[k], out);
      use[k] = &p.copies[k];
    }
    const bool ok = ew::make_geometry(out, std::span<const Tensor* const>(use, n), l.g);
    TANDEM_ASSERT(ok, "elementwise over ", out.str());
  }
  for (k = 0; k < n; ++k) l.in[k] = use[k]->data_ptr();
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

}  // namespace

// The copies a launch may read stay alive until the launch is queued; the caching allocator hands
// their memory out again only to work queued after it on the same stream.
void CudaBackend::binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (out.numel() == 0) return;
  Prepared p;
  prepare(p, std::string("binary ") + op_name(op), takes_integers(op), out, {&a, &b}, state_for(out).stream);
  ewcuda::binary(op, p.launch);
}

void CudaBackend::unary(Unary op, const Tensor& a, Tensor& out, const EwArgs& args) {
  if (out.numel() == 0) return;
  Prepared p;
  prepare(p, std::string("unary ") + op_name(op), false, out, {&a}, state_for(out).stream);
  ewcuda::unary(op, args, p.launch);
}

void CudaBackend::ternary(Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) {
  if (out.numel() == 0) return;
  Prepared p;
  prepare(p, std::string("ternary ") + op_name(op), op == Ternary::Where, out, {&a, &b, &c}, state_for(out).stream);
  ewcuda::ternary(op, p.launch);
}

void CudaBackend::affine(const Tensor& a, double alpha, double beta, Tensor& out) {
  unary(Unary::Affine, a, out, EwArgs{alpha, beta});
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  if (y.numel() == 0) return;
  Prepared p;
  prepare(p, "axpy", false, y, {&x, &y}, state_for(y).stream);
  ewcuda::axpy(alpha, p.launch);
}

void CudaBackend::unary_backward(Unary op, const Tensor& grad, const Tensor& saved, Tensor& out,
                                 const EwArgs& args) {
  TANDEM_CHECK(!grad_is_zero(op), "unary_backward: ", op_name(op), " has a zero derivative and no gradient kernel");
  if (out.numel() == 0) return;
  Prepared p;
  prepare(p, std::string("unary_backward ") + backward_name(op), false, out, {&grad, &saved}, state_for(out).stream);
  ewcuda::unary_grad(op, args, p.launch);
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
