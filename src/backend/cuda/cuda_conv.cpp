// CUDA backend: 2-D convolution through cuDNN, or as im2col and cuBLAS matrix products where those
// take less GPU time (small NCHW f32 convolutions, whose cuDNN kernels leave most of the GPU idle).
// Descriptors and algorithms are made once per geometry, element type, layout and math mode, and
// kept in a small per-device map, so a training step does no descriptor work and no search. Exact
// f32 uses FMA kernels only; TF32 and 16-bit data let cuDNN and cuBLAS pick tensor-core kernels.
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/tensor_impl.h"
#include "tandem/precision.h"

namespace tandem::backend {

namespace {
// Workspace the algorithm search may offer; algorithms that want more are passed over.
constexpr size_t kWorkspaceLimit = size_t(1) << 30;
constexpr size_t kMaxPlans = 256;

using GeomKey = std::array<int64_t, 17>;

/// How a convolution may compute: its element type and whether f32 may use TF32 tensor cores.
struct ConvMath {
  DType dtype = DType::f32;
  bool tf32 = false;
  bool exact() const { return dtype == DType::f32 && !tf32; }
};

GeomKey key_of(const ConvGeom& g, const ConvMath& m) {
  return {g.n,  g.c,  g.h,    g.w,  g.k,  g.r,  g.s,  g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.oh, g.ow,
          g.nhwc, static_cast<int64_t>(m.dtype) * 2 + m.tf32, deterministic_algorithms(), g.groups};
}

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: TANDEM_CHECK(false, "conv2d: dtype ", dtype_name(t), " is not supported on CUDA (use f32, f16 or bf16)");
  }
}

struct GeomHash {
  size_t operator()(const GeomKey& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    return static_cast<size_t>(h);
  }
};

int to_int(int64_t v, const char* what) {
  TANDEM_CHECK(v >= 0 && v <= INT_MAX, "conv2d: ", what, " ", v, " is too large for cuDNN");
  return static_cast<int>(v);
}

// Exact f32 skips algorithms that may use TF32 tensor cores: results must agree with the CPU. No mode
// lets cuDNN convert f32 data to f16.
bool math_allowed(cudnnMathType_t m, const ConvMath& cm) {
  if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return !cm.exact() || m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
}

// FFT and non-fused Winograd algorithms trade accuracy for speed (relative errors near 1e-3 in f32,
// far from the CPU's results, and worse in 16-bit): they are passed over in every precision.
bool accurate(cudnnConvolutionFwdAlgo_t a) {
  return a != CUDNN_CONVOLUTION_FWD_ALGO_FFT && a != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool accurate(cudnnConvolutionBwdDataAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool accurate(cudnnConvolutionBwdFilterAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// Whether the environment variable is set to exactly this one character (TANDEM_CONV_*=0 or 1).
bool getenv_is(const char* name, char value) {
  const char* e = std::getenv(name);
  return e && e[0] == value && e[1] == '\0';
}

// TANDEM_CONV_LOG=1 prints every algorithm search (for choosing and checking the rules below).
bool log_search() {
  static const bool on = [] {
    const char* e = std::getenv("TANDEM_CONV_LOG");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

// The math a search may explore: cuDNN's Find only tries the algorithms of the descriptor's math type,
// and a pass that ran with FMA math (a forward whose fastest algorithm was an FMA one) left the
// descriptor so, which hid every tensor-core algorithm from the backward passes' searches (a 16-bit
// backward then ran 10-14 ms FMA kernels instead of 0.25 ms tensor-core ones, depending on which way
// the forward's timing happened to fall). Every search starts from the widest math allowed.
cudnnMathType_t search_math(const ConvMath& m) { return m.exact() ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH; }

// Whether algorithms and paths are chosen by timing them. Not under deterministic_algorithms(): a timed
// choice may differ from one run to the next, and the bits with it; cuDNN's heuristics then give the
// order of the algorithms, and the other paths are left out unless their variables ask for them.
bool timed_choice() { return !deterministic_algorithms(); }

// The first usable algorithm (the list comes sorted fastest first, or in the heuristics' order); under
// deterministic_algorithms() only one that gives the same bits on every run.
template <typename Perf>
int pick(const Perf* perf, int count, const ConvMath& cm, const char* pass, const ConvGeom& g) {
  const bool deterministic = deterministic_algorithms();
  int chosen = -1;
  for (int i = 0; i < count && chosen < 0; ++i) {
    const Perf& p = perf[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= kWorkspaceLimit && math_allowed(p.mathType, cm) &&
        accurate(p.algo) && (!deterministic || p.determinism == CUDNN_DETERMINISTIC))
      chosen = i;
  }
  if (log_search()) {
    std::fprintf(stderr, "conv %s n%lld c%lld %lldx%lld k%lld %lldx%lld s%lld %s %s:", pass, (long long)g.n,
                 (long long)g.c, (long long)g.h, (long long)g.w, (long long)g.k, (long long)g.r, (long long)g.s,
                 (long long)g.stride_h, g.nhwc ? "nhwc" : "nchw", dtype_name(cm.dtype));
    for (int i = 0; i < count; ++i)
      std::fprintf(stderr, " %s[a%d m%d %.3fms %zuMB%s]", i == chosen ? "*" : "", int(perf[i].algo),
                   int(perf[i].mathType), perf[i].time, perf[i].memory >> 20, perf[i].status ? " fail" : "");
    std::fprintf(stderr, "\n");
  }
  return chosen;
}

/// Search workspace, taken straight from the driver: it is used once per geometry and would
/// otherwise sit unused in the cache. Shrinks when memory is short.
class SearchWorkspace {
 public:
  SearchWorkspace() {
    for (size_t size = kWorkspaceLimit; size >= (size_t(1) << 20); size /= 2) {
      cudaError_t err = cudaMalloc(&ptr_, size);
      if (err == cudaSuccess) {
        size_ = size;
        return;
      }
      if (err != cudaErrorMemoryAllocation) cuda::throw_cuda_error(err, "cudaMalloc", __FILE__, __LINE__);
      (void)cudaGetLastError();
      ptr_ = nullptr;
    }
  }
  ~SearchWorkspace() {
    if (ptr_) (void)cudaFree(ptr_);  // a destructor cannot throw; a failure here resurfaces at the next call
  }
  void* ptr() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};
}  // namespace

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  bool has_fwd = false, has_bwd_data = false, has_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  cudnnMathType_t fwd_math{}, bwd_data_math{}, bwd_filter_math{};
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
  bool fwd_gemm = false, bwd_data_gemm = false, bwd_filter_gemm = false;  // the matrix products won
  bool fwd_direct = false, bwd_filter_direct = false;                     // the direct kernels won
  bool bwd_data_strided = false, bwd_filter_strided = false;             // the strided pointwise products won
  ConvMath math;

  ConvPlan(const ConvGeom& g, const ConvMath& m) : math(m) {
    const cudnnDataType_t dt = cudnn_type(m.dtype);
    const cudnnTensorFormat_t fmt = g.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    TANDEM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    TANDEM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    TANDEM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, fmt, dt, to_int(g.n, "batch"), to_int(g.c, "channels"),
                                                  to_int(g.h, "height"), to_int(g.w, "width")));
    TANDEM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, fmt, dt, to_int(g.n, "batch"), to_int(g.k, "filters"),
                                                  to_int(g.oh, "output height"), to_int(g.ow, "output width")));
    TANDEM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, dt, fmt, to_int(g.k, "filters"),
                                                  to_int(g.group_c(), "channels per group"),
                                                  to_int(g.r, "kernel height"), to_int(g.s, "kernel width")));
    TANDEM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, to_int(g.pad_h, "padding"), to_int(g.pad_w, "padding"),
                                                       to_int(g.stride_h, "stride"), to_int(g.stride_w, "stride"), 1,
                                                       1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, to_int(g.groups, "groups")));
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, m.exact() ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    int n = 0, k = 0, oh = 0, ow = 0;
    TANDEM_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &n, &k, &oh, &ow));
    TANDEM_ASSERT(n == g.n && k == g.k && oh == g.oh && ow == g.ow, "cuDNN output shape ", n, "x", k, "x", oh, "x",
                  ow, " differs from the geometry's ", g.n, "x", g.k, "x", g.oh, "x", g.ow);
  }
  ~ConvPlan() {  // destroy errors are ignored: nothing can be done about them here
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
};

class ConvCache {
 public:
  ~ConvCache() {
    // At exit the runtime may be gone: nothing to do then.
    for (void* p : outgrown_) (void)cudaFree(p);
    if (workspace_) (void)cudaFree(workspace_);
  }
  /// One workspace for every convolution of the device (they run one after another on its stream),
  /// grown to the largest need. An outgrown workspace is kept until the device state goes: a recorded
  /// step (a training step, then an evaluation at a larger batch that grows the workspace) replays
  /// with the addresses it was recorded with.
  void* workspace(cudaStream_t /*stream*/, size_t bytes) {
    if (bytes <= workspace_bytes_) return workspace_;
    if (workspace_) outgrown_.push_back(workspace_);
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    TANDEM_CUDA_CHECK(cudaMalloc(&workspace_, bytes));
    workspace_bytes_ = bytes;
    return workspace_;
  }
  ConvPlan& plan(const ConvGeom& g, const ConvMath& m) {
    GeomKey k = key_of(g, m);
    auto it = plans_.find(k);
    if (it != plans_.end()) return *it->second;
    if (plans_.size() >= kMaxPlans) plans_.clear();  // geometries keep changing: start over rather than grow
    return *plans_.emplace(k, std::make_unique<ConvPlan>(g, m)).first->second;
  }

 private:
  std::unordered_map<GeomKey, std::unique_ptr<ConvPlan>, GeomHash> plans_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<void*> outgrown_;
};

DeviceState::DeviceState() = default;
DeviceState::~DeviceState() {
  // At exit the runtime may be gone: nothing to do then.
  for (void* p : outgrown_counters) (void)cudaFree(p);
  if (reduce_counters) (void)cudaFree(reduce_counters);
}

namespace {
cudnnHandle_t cudnn_handle(DeviceState& st) {
  st.cudnn_once([&] {
    cudnnHandle_t h = nullptr;
    TANDEM_CUDNN_CHECK(cudnnCreate(&h));
    TANDEM_CUDNN_CHECK(cudnnSetStream(h, st.stream));
    st.conv = std::make_unique<ConvCache>();
    st.cudnn = h;
  });
  return st.cudnn;
}

// Checks shapes and that the data tensors share one floating type; returns the math to use.
ConvMath check_conv(const ConvGeom& g, const Tensor& x, const Tensor& w, const Tensor& y, const char* op) {
  TANDEM_ASSERT(x.numel() == g.n * g.c * g.h * g.w && w.numel() == g.k * g.group_c() * g.r * g.s &&
                    y.numel() == g.n * g.k * g.oh * g.ow,
                op, ": tensors do not match the geometry");
  TANDEM_CHECK(x.dtype() == w.dtype() && x.dtype() == y.dtype(), op, ": ", x.str(), ", ", w.str(), " and ", y.str(),
               " differ in dtype");
  cudnn_type(x.dtype());  // throws for types cuDNN convolutions do not take here
  // TF32 for f32 data under any reduced precision (a mixed precision computes some layers in f32).
  return {x.dtype(), x.dtype() == DType::f32 && current_precision() != Precision::f32};
}

void* conv_workspace(DeviceState& st, size_t bytes) { return st.conv->workspace(st.stream, bytes); }

// ---- convolution as matrix products: im2col, then cuBLAS (row-major products written column-major)

// Unfolded inputs up to 256 MiB (2^26 f32, which also keeps indices in 32 bits); beyond that cuDNN's
// kernels fill the GPU anyway. The matrix products treat all channels as one group: grouped
// convolutions are cuDNN's.
bool gemm_path_fits(const ConvGeom& g, const ConvMath& m) {
  if (g.groups != 1 || g.nhwc || m.dtype != DType::f32) return false;
  if (g.r > 64 || g.s > 64) return false;  // col2im unrolls up to 64 taps
  const int64_t limit = int64_t(1) << 26;
  return g.n * g.c * g.r * g.s * g.oh * g.ow <= limit && g.n * g.k * g.oh * g.ow <= limit &&
         g.n * g.c * g.h * g.w <= limit;
}
int64_t col_elems(const ConvGeom& g) { return g.n * g.c * g.r * g.s * g.oh * g.ow; }
// A 1x1 convolution with stride 1 and no padding: the unfolded input [n][c][p] is the input itself, and
// the column gradients are the input gradient.
bool pointwise(const ConvGeom& g) {
  return g.r == 1 && g.s == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0;
}
size_t gemm_fwd_bytes(const ConvGeom& g) { return pointwise(g) ? 0 : static_cast<size_t>(col_elems(g)) * 4; }
size_t gemm_bwd_filter_bytes(const ConvGeom& g) {
  return static_cast<size_t>(col_elems(g) + g.n * g.k * g.oh * g.ow) * 4;
}

// A 1x1 convolution with a stride above 1 and no padding, channels-last in 16 bits (a residual
// network's downsampling shortcut): its input gradient is one matrix product put back at every
// stride-th position, its weight gradient one product with the input at those positions. Each is timed
// against cuDNN's pick and taken where faster (at ResNet-18's shortcuts on Fashion-MNIST, batch 128, on
// an H200: the weight gradient in 0.008-0.010 ms against cuDNN's 0.009-0.029 ms; the input gradient
// stays with cuDNN).
bool strided_pointwise(const ConvGeom& g, const ConvMath& m) {
  return g.nhwc && m.dtype != DType::f32 && g.r == 1 && g.s == 1 && g.pad_h == 0 && g.pad_w == 0 &&
         (g.stride_h > 1 || g.stride_w > 1) && g.c % 8 == 0 && g.k % 8 == 0;
}

cublasComputeType_t gemm_compute(const ConvMath& m) { return m.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; }

// y[n] (k x p) = w (k x crs) * col[n] (crs x p), one product per sample.
void gemm_forward(DeviceState& st, const Tensor& x, const Tensor& w, const ConvGeom& g, const ConvMath& m, Tensor& y,
                  void* ws) {
  const int64_t crs = g.c * g.r * g.s, p = g.oh * g.ow;
  const float* col = x.data<float>();
  if (!pointwise(g)) {
    launch_im2col(x.data<float>(), static_cast<float*>(ws), g, crs * p, p, st.stream);
    col = static_cast<const float*>(ws);
  }
  const float one = 1.0f, zero = 0.0f;
  std::lock_guard<std::mutex> lock(st.cublas_mu);
  TANDEM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      st.cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p), static_cast<int>(g.k), static_cast<int>(crs), &one,
      col, CUDA_R_32F, static_cast<int>(p), crs * p, w.data_ptr(), CUDA_R_32F, static_cast<int>(crs), 0, &zero,
      y.data_ptr(), CUDA_R_32F, static_cast<int>(p), g.k * p, static_cast<int>(g.n), gemm_compute(m),
      CUBLAS_GEMM_DEFAULT));
}

// dcol[n] (crs x p) = w^T (crs x k) * dy[n] (k x p), then folded back onto dx.
// accumulate (pointwise convolutions only): dx += the gradient, through the product's beta.
void gemm_backward_data(DeviceState& st, const Tensor& dy, const Tensor& w, const ConvGeom& g, const ConvMath& m,
                        Tensor& dx, void* ws, bool accumulate) {
  TANDEM_ASSERT(!accumulate || pointwise(g), "conv2d backward: accumulating through col2im");
  const int64_t crs = g.c * g.r * g.s, p = g.oh * g.ow;
  auto* dcol = pointwise(g) ? dx.data<float>() : static_cast<float*>(ws);
  const float one = 1.0f, zero = 0.0f;
  {
    std::lock_guard<std::mutex> lock(st.cublas_mu);
    TANDEM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        st.cublas, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(p), static_cast<int>(crs), static_cast<int>(g.k), &one,
        dy.data_ptr(), CUDA_R_32F, static_cast<int>(p), g.k * p, w.data_ptr(), CUDA_R_32F, static_cast<int>(crs), 0,
        accumulate ? &one : &zero, dcol, CUDA_R_32F, static_cast<int>(p), crs * p, static_cast<int>(g.n),
        gemm_compute(m),
        CUBLAS_GEMM_DEFAULT));
  }
  if (!pointwise(g)) launch_col2im(dcol, dx.data<float>(), g, st.stream);
}

// dw (k x crs) = dy as [k][n p] times the columns laid out [crs][n p], transposed: one product whose
// inner dimension runs over the whole batch.
void gemm_backward_filter(DeviceState& st, const Tensor& dy, const Tensor& x, const ConvGeom& g, const ConvMath& m,
                          Tensor& dw, void* ws) {
  const int64_t crs = g.c * g.r * g.s, p = g.oh * g.ow, np = g.n * p;
  auto* col = static_cast<float*>(ws);
  float* dyt = col + col_elems(g);
  launch_im2col(x.data<float>(), col, g, p, np, st.stream);
  launch_nkp_to_knp(dy.data<float>(), dyt, g.n, g.k, p, st.stream);
  const float one = 1.0f, zero = 0.0f;
  std::lock_guard<std::mutex> lock(st.cublas_mu);
  TANDEM_CUBLAS_CHECK(cublasGemmEx(st.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(crs), static_cast<int>(g.k),
                                   static_cast<int>(np), &one, col, CUDA_R_32F, static_cast<int>(np), dyt, CUDA_R_32F,
                                   static_cast<int>(np), &zero, dw.data_ptr(), CUDA_R_32F, static_cast<int>(crs),
                                   gemm_compute(m), CUBLAS_GEMM_DEFAULT));
}

// GPU milliseconds of one call of `run`: several calls recorded into a graph and replayed, so that
// the host's launch cost (which a recorded training step does not pay) is left out.
template <typename F>
float gpu_ms(cudaStream_t stream, F&& run) {
  constexpr int kRuns = 8;
  run();  // settles anything done on first use
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  cudaGraph_t graph = nullptr;
  try {
    for (int i = 0; i < kRuns; ++i) run();
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  float ms = 0;
  cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  if (err == cudaSuccess) err = cudaEventCreate(&start);
  if (err == cudaSuccess) err = cudaEventCreate(&stop);
  if (err == cudaSuccess) err = cudaGraphLaunch(exec, stream);  // warm
  if (err == cudaSuccess) err = cudaEventRecord(start, stream);
  if (err == cudaSuccess) err = cudaGraphLaunch(exec, stream);
  if (err == cudaSuccess) err = cudaEventRecord(stop, stream);
  if (err == cudaSuccess) err = cudaEventSynchronize(stop);
  if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, start, stop);
  if (stop) cudaEventDestroy(stop);
  if (start) cudaEventDestroy(start);
  if (exec) cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) cuda::throw_cuda_error(err, "timing a convolution", __FILE__, __LINE__);
  return ms / kRuns;
}

// Times cuDNN's pick against the matrix products; true when the latter take less GPU time.
// TANDEM_CONV_GEMM=1 takes the matrix products wherever they fit, =0 never (tests, comparisons).
template <typename CudnnRun, typename GemmRun>
bool gemm_wins(DeviceState& st, const char* pass, const ConvGeom& g, CudnnRun&& cudnn, GemmRun&& gemm) {
  if (getenv_is("TANDEM_CONV_GEMM", '0') || getenv_is("TANDEM_CONV_GEMM", '1')) return getenv_is("TANDEM_CONV_GEMM", '1');
  if (!timed_choice()) return false;
  const float t_cudnn = gpu_ms(st.stream, cudnn), t_gemm = gpu_ms(st.stream, gemm);
  if (log_search())
    std::fprintf(stderr, "conv %s n%lld c%lld %lldx%lld k%lld %lldx%lld: cuDNN %.4f ms, im2col+cuBLAS %.4f ms%s\n",
                 pass, (long long)g.n, (long long)g.c, (long long)g.h, (long long)g.w, (long long)g.k, (long long)g.r,
                 (long long)g.s, t_cudnn, t_gemm, t_gemm < t_cudnn ? " *" : "");
  return t_gemm < t_cudnn;
}

// Times another path (tandem's direct kernel, the strided pointwise products) against the path chosen
// so far and takes it only when it is faster and its result agrees with that path's within rel_tol of
// the largest value (TF32's rounding for the direct f32 kernels, 16-bit rounding for the others): a
// path that disagrees is reported and left out. The environment variable `env` set to 1 takes the other
// path wherever it fits, 0 never (tests, comparisons).
template <typename CurrentRun, typename OtherRun>
bool other_wins(DeviceState& st, const char* pass, const char* name, const char* env, double rel_tol,
                const ConvGeom& g, CurrentRun&& current, OtherRun&& other, const Tensor& out) {
  if (getenv_is(env, '0') || getenv_is(env, '1')) return getenv_is(env, '1');
  if (!timed_choice()) return false;
  const float t_current = gpu_ms(st.stream, current), t_other = gpu_ms(st.stream, other);
  if (log_search())
    std::fprintf(stderr, "conv %s n%lld c%lld %lldx%lld k%lld %lldx%lld s%lld: chosen so far %.4f ms, %s %.4f ms%s\n",
                 pass, (long long)g.n, (long long)g.c, (long long)g.h, (long long)g.w, (long long)g.k, (long long)g.r,
                 (long long)g.s, (long long)g.stride_h, t_current, name, t_other, t_other < t_current ? " *" : "");
  if (t_other >= t_current) return false;
  current();
  const std::vector<float> want = out.to(DType::f32).to_vector<float>();
  other();
  const std::vector<float> got = out.to(DType::f32).to_vector<float>();
  double largest = 0.0, worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(want[i])));
    const double d = std::fabs(static_cast<double>(want[i]) - static_cast<double>(got[i]));
    worst = std::isnan(d) ? HUGE_VAL : std::max(worst, d);
  }
  if (worst <= rel_tol * largest + 1e-6) return true;
  std::fprintf(stderr, "tandem: the %s convolution path (%s, n%lld c%lld %lldx%lld k%lld %lldx%lld) differs from the "
               "other path by %g (largest value %g); it is not used\n", name, pass, (long long)g.n, (long long)g.c,
               (long long)g.h, (long long)g.w, (long long)g.k, (long long)g.r, (long long)g.s, worst, largest);
  return false;
}

const char* math_name(const ConvMath& m) { return m.exact() ? "exact f32" : m.tf32 ? "TF32" : dtype_name(m.dtype); }
}  // namespace

void CudaBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g, Tensor& y,
                                 bool relu) {
  const ConvMath math = check_conv(g, x, w, y, "conv2d");
  if (y.numel() == 0) return;
  DeviceState& st = state_for(y);
  // The direct kernel adds an f32 bias itself.
  const float* bias_f32 = b.defined() && b.dtype() == DType::f32 ? b.data<float>() : nullptr;
  const bool direct_ok = !b.defined() || bias_f32;
  {
    cudnnHandle_t h = cudnn_handle(st);
    std::lock_guard<std::mutex> lock(st.cudnn_mu);
    ConvPlan& p = st.conv->plan(g, math);
    const float one = 1.0f, zero = 0.0f;
    if (!p.has_fwd) {
      SearchWorkspace ws;
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      int found = 0;
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, search_math(math)));
      if (timed_choice())
        TANDEM_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x, x.data_ptr(), p.w, w.data_ptr(), p.conv,
                                                                  p.y, y.data_ptr(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                                  &found, perf, ws.ptr(), ws.size()));
      else
        TANDEM_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y,
                                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
      int i = pick(perf, found, math, "fwd", g);
      TANDEM_RUNTIME_CHECK(i >= 0, "conv2d: cuDNN offers no ", math_name(math), " forward algorithm for input ",
                           x.str(), " and weight ", w.str());
      p.fwd = perf[i].algo;
      p.fwd_math = perf[i].mathType;
      p.fwd_ws = perf[i].memory;
      if (gemm_path_fits(g, math)) {
        TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.fwd_math));
        void* ws = conv_workspace(st, std::max(p.fwd_ws, gemm_fwd_bytes(g)));
        p.fwd_gemm = gemm_wins(
            st, "fwd", g,
            [&] {
              TANDEM_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, x.data_ptr(), p.w, w.data_ptr(), p.conv, p.fwd,
                                                         ws, p.fwd_ws, &zero, p.y, y.data_ptr()));
            },
            [&] { gemm_forward(st, x, w, g, math, y, ws); });
      }
      if (math.dtype == DType::f32 && direct_ok && direct_conv_fits(g)) {
        // Both sides timed with this call's bias and ReLU: the direct kernel adds them as it stores y.
        TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.fwd_math));
        void* ws = conv_workspace(st, std::max(p.fwd_ws, gemm_path_fits(g, math) ? gemm_fwd_bytes(g) : 0));
        p.fwd_direct = other_wins(
            st, "fwd", "direct", "TANDEM_CONV_DIRECT", 1e-2, g,
            [&] {
              if (p.fwd_gemm)
                gemm_forward(st, x, w, g, math, y, ws);
              else
                TANDEM_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, x.data_ptr(), p.w, w.data_ptr(), p.conv,
                                                           p.fwd, ws, p.fwd_ws, &zero, p.y, y.data_ptr()));
              conv_epilogue(g, b, relu, y);
            },
            [&] { launch_direct_forward(x.data<float>(), w.data<float>(), bias_f32, relu, y.data<float>(), g, st.stream); },
            y);
      }
      p.has_fwd = true;
    }
    if (p.fwd_direct && direct_ok) {
      launch_direct_forward(x.data<float>(), w.data<float>(), bias_f32, relu, y.data<float>(), g, st.stream);
      return;
    }
    if (p.fwd_gemm) {
      gemm_forward(st, x, w, g, math, y, conv_workspace(st, gemm_fwd_bytes(g)));
    } else {
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.fwd_math));
      void* ws = conv_workspace(st, p.fwd_ws);
      TANDEM_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, x.data_ptr(), p.w, w.data_ptr(), p.conv, p.fwd,
                                                 ws, p.fwd_ws, &zero, p.y, y.data_ptr()));
    }
  }
  conv_epilogue(g, b, relu, y);
}

void CudaBackend::conv_epilogue(const ConvGeom& g, const Tensor& b, bool relu, Tensor& y) {
  // Channels-last output is [n * oh * ow, k] rows for the bias.
  const int64_t n = g.nhwc ? g.n * g.oh * g.ow : g.n, s = g.nhwc ? 1 : g.oh * g.ow;
  if (relu)
    bias_relu(y, b, n, g.k, s, y);
  else if (b.defined())
    bias_add(y, b, n, g.k, s, y);
}

void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx,
                                       bool accumulate) {
  const ConvMath math = check_conv(g, dx, w, dy, "conv2d backward");
  if (dx.numel() == 0) return;
  DeviceState& st = state_for(dx);
  if (dy.numel() == 0) {
    if (!accumulate) fill(dx, 0.0);
    return;
  }
  if (accumulate) {
    // cuDNN and the pointwise product add through their beta; col2im (which writes whole positions)
    // takes a temporary, added afterwards. The algorithm search writes its output, so a geometry's
    // first call searches into a temporary and then adds as every later call does: in 16 bits a sum
    // through beta is rounded once and a temporary added afterwards twice, and the bits must not depend
    // on whether the geometry was new to the process.
    auto plan_state = [&](bool& searched, bool& direct) {
      std::lock_guard<std::mutex> lock(st.cudnn_mu);
      const ConvPlan& p = st.conv->plan(g, math);
      searched = p.has_bwd_data;
      direct = p.has_bwd_data && (!p.bwd_data_gemm || pointwise(g));
    };
    auto temporary = [&] {
      Tensor part = as_strided(Tensor::empty({dx.numel()}, dx.dtype(), dx.device()), dx.shape(), dx.strides(), 0);
      conv2d_backward_data(dy, w, g, part, false);
      return part;
    };
    bool searched = false, direct = false;
    plan_state(searched, direct);
    Tensor part;
    if (!searched) {
      part = temporary();
      plan_state(searched, direct);
    }
    if (!direct) {
      if (!part.defined()) part = temporary();
      binary(Binary::Add, dx, part, dx);
      return;
    }
  }
  cudnnHandle_t h = cudnn_handle(st);
  std::lock_guard<std::mutex> lock(st.cudnn_mu);
  ConvPlan& p = st.conv->plan(g, math);
  const float one = 1.0f, zero = 0.0f;
  if (!p.has_bwd_data) {
    SearchWorkspace ws;
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int found = 0;
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, search_math(math)));
    if (timed_choice())
      TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, p.w, w.data_ptr(), p.y, dy.data_ptr(), p.conv, p.x, dx.data_ptr(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
          &found, perf, ws.ptr(), ws.size()));
    else
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          h, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf));
    int i = pick(perf, found, math, "bwd-data", g);
    TANDEM_RUNTIME_CHECK(i >= 0, "conv2d: cuDNN offers no ", math_name(math), " backward-data algorithm for gradient ",
                         dy.str(), " and weight ", w.str());
    p.bwd_data = perf[i].algo;
    p.bwd_data_math = perf[i].mathType;
    p.bwd_data_ws = perf[i].memory;
    if (gemm_path_fits(g, math)) {
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.bwd_data_math));
      void* ws = conv_workspace(st, std::max(p.bwd_data_ws, gemm_fwd_bytes(g)));
      p.bwd_data_gemm = gemm_wins(
          st, "bwd-data", g,
          [&] {
            TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p.w, w.data_ptr(), p.y, dy.data_ptr(), p.conv,
                                                            p.bwd_data, ws, p.bwd_data_ws, &zero, p.x, dx.data_ptr()));
          },
          [&] { gemm_backward_data(st, dy, w, g, math, dx, ws, false); });
    }
    if (strided_pointwise(g, math)) {
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.bwd_data_math));
      void* ws = conv_workspace(st, p.bwd_data_ws);
      p.bwd_data_strided = other_wins(
                               st, "bwd-data", "strided pointwise", "TANDEM_CONV_STRIDED", 2e-2, g,
                               [&] {
                                 TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardData(
                                     h, &one, p.w, w.data_ptr(), p.y, dy.data_ptr(), p.conv, p.bwd_data, ws,
                                     p.bwd_data_ws, &zero, p.x, dx.data_ptr()));
                               },
                               [&] { strided_backward_data(dy, w, g, dx, false); }, dx);
    }
    p.has_bwd_data = true;
  }
  if (p.bwd_data_strided) {
    strided_backward_data(dy, w, g, dx, accumulate);
    return;
  }
  if (p.bwd_data_gemm) {
    gemm_backward_data(st, dy, w, g, math, dx, conv_workspace(st, gemm_fwd_bytes(g)), accumulate);
    return;
  }
  TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.bwd_data_math));
  void* ws = conv_workspace(st, p.bwd_data_ws);
  TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p.w, w.data_ptr(), p.y, dy.data_ptr(), p.conv, p.bwd_data,
                                                  ws, p.bwd_data_ws, accumulate ? &one : &zero, p.x, dx.data_ptr()));
}

void CudaBackend::conv2d_backward_weight(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw,
                                         Tensor& db) {
  if (db.defined()) {
    if (g.nhwc)
      bias_grad(dy, g.n * g.oh * g.ow, g.k, 1, db);
    else
      bias_grad(dy, g.n, g.k, g.oh * g.ow, db);
  }
  if (!dw.defined()) return;
  const ConvMath math = check_conv(g, x, dw, dy, "conv2d backward");
  if (dw.numel() == 0) return;
  DeviceState& st = state_for(dw);
  if (dy.numel() == 0) {
    fill(dw, 0.0);
    return;
  }
  cudnnHandle_t h = cudnn_handle(st);
  std::lock_guard<std::mutex> lock(st.cudnn_mu);
  ConvPlan& p = st.conv->plan(g, math);
  const float one = 1.0f, zero = 0.0f;
  if (!p.has_bwd_filter) {
    SearchWorkspace ws;
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int found = 0;
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, search_math(math)));
    if (timed_choice())
      TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, p.x, x.data_ptr(), p.y, dy.data_ptr(), p.conv, p.w, dw.data_ptr(),
          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf, ws.ptr(), ws.size()));
    else
      TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf));
    int i = pick(perf, found, math, "bwd-filter", g);
    TANDEM_RUNTIME_CHECK(i >= 0, "conv2d: cuDNN offers no ", math_name(math), " backward-filter algorithm for input ",
                         x.str(), " and gradient ", dy.str());
    p.bwd_filter = perf[i].algo;
    p.bwd_filter_math = perf[i].mathType;
    p.bwd_filter_ws = perf[i].memory;
    if (gemm_path_fits(g, math)) {
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.bwd_filter_math));
      void* ws = conv_workspace(st, std::max(p.bwd_filter_ws, gemm_bwd_filter_bytes(g)));
      p.bwd_filter_gemm = gemm_wins(
          st, "bwd-filter", g,
          [&] {
            TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p.x, x.data_ptr(), p.y, dy.data_ptr(), p.conv,
                                                              p.bwd_filter, ws, p.bwd_filter_ws, &zero, p.w,
                                                              dw.data_ptr()));
          },
          [&] { gemm_backward_filter(st, dy, x, g, math, dw, ws); });
    }
    if (math.dtype == DType::f32 && direct_conv_fits(g)) {
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.bwd_filter_math));
      const size_t gemm_bytes = gemm_path_fits(g, math) ? gemm_bwd_filter_bytes(g) : 0;
      void* ws = conv_workspace(st, std::max({p.bwd_filter_ws, gemm_bytes, direct_wgrad_bytes(g, st.sm_count)}));
      p.bwd_filter_direct = other_wins(
          st, "bwd-filter", "direct", "TANDEM_CONV_DIRECT", 1e-2, g,
          [&] {
            if (p.bwd_filter_gemm)
              gemm_backward_filter(st, dy, x, g, math, dw, ws);
            else
              TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p.x, x.data_ptr(), p.y, dy.data_ptr(), p.conv,
                                                                p.bwd_filter, ws, p.bwd_filter_ws, &zero, p.w,
                                                                dw.data_ptr()));
          },
          [&] {
            launch_direct_wgrad(dy.data<float>(), x.data<float>(), dw.data<float>(), static_cast<float*>(ws), g,
                                st.sm_count, st.stream);
          },
          dw);
    }
    if (strided_pointwise(g, math)) {
      TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.bwd_filter_math));
      void* ws = conv_workspace(st, p.bwd_filter_ws);
      p.bwd_filter_strided = other_wins(
                                 st, "bwd-filter", "strided pointwise", "TANDEM_CONV_STRIDED", 2e-2, g,
                                 [&] {
                                   TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
                                       h, &one, p.x, x.data_ptr(), p.y, dy.data_ptr(), p.conv, p.bwd_filter, ws,
                                       p.bwd_filter_ws, &zero, p.w, dw.data_ptr()));
                                 },
                                 [&] { strided_backward_filter(dy, x, g, dw); }, dw);
    }
    p.has_bwd_filter = true;
  }
  if (p.bwd_filter_strided) {
    strided_backward_filter(dy, x, g, dw);
    return;
  }
  if (p.bwd_filter_direct) {
    void* ws = conv_workspace(st, direct_wgrad_bytes(g, st.sm_count));
    launch_direct_wgrad(dy.data<float>(), x.data<float>(), dw.data<float>(), static_cast<float*>(ws), g, st.sm_count,
                        st.stream);
    return;
  }
  if (p.bwd_filter_gemm) {
    gemm_backward_filter(st, dy, x, g, math, dw, conv_workspace(st, gemm_bwd_filter_bytes(g)));
    return;
  }
  TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.bwd_filter_math));
  void* ws = conv_workspace(st, p.bwd_filter_ws);
  TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p.x, x.data_ptr(), p.y, dy.data_ptr(), p.conv,
                                                    p.bwd_filter, ws, p.bwd_filter_ws, &zero, p.w,
                                                    dw.data_ptr()));
}

// dx = (dy as [n oh ow, k]) x (w as [k, c]), put back at the positions the stride picks.
void CudaBackend::strided_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx,
                                        bool accumulate) {
  const int64_t m = g.n * g.oh * g.ow;
  Tensor rows = Tensor::empty({m, g.c}, dy.dtype(), dy.device());
  Tensor dyv = as_strided(dy, {m, g.k}, {g.k, 1}, dy.impl()->offset);
  Tensor wv = as_strided(w, {g.k, g.c}, {g.c, 1}, w.impl()->offset);
  gemm(false, false, m, g.c, g.k, 1.0, dyv, wv, 0.0, rows);
  launch_scatter_strided_nhwc(rows.data_ptr(), dx.data_ptr(), dx.dtype(), g, accumulate, state_for(dx).stream);
}

// dw (as [k, c]) = (dy as [n oh ow, k])^T x (the input at the picked positions, [n oh ow, c]).
void CudaBackend::strided_backward_filter(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw) {
  const int64_t m = g.n * g.oh * g.ow;
  Tensor rows = Tensor::empty({m, g.c}, x.dtype(), x.device());
  launch_gather_strided_nhwc(x.data_ptr(), rows.data_ptr(), x.dtype(), g, state_for(x).stream);
  Tensor dyv = as_strided(dy, {m, g.k}, {g.k, 1}, dy.impl()->offset);
  Tensor dwv = as_strided(dw, {g.k, g.c}, {g.c, 1}, dw.impl()->offset);
  gemm(true, false, g.k, g.c, m, 1.0, dyv, rows, 0.0, dwv);
}

}  // namespace tandem::backend
