// CUDA backend: recurrent networks through cuDNN's RNN API (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8).
//
// Descriptors, workspace sizes and the map between tandem's flat weight layout (see tandem::rnn) and
// cuDNN's weight space are made once per network shape and kept per device. cuDNN locates each gate
// matrix and bias in its weight space (cudnnGetRNNWeightParams); where that placement equals tandem's
// layout the flat weight is handed to cuDNN as it is (and its gradient written in place), otherwise the
// pieces are copied into a scratch weight space and the gradient's pieces copied back.
//
// The sequence-length array cuDNN reads on the device is filled by a kernel at every call, so that a
// recorded step refills it at every replay. cuDNN's RNN has its own handle per device (the convolutions'
// handle is cuda_conv.cpp's), bound to the device's compute stream.
#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "tandem/ops.h"

namespace tandem::backend {

namespace {

constexpr size_t kMaxPlans = 128;

cudnnRNNMode_t cell_of(RnnMode m) {
  switch (m) {
    case RnnMode::RnnTanh: return CUDNN_RNN_TANH;
    case RnnMode::RnnRelu: return CUDNN_RNN_RELU;
    case RnnMode::Lstm: return CUDNN_LSTM;
    case RnnMode::Gru: return CUDNN_GRU;
  }
  return CUDNN_LSTM;
}

cudnnDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    default: TANDEM_CHECK(false, "rnn: dtype ", dtype_name(t), " does not run through cuDNN (f32, f16)");
  }
}

int to_int(int64_t v, const char* what) {
  TANDEM_CHECK(v >= 0 && v <= INT_MAX, "rnn: ", what, " ", v, " is too large for cuDNN");
  return static_cast<int>(v);
}

using PlanKey = std::array<int64_t, 11>;

PlanKey key_of(const RnnGeom& g) {
  return {static_cast<int64_t>(g.mode), g.input,       g.hidden, g.layers, g.bidirectional, g.bias,
          g.batch_first,                static_cast<int64_t>(g.dtype), g.math, g.seq, g.batch};
}

// A run of bytes of the flat weight (tandem's layout, src) and where it lies in cuDNN's weight space (dst).
struct Segment {
  size_t src, dst, bytes;
};

struct RnnPlan {
  cudnnDropoutDescriptor_t dropout = nullptr;
  cudnnRNNDescriptor_t rnn = nullptr;
  cudnnRNNDataDescriptor_t x = nullptr, y = nullptr;
  cudnnTensorDescriptor_t h = nullptr;
  size_t weight_bytes = 0;
  size_t work_train = 0, reserve_train = 0, work_infer = 0;
  std::vector<Segment> segments;  // merged, in tandem's order; they tile the flat weight
  bool identity = false;          // cuDNN's weight space is the flat weight itself

  RnnPlan(const RnnGeom& g, cudnnHandle_t handle, Allocator& alloc) {
    const cudnnDataType_t dt = data_type(g.dtype);
    const cudnnMathType_t math = g.math == 0 ? CUDNN_FMA_MATH : g.math == 1 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
    const int seq = to_int(g.seq, "sequence length"), batch = to_int(g.batch, "batch"),
              input = to_int(g.input, "input size"), hidden = to_int(g.hidden, "hidden size"),
              layers = to_int(g.layers, "layer count");
    const int dirs = static_cast<int>(g.directions());
    TANDEM_CUDNN_CHECK(cudnnCreateDropoutDescriptor(&dropout));
    TANDEM_CUDNN_CHECK(cudnnSetDropoutDescriptor(dropout, handle, 0.0f, nullptr, 0, 0));
    TANDEM_CUDNN_CHECK(cudnnCreateRNNDescriptor(&rnn));
    // Batch-major data is "unpacked", which cuDNN reads only with padded input and output enabled;
    // every sequence has the full length, so there is no padding.
    TANDEM_CUDNN_CHECK(cudnnSetRNNDescriptor_v8(
        rnn, CUDNN_RNN_ALGO_STANDARD, cell_of(g.mode), g.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
        g.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, dt, CUDNN_DATA_FLOAT, math,
        input, hidden, hidden, layers, dropout, g.batch_first ? CUDNN_RNN_PADDED_IO_ENABLED : CUDNN_RNN_PADDED_IO_DISABLED));
    const cudnnRNNDataLayout_t layout =
        g.batch_first ? CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED;
    const std::vector<int> lengths(static_cast<size_t>(batch), seq);
    TANDEM_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(&x));
    TANDEM_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(&y));
    TANDEM_CUDNN_CHECK(cudnnSetRNNDataDescriptor(x, dt, layout, seq, batch, input, lengths.data(), nullptr));
    TANDEM_CUDNN_CHECK(cudnnSetRNNDataDescriptor(y, dt, layout, seq, batch, dirs * hidden, lengths.data(), nullptr));
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&h));
    const int dims[3] = {layers * dirs, batch, hidden};
    const int strides[3] = {batch * hidden, hidden, 1};
    TANDEM_CUDNN_CHECK(cudnnSetTensorNdDescriptor(h, dt, 3, dims, strides));
    TANDEM_CUDNN_CHECK(cudnnGetRNNWeightSpaceSize(handle, rnn, &weight_bytes));
    TANDEM_CUDNN_CHECK(cudnnGetRNNTempSpaceSizes(handle, rnn, CUDNN_FWD_MODE_TRAINING, x, &work_train, &reserve_train));
    size_t unused = 0;
    TANDEM_CUDNN_CHECK(cudnnGetRNNTempSpaceSizes(handle, rnn, CUDNN_FWD_MODE_INFERENCE, x, &work_infer, &unused));
    map_weights(g, handle, alloc);
  }

  ~RnnPlan() {  // destroy errors are ignored: nothing can be done about them here
    if (h) cudnnDestroyTensorDescriptor(h);
    if (y) cudnnDestroyRNNDataDescriptor(y);
    if (x) cudnnDestroyRNNDataDescriptor(x);
    if (rnn) cudnnDestroyRNNDescriptor(rnn);
    if (dropout) cudnnDestroyDropoutDescriptor(dropout);
  }
  RnnPlan(const RnnPlan&) = delete;
  RnnPlan& operator=(const RnnPlan&) = delete;

 private:
  // Where cuDNN keeps each gate's matrix and bias, against tandem's layout. cuDNN only computes addresses
  // here, from the base of a weight space of the right size.
  void map_weights(const RnnGeom& g, cudnnHandle_t handle, Allocator& alloc) {
    Scratch space(alloc, weight_bytes);
    const char* base = space.as<char>();
    cudnnTensorDescriptor_t md = nullptr, bd = nullptr;
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&md));
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bd));
    struct Descs {
      cudnnTensorDescriptor_t m, b;
      ~Descs() {
        cudnnDestroyTensorDescriptor(m);
        cudnnDestroyTensorDescriptor(b);
      }
    } descs{md, bd};
    const size_t es = dtype_size(g.dtype);
    const int64_t G = rnn_gate_count(g.mode), H = g.hidden, D = g.directions();
    std::vector<Segment> segs;
    int64_t off = 0;  // elements of tandem's layout
    for (int64_t l = 0; l < g.layers; ++l) {
      const int64_t il = l == 0 ? g.input : D * H;
      for (int64_t d = 0; d < D; ++d) {
        const int pseudo = static_cast<int>(l * D + d);
        for (int64_t j = 0; j < 2 * G; ++j) {
          void* m = nullptr;
          void* b = nullptr;
          TANDEM_CUDNN_CHECK(cudnnGetRNNWeightParams(handle, rnn, pseudo, weight_bytes, base, static_cast<int>(j), md,
                                                     &m, bd, &b));
          const bool input_side = j < G;
          const int64_t len = input_side ? H * il : H * H;
          const int64_t src = input_side ? off + j * H * il : off + G * H * il + (j - G) * H * H;
          TANDEM_ASSERT(m != nullptr && element_count(md) == len, "rnn: cuDNN's matrix ", j, " of pseudo-layer ",
                        pseudo, " is not the expected ", len, " elements");
          segs.push_back({static_cast<size_t>(src) * es, static_cast<size_t>(static_cast<const char*>(m) - base),
                          static_cast<size_t>(len) * es});
          if (g.bias) {
            const int64_t bsrc = off + G * H * (il + H) + (input_side ? j * H : G * H + (j - G) * H);
            TANDEM_ASSERT(b != nullptr && element_count(bd) == H, "rnn: cuDNN's bias ", j, " of pseudo-layer ",
                          pseudo, " is not the expected ", H, " elements");
            segs.push_back({static_cast<size_t>(bsrc) * es, static_cast<size_t>(static_cast<const char*>(b) - base),
                            static_cast<size_t>(H) * es});
          }
        }
        off += G * H * (il + H) + (g.bias ? 2 * G * H : 0);
      }
    }
    TANDEM_ASSERT(off == rnn_weight_size(g.mode, g.input, g.hidden, g.layers, g.bidirectional, g.bias),
                  "rnn: weight layout of ", off, " elements");
    std::sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) { return a.src < b.src; });
    for (const Segment& s : segs) {
      if (!segments.empty()) {
        Segment& last = segments.back();
        if (last.src + last.bytes == s.src && last.dst + last.bytes == s.dst) {
          last.bytes += s.bytes;
          continue;
        }
      }
      segments.push_back(s);
    }
    identity = segments.size() == 1 && segments[0].src == 0 && segments[0].dst == 0 &&
               segments[0].bytes == weight_bytes;
  }

  static int64_t element_count(cudnnTensorDescriptor_t t) {
    cudnnDataType_t dt;
    int nd = 0, dims[8] = {0}, strides[8] = {0};
    TANDEM_CUDNN_CHECK(cudnnGetTensorNdDescriptor(t, 8, &dt, &nd, dims, strides));
    int64_t n = 1;
    for (int i = 0; i < nd; ++i) n *= dims[i];
    return n;
  }
};

// A device's cuDNN handle for recurrent networks and its plans. Never freed: a recorded step keeps
// using what its plans describe, and at exit the runtime may already be gone.
struct RnnCache {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<PlanKey, std::unique_ptr<RnnPlan>> plans;
  std::vector<std::unique_ptr<RnnPlan>> retired;  // dropped from the map, kept for recordings
};

RnnCache& cache_for(DeviceState& st) {
  static std::mutex mu;
  static auto* caches = new std::map<int, RnnCache*>();
  std::lock_guard<std::mutex> lock(mu);
  RnnCache*& c = (*caches)[st.device];
  if (!c) {
    auto made = std::make_unique<RnnCache>();
    TANDEM_CUDNN_CHECK(cudnnCreate(&made->handle));
    TANDEM_CUDNN_CHECK(cudnnSetStream(made->handle, st.stream));
    c = made.release();
  }
  return *c;
}

RnnPlan& plan_for(RnnCache& c, const RnnGeom& g, Allocator& alloc) {
  const PlanKey k = key_of(g);
  auto it = c.plans.find(k);
  if (it != c.plans.end()) return *it->second;
  if (c.plans.size() >= kMaxPlans) {  // shapes keep changing: start over rather than grow
    for (auto& [key, p] : c.plans) c.retired.push_back(std::move(p));
    c.plans.clear();
  }
  return *c.plans.emplace(k, std::make_unique<RnnPlan>(g, c.handle, alloc)).first->second;
}

void check_geom(const RnnGeom& g, const Tensor& x, const Tensor& w, const char* op) {
  TANDEM_CHECK(x.dtype() == g.dtype && w.dtype() == g.dtype && x.is_contiguous() && w.is_contiguous(), op, ": ",
               x.str(), " and ", w.str(), " must be contiguous ", dtype_name(g.dtype));
  TANDEM_CHECK(w.numel() == rnn_weight_size(g.mode, g.input, g.hidden, g.layers, g.bidirectional, g.bias), op,
               ": weight ", w.str(), " does not fit the network");
}

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mut_ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The flat weight in cuDNN's placement: w itself, or copied into `scratch`.
const void* weight_space(const RnnPlan& p, const Tensor& w, const Scratch& scratch, cudaStream_t stream) {
  if (p.identity) return w.data_ptr();
  const char* src = static_cast<const char*>(w.data_ptr());
  char* dst = scratch.as<char>();
  for (const Segment& s : p.segments)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst + s.dst, src + s.src, s.bytes, cudaMemcpyDeviceToDevice, stream));
  return dst;
}

}  // namespace

bool CudaBackend::rnn_supported(const RnnGeom& g) {
  if (g.dtype != DType::f32 && g.dtype != DType::f16) return false;
  const int64_t dirs = g.directions();
  for (int64_t v : {g.input, g.hidden, g.layers, g.seq, g.batch})
    if (v < 1 || v > INT_MAX / 4) return false;
  return g.layers * dirs <= INT_MAX / 4 && g.batch * g.hidden * g.layers * dirs < INT_MAX;
}

void CudaBackend::rnn_forward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                              bool training, Tensor& y, Tensor& hy, Tensor& cy, Tensor& reserve) {
  check_geom(g, x, w, "rnn");
  DeviceState& st = state_for(x);
  RnnCache& c = cache_for(st);
  Allocator& alloc = allocator(st.device);
  std::lock_guard<std::mutex> lock(c.mu);
  RnnPlan& p = plan_for(c, g, alloc);
  Tensor lengths = Tensor::full({g.batch}, static_cast<double>(g.seq), DType::i32, x.device());
  Scratch wcopy(alloc, p.identity ? 0 : p.weight_bytes);
  const void* wspace = weight_space(p, w, wcopy, st.stream);
  const size_t work_bytes = training ? p.work_train : p.work_infer;
  Scratch work(alloc, work_bytes);
  if (training) reserve = Tensor::empty({static_cast<int64_t>(std::max<size_t>(p.reserve_train, 1))}, DType::u8,
                                        x.device());
  TANDEM_CUDNN_CHECK(cudnnRNNForward(
      c.handle, p.rnn, training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE, lengths.data<int32_t>(), p.x,
      x.data_ptr(), p.y, y.data_ptr(), p.h, ptr_or_null(hx), mut_ptr_or_null(hy), p.h, ptr_or_null(cx),
      mut_ptr_or_null(cy), p.weight_bytes, wspace, work_bytes, work.as<void>(), training ? p.reserve_train : 0,
      training ? reserve.data_ptr() : nullptr));
}

void CudaBackend::rnn_backward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                               const Tensor& y, const Tensor& reserve, const Tensor& dy, const Tensor& dhy,
                               const Tensor& dcy, Tensor& dx, Tensor& dw, Tensor& dhx, Tensor& dcx) {
  check_geom(g, x, w, "rnn backward");
  TANDEM_CHECK(reserve.defined(), "rnn backward: the forward pass did not run in training mode");
  DeviceState& st = state_for(x);
  RnnCache& c = cache_for(st);
  Allocator& alloc = allocator(st.device);
  std::lock_guard<std::mutex> lock(c.mu);
  RnnPlan& p = plan_for(c, g, alloc);
  TANDEM_CHECK(reserve.numel() >= static_cast<int64_t>(p.reserve_train), "rnn backward: the reserve ",
               reserve.str(), " is smaller than cuDNN's ", p.reserve_train, " bytes");
  Tensor lengths = Tensor::full({g.batch}, static_cast<double>(g.seq), DType::i32, x.device());
  Scratch wcopy(alloc, p.identity ? 0 : p.weight_bytes);
  const void* wspace = weight_space(p, w, wcopy, st.stream);
  Scratch work(alloc, p.work_train);
  void* reserve_ptr = reserve.data_ptr();
  TANDEM_CUDNN_CHECK(cudnnRNNBackwardData_v8(
      c.handle, p.rnn, lengths.data<int32_t>(), p.y, y.data_ptr(), dy.data_ptr(), p.x, dx.data_ptr(), p.h,
      ptr_or_null(hx), ptr_or_null(dhy), mut_ptr_or_null(dhx), p.h, ptr_or_null(cx), ptr_or_null(dcy),
      mut_ptr_or_null(dcx), p.weight_bytes, wspace, p.work_train, work.as<void>(), p.reserve_train, reserve_ptr));
  if (!dw.defined()) return;  // the weight needs no gradient
  // cuDNN adds the weight gradient into its buffer: it starts from zeros.
  Scratch dcopy(alloc, p.identity ? 0 : p.weight_bytes);
  void* dspace = p.identity ? dw.data_ptr() : dcopy.as<void>();
  TANDEM_CUDA_CHECK(cudaMemsetAsync(dspace, 0, p.weight_bytes, st.stream));
  TANDEM_CUDNN_CHECK(cudnnRNNBackwardWeights_v8(c.handle, p.rnn, CUDNN_WGRAD_MODE_ADD, lengths.data<int32_t>(), p.x,
                                                x.data_ptr(), p.h, ptr_or_null(hx), p.y, y.data_ptr(), p.weight_bytes,
                                                dspace, p.work_train, work.as<void>(), p.reserve_train, reserve_ptr));
  if (!p.identity) {
    char* dst = static_cast<char*>(dw.data_ptr());
    const char* src = dcopy.as<char>();
    for (const Segment& s : p.segments)
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst + s.src, src + s.dst, s.bytes, cudaMemcpyDeviceToDevice, st.stream));
  }
}

}  // namespace tandem::backend
