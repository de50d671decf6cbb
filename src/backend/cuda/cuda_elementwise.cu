// CUDA kernels: the generic elementwise kernel (every elementwise op and its gradient, broadcasting
// through strides; a vectorised path for operands in the output's order), bias broadcast and reduction,
// and whole-tensor sums.
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_channel.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"
#include "backend/elementwise_functors.h"

namespace tandem::backend {

namespace {
using kern::blocks_for;
using kern::from_float;
using kern::kBlock;
using kern::to_float;
using kern::thread_count;
using kern::thread_index;

using chan::FastDiv;
using ew::Geometry;

// ---- the generic elementwise kernel: one functor (elementwise_functors.h) per op, operands read
// through their strides (0 where broadcast). 16-bit types compute in float.
template <typename T>
using Compute = std::conditional_t<std::is_integral_v<T>, T, float>;

template <typename T>
__device__ __forceinline__ Compute<T> load_c(T v) {
  if constexpr (std::is_integral_v<T>)
    return v;
  else
    return to_float(v);
}

template <typename T>
__device__ __forceinline__ T store_c(Compute<T> v) {
  if constexpr (std::is_integral_v<T>)
    return v;
  else
    return from_float<T>(v);
}

template <typename T, int N>
struct Operands {
  const T* p[N];
};

template <int N, typename F, typename C>
__device__ __forceinline__ C call(const F& f, const C (&x)[N]) {
  if constexpr (N == 1)
    return f(x[0]);
  else if constexpr (N == 2)
    return f(x[0], x[1]);
  else
    return f(x[0], x[1], x[2]);
}

// Every operand read in the output's order or one element (bit k of `scalar`): packs of V elements
// move in 16-byte accesses, the tail one by one.
template <int V, int N, typename T, typename F>
__global__ void __launch_bounds__(kBlock) ew_flat_kernel(F f, T* out, Operands<T, N> in, unsigned scalar,
                                                         int64_t n) {
  using C = Compute<T>;
  C sv[N];
#pragma unroll
  for (int k = 0; k < N; ++k) sv[k] = (scalar >> k) & 1u ? load_c(in.p[k][0]) : C(0);
  const int64_t packs = n / V;
  for (int64_t p = thread_index(); p < packs; p += thread_count()) {
    chan::Pack<T, V> v[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (!((scalar >> k) & 1u)) v[k] = chan::load_pack<V>(in.p[k], p * V);
    chan::Pack<T, V> o;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      C x[N];
#pragma unroll
      for (int k = 0; k < N; ++k) x[k] = (scalar >> k) & 1u ? sv[k] : load_c(v[k].v[u]);
      o.v[u] = store_c<T>(call<N>(f, x));
    }
    chan::store_pack<V>(out, p * V, o);
  }
  for (int64_t i = packs * V + thread_index(); i < n; i += thread_count()) {
    C x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = (scalar >> k) & 1u ? sv[k] : load_c(in.p[k][i]);
    out[i] = store_c<T>(call<N>(f, x));
  }
}

// Division by the extents of the walk: multiply-shift for 32-bit indices, plain for 64-bit ones.
struct Div32 {
  using Index = uint32_t;
  FastDiv d;
  __device__ __forceinline__ uint32_t div(uint32_t i) const { return d.div(i); }
  __device__ __forceinline__ uint32_t mod(uint32_t i, uint32_t q) const { return i - q * d.divisor; }
  static Div32 make(int64_t v) { return Div32{FastDiv(static_cast<uint32_t>(v))}; }
};
struct Div64 {
  using Index = int64_t;
  int64_t d;
  __device__ __forceinline__ int64_t div(int64_t i) const { return i / d; }
  __device__ __forceinline__ int64_t mod(int64_t i, int64_t q) const { return i - q * d; }
  static Div64 make(int64_t v) { return Div64{v}; }
};

template <int N, typename D>
struct Walk {
  int ndim;
  D sizes[ew::kMaxDims];
  int64_t strides[N][ew::kMaxDims];
};

// Any strides: output element i is split into the walk's coordinates (innermost first), which give
// each operand's offset.
template <int N, typename T, typename F, typename D>
__global__ void __launch_bounds__(kBlock) ew_strided_kernel(F f, T* out, Operands<T, N> in, Walk<N, D> w,
                                                            int64_t n) {
  using C = Compute<T>;
  using I = typename D::Index;
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    I q = static_cast<I>(i);
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = w.ndim - 1; d > 0; --d) {
      const I next = w.sizes[d].div(q);
      const int64_t r = static_cast<int64_t>(w.sizes[d].mod(q, next));
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * w.strides[k][d];
      q = next;
    }
    C x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = load_c(in.p[k][off[k] + static_cast<int64_t>(q) * w.strides[k][0]]);
    out[i] = store_c<T>(call<N>(f, x));
  }
}

template <int N, typename D>
Walk<N, D> walk_of(const Geometry& g) {
  Walk<N, D> w{};
  w.ndim = g.ndim;
  for (int d = 0; d < g.ndim; ++d) {
    w.sizes[d] = D::make(g.sizes[d]);
    for (int k = 0; k < N; ++k) w.strides[k][d] = g.strides[k][d];
  }
  return w;
}

// Builds the walk of out and its operands (broadcast copies past kMaxDims merged dimensions) and
// launches the kernel that fits it.
template <typename T, int N, typename F>
void elementwise(const F& f, Tensor& out, const Tensor* const (&operands)[N], cudaStream_t stream) {
  const int64_t n = out.numel();
  if (n == 0) return;
  Geometry g;
  Tensor copies[N];
  const Tensor* use[N];
  for (int k = 0; k < N; ++k) use[k] = operands[k];
  if (!ew::make_geometry(out, std::span<const Tensor* const>(use, N), g)) {
    for (int k = 0; k < N; ++k) {
      copies[k] = ew::broadcast_copy(*operands[k], out);
      use[k] = &copies[k];
    }
    const bool ok = ew::make_geometry(out, std::span<const Tensor* const>(use, N), g);
    TANDEM_ASSERT(ok, "elementwise over ", out.str());
  }
  Operands<T, N> in;
  for (int k = 0; k < N; ++k) in.p[k] = static_cast<const T*>(use[k]->data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  if (g.flat()) {
    constexpr int V = chan::pack_width<T>();
    unsigned scalar = 0;
    bool aligned = chan::aligned16({o});
    for (int k = 0; k < N; ++k) {
      if (g.strides[k][0] == 0)
        scalar |= 1u << k;
      else
        aligned = aligned && chan::aligned16({in.p[k]});
    }
    if (aligned) {
      ew_flat_kernel<V, N><<<blocks_for(std::max<int64_t>(n / V, 1)), kBlock, 0, stream>>>(f, o, in, scalar, n);
      TANDEM_CUDA_LAUNCH_CHECK("ew_flat_kernel");
      return;
    }
  }
  if (n < (int64_t(1) << 31))
    ew_strided_kernel<N><<<blocks_for(n), kBlock, 0, stream>>>(f, o, in, walk_of<N, Div32>(g), n);
  else
    ew_strided_kernel<N><<<blocks_for(n), kBlock, 0, stream>>>(f, o, in, walk_of<N, Div64>(g), n);
  TANDEM_CUDA_LAUNCH_CHECK("ew_strided_kernel");
}

// Calls f(tag) with the device type of a floating dtype, or of i32 / i64 when ints; names the op otherwise.
template <typename F>
void dispatch_types(DType t, bool ints, const std::string& op, F&& f) {
  if (ints && t == DType::i32) return f(int32_t{});
  if (ints && t == DType::i64) return f(int64_t{});
  kern::dispatch_float(t, op.c_str(), f);
}

void check_types(const std::string& op, const Tensor& out, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    TANDEM_CHECK(t->dtype() == out.dtype(), op, ": operands of dtypes ", dtype_name(t->dtype()), " and ",
                 dtype_name(out.dtype()), " differ (", t->str(), " into ", out.str(), ")");
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

void CudaBackend::binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) {
  const std::string name = std::string("binary ") + op_name(op);
  check_types(name, out, {&a, &b});
  if (out.numel() == 0) return;
  const cudaStream_t stream = state_for(out).stream;
  dispatch_types(out.dtype(), takes_integers(op), name, [&](auto tag) {
    using T = decltype(tag);
    ewf::with_binary<Compute<T>>(op, [&](auto f) { elementwise<T>(f, out, {&a, &b}, stream); });
  });
}

void CudaBackend::unary(Unary op, const Tensor& a, Tensor& out, const EwArgs& args) {
  const std::string name = std::string("unary ") + op_name(op);
  check_types(name, out, {&a});
  if (out.numel() == 0) return;
  const cudaStream_t stream = state_for(out).stream;
  kern::dispatch_float(out.dtype(), name.c_str(), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_unary<float>(op, args, [&](auto f) { elementwise<T>(f, out, {&a}, stream); });
  });
}

void CudaBackend::ternary(Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) {
  const std::string name = std::string("ternary ") + op_name(op);
  check_types(name, out, {&a, &b, &c});
  if (out.numel() == 0) return;
  const cudaStream_t stream = state_for(out).stream;
  dispatch_types(out.dtype(), op == Ternary::Where, name, [&](auto tag) {
    using T = decltype(tag);
    ewf::with_ternary<Compute<T>>(op, [&](auto f) { elementwise<T>(f, out, {&a, &b, &c}, stream); });
  });
}

void CudaBackend::affine(const Tensor& a, double alpha, double beta, Tensor& out) {
  unary(Unary::Affine, a, out, EwArgs{alpha, beta});
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  check_types("axpy", y, {&x});
  if (y.numel() == 0) return;
  const cudaStream_t stream = state_for(y).stream;
  kern::dispatch_float(y.dtype(), "axpy", [&](auto tag) {
    using T = decltype(tag);
    elementwise<T>(ewf::AxpyF<float>{static_cast<float>(alpha)}, y, {&x, &y}, stream);
  });
}

void CudaBackend::unary_backward(Unary op, const Tensor& grad, const Tensor& saved, Tensor& out,
                                 const EwArgs& args) {
  const std::string name = std::string("unary_backward ") + backward_name(op);
  check_types(name, out, {&grad, &saved});
  TANDEM_CHECK(!grad_is_zero(op), "unary_backward: ", op_name(op), " has a zero derivative and no gradient kernel");
  if (out.numel() == 0) return;
  const cudaStream_t stream = state_for(out).stream;
  kern::dispatch_float(out.dtype(), name.c_str(), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_unary_grad<float>(op, args, [&](auto f) { elementwise<T>(f, out, {&grad, &saved}, stream); });
  });
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
