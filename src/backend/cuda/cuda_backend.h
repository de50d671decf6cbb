#pragma once
// Internal: the CUDA backend. Device state, memory, copies and GEMM live in cuda_backend.cpp, the
// pinned allocator in cuda_pinned.cpp, convolution in cuda_conv.cpp, and the kernels by family in
// cuda_*.cu. Every kernel is queued on the device's compute stream; nothing here waits for the GPU
// except copy_to_host and synchronize.
#include <cublas_v2.h>
#include <cudnn.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_context.h"
#include "core/init_once.h"

namespace tandem::backend {

/// A label outside [0, classes) seen by a loss kernel. Lives in host-mapped memory, so after a stream
/// synchronisation the host reads it without another copy.
struct LabelErrorRecord {
  int flag;
  int kind;  // 0: a loss's label outside [0, classes); 1: an embedding's index outside [0, rows)
  long long row, label, classes;
};

/// What a kernel needs to report a bad label: the claim word (device memory) elects one writer, which
/// fills the host-mapped record.
struct ErrorSink {
  int* claim;
  LabelErrorRecord* rec;
};

class ConvCache;  // cuda_conv.cpp: descriptors and algorithms per convolution geometry
class LtCache;    // cuda_gemm_lt.cpp: cuBLASLt's handle and its plans per fused product

/// What the backend keeps per device, created on the first kernel call for that device.
struct DeviceState {
  int device = 0;
  cudaStream_t stream = nullptr;
  int sm_count = 0;
  int compute_capability = 0;  // major * 10 + minor: 90 for Hopper
  cublasHandle_t cublas = nullptr;
  std::mutex cublas_mu;  // a handle must not be used by two threads at once (cuBLAS's and cuBLASLt's)
  void* cublas_workspace = nullptr;  // shared by cuBLAS and cuBLASLt (their work is ordered on the stream)
  size_t cublas_workspace_bytes = 0;
  std::shared_ptr<LtCache> lt;       // created at the first fused product
  InitOnce cudnn_once;
  cudnnHandle_t cudnn = nullptr;
  std::mutex cudnn_mu;  // guards the cuDNN handle and the convolution cache
  std::unique_ptr<ConvCache> conv;
  unsigned* reduce_counters = nullptr;   // per-channel reductions: completion counters, zero between launches
  int64_t reduce_counter_count = 0;
  std::vector<unsigned*> outgrown_counters;  // kept for recorded steps that still use them
  ErrorSink errors{};                    // device-side addresses, passed to kernels
  // Replays of recorded work so far: each recording starts by adding one, and random kernels add
  // it to their counters, so that a replayed dropout draws a new mask every time.
  unsigned long long* replays = nullptr;
  LabelErrorRecord* error_host = nullptr;  // the same record, as the host sees it
  DeviceState();
  ~DeviceState();
};

/// Page-locked host memory for asynchronous uploads. A freed block may still be the source of copies
/// queued on a compute stream, so it is handed out again only once the events recorded on every
/// compute stream at its release have completed.
class PinnedAllocator final : public Allocator {
 public:
  explicit PinnedAllocator(int device_count) : device_count_(device_count) {}
  void* allocate(size_t nbytes) override;
  void deallocate(void* p, size_t nbytes) override;
  void release_cached() override;
  /// Bytes held in freed blocks (ready or not).
  size_t bytes_cached() const;

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    std::vector<cudaEvent_t> events;  // per device, created on first use
    std::vector<bool> pending;        // recorded at the last release
  };
  /// True when every copy queued before the block's release has finished (throws on device errors).
  bool ready(Block& b);
  void free_block(Block* b);

  int device_count_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block*> in_use_;
  std::multimap<size_t, Block*> free_;
  size_t cached_ = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend();
  int device_count() override { return device_count_; }
  std::string device_name(int device) override;
  Allocator& allocator(int device) override;
  /// A block of nbytes' size class cached by the device's own allocator, handed over (or null).
  void* take_cached_block(int device, size_t nbytes);
  Allocator* pinned_allocator() override { return pinned_.get(); }
  bool memory_info(int device, size_t& free, size_t& total) override;
  void copy_from_host(const void* src, void* dst, size_t nbytes, int device) override;
  void copy_to_host(const void* src, void* dst, size_t nbytes, int device) override;
  void copy_bytes(const void* src, void* dst, size_t nbytes, int device) override;
  void synchronize(int device) override;
  void profile_range(bool on) override;
  std::unique_ptr<CapturedWork> capture(int device, const std::function<void()>& body) override;
  size_t captured_pool_bytes(int device) override;
  size_t captured_pool_peak_bytes(int device) override;

  void copy_strided(const Tensor& src, Tensor& dst) override;
  void fill(Tensor& t, double value) override;
  void gather_samples(const Tensor& images, const Tensor& labels, const Tensor& order, Tensor& cursor, float divisor,
                      Tensor& x, Tensor& y) override;
  using Backend::token_windows;
  void token_windows(const Tensor& tokens, const Tensor& mask, Tensor& cursor, uint64_t seed, bool random,
                     int64_t frame, Tensor& x, Tensor& y, Tensor& pos) override;
  void random_uniform(Tensor& t, uint64_t seed, uint64_t offset, double lo, double hi) override;
  void random_normal(Tensor& t, uint64_t seed, uint64_t offset, double mean, double std) override;

  void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void unary(Unary op, const Tensor& a, Tensor& out, const EwArgs& args = {}) override;
  void ternary(Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) override;
  void affine(const Tensor& a, double alpha, double beta, Tensor& out) override;
  void axpy(double alpha, const Tensor& x, Tensor& y) override;
  void unary_backward(Unary op, const Tensor& grad, const Tensor& saved, Tensor& out,
                      const EwArgs& args = {}) override;
  void bias_add(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) override;
  void bias_grad(const Tensor& g, int64_t n, int64_t c, int64_t s, Tensor& out) override;
  void bias_relu(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) override;
  void relu_bias_grad(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, int64_t s, Tensor& dx,
                      Tensor& db) override;
  void sum(const Tensor& x, Tensor& out) override;
  void softmax_rows(const Tensor& x, int64_t n, int64_t c, Tensor& y) override;
  void softmax_rows_backward(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, Tensor& dx) override;

  void gemm_fused(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                  const Tensor& b, double beta, Tensor& c, const GemmFusion& f) override;
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
            const Tensor& b, double beta, Tensor& c) override;

  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g, Tensor& y,
                      bool relu = false) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx,
                            bool accumulate = false) override;
  void conv2d_backward_weight(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw, Tensor& db) override;

  void max_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y, Tensor& indices) override;
  void max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& indices,
                           const PoolGeom& g, Tensor& dx) override;
  void avg_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y) override;
  void avg_pool2d_backward(const Tensor& dy, const PoolGeom& g, Tensor& dx) override;

  void batch_norm_forward_train(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                Tensor& running_mean, Tensor& running_var, const BnArgs& a, Tensor& y,
                                Tensor& save_mean, Tensor& save_invstd) override;
  void batch_norm_forward_eval(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, const BnArgs& a,
                               Tensor& y) override;
  void batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const BnArgs& a, Tensor& dx,
                           Tensor& dz, Tensor& dgamma, Tensor& dbeta) override;

  void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) override;
  void softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss, Tensor& dlogits) override;
  void softmax_xent_targets_forward(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& probs) override;
  void softmax_xent_targets_backward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                                     Tensor& dlogits) override;
  void argmax_rows(const Tensor& x, Tensor& out) override;
  void count_correct(const Tensor& logits, const Tensor& labels, Tensor& out, bool accumulate) override;
  void tally_batch(const Tensor& loss, const Tensor& logits, const Tensor& labels, Tensor& loss_sum,
                   Tensor& correct) override;
  void dropout_mask(Tensor& mask, uint64_t seed, uint64_t offset, double p) override;

  void scale_cast(const Tensor& src, Tensor& dst, double scale, double clip) override;
  void sparse_topk(const Tensor& g, int64_t k, Tensor& pairs) override;
  void sparse_threshold(const Tensor& g, double threshold, Tensor& pairs, Tensor& count) override;
  void sparse_accumulate(Tensor& dense, const Tensor& pairs, int64_t n, double scale) override;
  void sparse_zero(Tensor& dense, const Tensor& pairs, int64_t n) override;

  void scale_by(const Tensor& x, const Tensor& factor, Tensor& out) override;
  void restore_if_nonfinite(const Tensor& verdict, const Tensor& saved, Tensor& dst) override;
  void count_nonfinite(const Tensor& verdict, Tensor& counter) override;
  void loss_scale_update(const Tensor& verdict, Tensor& scale, Tensor& counts, double growth, double backoff,
                         int64_t interval) override;
  void copy_chunk(const Tensor& src, Tensor& dst, const Tensor& index, bool into_chunk,
                  const Tensor& verdict) override;
  void advance_counter(Tensor& counter, int64_t modulo, const Tensor& verdict) override;

  void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format fmt, Tensor& q, Tensor& amax) override;
  void fp8_quantize_transposed(const Tensor& x, const Tensor& scale, Fp8Format fmt, int64_t rows, int64_t cols,
                               Tensor& q, Tensor& qt, Tensor& amax) override;
  void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format fmt, Tensor& y) override;
  void fp8_amax(const Tensor& x, Tensor& amax) override;
  void fp8_scale_update(Tensor& history, Tensor& scale, Tensor& scale_inv, float fp8_max, float margin_factor,
                        bool use_history_max, Tensor& verdict) override;
  void fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                const Tensor& b_scale_inv, int64_t m, int64_t n, int64_t k, Tensor& c) override;

  // ---- reductions along axes and indexing
  void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double arg, Tensor& out) override;
  void prod_backward(const Tensor& x, const Tensor& g, int64_t outer, int64_t n, int64_t inner, Tensor& dx) override;
  void index_select(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                    Tensor& out) override;
  void index_add(const Tensor& g, const Tensor& index, int64_t outer, int64_t n, int64_t inner, Tensor& dx) override;
  void gather_elements(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                       Tensor& out) override;
  void scatter_elements(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                        bool accumulate, Tensor& dst) override;
  void copy_into_strided(const Tensor& src, Tensor& dst) override;
  void pad_axis(const Tensor& x, int64_t outer, int64_t n, int64_t inner, int64_t before, int64_t after, bool reflect,
                Tensor& out) override;
  void pad_axis_backward(const Tensor& g, int64_t outer, int64_t n, int64_t inner, int64_t before, int64_t after,
                         bool reflect, Tensor& dx) override;
  void one_hot(const Tensor& index, int64_t outer, int64_t depth, int64_t inner, double off, double on,
               Tensor& out) override;
  Tensor nonzero(const Tensor& x) override;
  void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
                    const Tensor& a, int64_t stride_a, const Tensor& b, int64_t stride_b, double beta, Tensor& c,
                    int64_t stride_c) override;
  /// Throws the out-of-range index an index kernel recorded on the device, if any (after a stream sync).
  void check_index_errors(int device);

  // ---- softmax along an axis, layer / RMS normalisation, losses over N-D logits, attention
  void softmax_forward(const Tensor& x, int64_t outer, int64_t c, int64_t inner, bool log, Tensor& y) override;
  void softmax_backward(const Tensor& dy, const Tensor& y, int64_t outer, int64_t c, int64_t inner, bool log,
                        Tensor& dx) override;
  void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t n, int64_t c, double eps, bool rms,
                          Tensor& y, Tensor& mean, Tensor& rstd) override;
  bool layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                           int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw, Tensor& db,
                           Tensor& dx_sums) override;
  bool layer_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                               const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& acc, Tensor& dw,
                               Tensor& db, Tensor& acc_sums) override;
  void xent_rows_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss, Tensor& lse,
                         Tensor& valid) override;
  void xent_rows_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g,
                          int64_t ignore_index, Tensor& dlogits) override;
  void xent_rows_forward_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                              Tensor& valid, int64_t classes) override;
  void nll_rows_forward(const Tensor& logp, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                        Tensor& valid) override;
  void nll_rows_backward(const Tensor& targets, const Tensor& g, int64_t ignore_index, Tensor& dlogp) override;
  void pointwise_loss_forward(PointLoss op, const Tensor& x, const Tensor& t, Tensor& loss) override;
  void pointwise_loss_backward(PointLoss op, const Tensor& x, const Tensor& t, const Tensor& g, Tensor& dx) override;
  void attention_mask_documents(Tensor& s, int64_t heads, const Tensor& doc_pos) override;
  void attention_softmax(const Tensor& s, int64_t batch, int64_t tq, int64_t tk, double scale, bool causal,
                         Tensor& y) override;
  bool fused_attention_supported(const AttentionGeom& g, DType dtype, int device) override;
  void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeom& g, uint64_t seed,
                               uint64_t offset, Tensor& o, Tensor& stats) override;
  void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& dout,
                                const Tensor& stats, const AttentionGeom& g, uint64_t seed, uint64_t offset, Tensor& dq,
                                Tensor& dk, Tensor& dv) override;

  // ---- fused pointwise ops of Llama-family blocks
  bool rotary_packed(const Tensor& x, const Tensor& cos, const Tensor& sin, const RotaryGeom& g, Tensor& y) override;
  bool swiglu_forward(const Tensor& x, int64_t rows, int64_t hidden, Tensor& y) override;
  bool swiglu_backward(const Tensor& dy, const Tensor& x, int64_t rows, int64_t hidden, Tensor& dx) override;

  // ---- embedding and recurrent networks
  void embedding_forward(const Tensor& weight, const Tensor& indices, Tensor& out) override;
  void embedding_backward(const Tensor& dy, const Tensor& indices, bool deterministic, Tensor& dweight) override;
  bool embedding_backward_add(const Tensor& dy, const Tensor& indices, bool deterministic, Tensor& dweight) override;
  bool rnn_supported(const RnnGeom& g) override;
  void rnn_forward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                   bool training, Tensor& y, Tensor& hy, Tensor& cy, Tensor& reserve) override;
  void rnn_backward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                    const Tensor& y, const Tensor& reserve, const Tensor& dy, const Tensor& dhy, const Tensor& dcy,
                    Tensor& dx, Tensor& dw, Tensor& dhx, Tensor& dcx) override;

  void sgd_step(ParamSlot* slots, int64_t count, const SgdArgs& a) override;
  bool recording(int device) override;
  void adam_step(ParamSlot* slots, int64_t count, const AdamArgs& a) override;
  void rmsprop_step(ParamSlot* slots, int64_t count, const RmsPropArgs& a) override;
  void adagrad_step(ParamSlot* slots, int64_t count, const AdagradArgs& a) override;

  /// The device's state (handles, error record), created on first use; makes the device current.
  DeviceState& state(int device);
  /// The state of the tensor's device, after checking that the tensor lives on a CUDA device.
  DeviceState& state_for(const Tensor& t);

 private:
  /// Throws the label error a kernel recorded on the device, if any (call after a stream sync).
  void check_errors(int device);
  /// A strided pointwise convolution's input gradient (with accumulate: added to dx) and weight gradient
  /// as matrix products (channels-last, 16-bit; see cuda_conv.cpp).
  void strided_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx, bool accumulate);
  void strided_backward_filter(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw);
  /// Adds b[k] to y when b is defined, then max(y, 0) when relu: what follows a convolution that leaves both out.
  void conv_epilogue(const ConvGeom& g, const Tensor& b, bool relu, Tensor& y);
  /// Layer / RMS norm backward; with accumulate, dx is added into what dx holds; dx's column sums into dx_sums
  /// where defined and the rows fit the warp kernel (returns whether they were written).
  bool ln_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw, Tensor& db, Tensor& dx_sums,
                   bool accumulate);
  /// The product through cuBLASLt (cuda_gemm_lt.cpp); false where cuBLASLt does not take the case.
  bool lt_matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                 const Tensor& b, double beta, Tensor& c, const GemmFusion& f);
  /// The FP8 product through cuBLASLt (cuda_gemm_lt.cpp); false where cuBLASLt or the device does not take it.
  bool lt_fp8_matmul(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                     const Tensor& b_scale_inv, int64_t m, int64_t n, int64_t k, Tensor& c);

  int device_count_ = 0;
  std::vector<std::unique_ptr<CachingAllocator>> allocators_;
  std::unique_ptr<PinnedAllocator> pinned_;
  std::vector<std::unique_ptr<DeviceState>> states_;
  std::unique_ptr<InitOnce[]> state_once_;
};

/// Temporary device memory from the caching allocator, returned on scope exit. Returning it while
/// kernels that use it are still queued is safe: every later user runs on the same stream.
class Scratch {
 public:
  Scratch(Allocator& a, size_t nbytes) : alloc_(a), nbytes_(nbytes), ptr_(nbytes ? a.allocate(nbytes) : nullptr) {}
  ~Scratch() { alloc_.deallocate(ptr_, nbytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  Allocator& alloc_;
  size_t nbytes_;
  void* ptr_;
};

/// Whether cuBLASLt's candidate algorithms are timed for each new product shape (TANDEM_GEMM_TUNE, on unless
/// "0"; off under deterministic algorithms); 16-bit products then all go through cuBLASLt.
bool gemm_tuning_enabled();
/// Whether every plan cuDNN's heuristics offer for a fused attention geometry is built and timed, the fastest
/// kept (TANDEM_ATTENTION_TUNE, on unless "0"; off under deterministic algorithms: heuristic A's first choice).
bool attention_tuning_enabled();
// How the gradient through a fused GELU (GemmEpilogue::DGelu) is taken, from TANDEM_DGELU_EPILOGUE: the
// derivative in cuBLASLt's epilogue and the bias gradient by tandem's column reduction (dgelu, the default),
// both in cuBLASLt's epilogue (bgrad), or the product then tandem's elementwise kernel and reduction (none).
enum class DGeluFusion { Derivative, DerivativeAndSums, None };
DGeluFusion dgelu_fusion();

/// The private pool of the recording under way on this thread for `device`, or null.
Allocator* capture_pool(int device);
/// Queues the kernel that adds one to the device's replay count (the first node of a recording).
void launch_count_replay(unsigned long long* replays, cudaStream_t stream);

// Convolution as matrix products (cuda_conv_gemm.cu): NCHW f32, fewer than 2^30 elements per buffer.
/// col[n * stride_n + (c, r, s) * stride_crs + (oh, ow)] = the input under kernel offset (r, s).
void launch_im2col(const float* x, float* col, const ConvGeom& g, int64_t stride_n, int64_t stride_crs,
                   cudaStream_t stream);
/// dx = the column gradients [n][(c, r, s)][(oh, ow)] folded back onto the input, without atomics.
void launch_col2im(const float* dcol, float* dx, const ConvGeom& g, cudaStream_t stream);
/// out[k][n][p] = in[n][k][p].
void launch_nkp_to_knp(const float* in, float* out, int64_t n, int64_t k, int64_t p, cudaStream_t stream);

// Direct kernels for small convolutions (cuda_conv_direct.cu): NCHW f32, stride 1, 3x3 or 5x5 filters.
bool direct_conv_fits(const ConvGeom& g);
/// y = the convolution of x with w, plus bias[k] when bias is not null, then max(y, 0) when relu.
void launch_direct_forward(const float* x, const float* w, const float* bias, bool relu, float* y, const ConvGeom& g,
                           cudaStream_t stream);
/// Workspace launch_direct_wgrad needs for its partial sums (0: none).
size_t direct_wgrad_bytes(const ConvGeom& g, int sm_count);
/// dw = the weight gradient, summed over the batch in a fixed order.
void launch_direct_wgrad(const float* dy, const float* x, float* dw, float* partial, const ConvGeom& g, int sm_count,
                         cudaStream_t stream);

// Strided pointwise convolutions in channels-last storage (cuda_conv_pointwise.cu).
/// rows[(n, oh, ow)][c] = x[n, oh * stride_h, ow * stride_w, c]; c * element size a multiple of 16 bytes.
void launch_gather_strided_nhwc(const void* x, void* rows, DType dtype, const ConvGeom& g, cudaStream_t stream);
/// dx = the rows put back at the positions the stride picks, zeros elsewhere (with accumulate: added to dx).
void launch_scatter_strided_nhwc(const void* rows, void* dx, DType dtype, const ConvGeom& g, bool accumulate,
                                 cudaStream_t stream);

/// Throws unless t is f32 (the one floating type the CUDA kernels take).
void require_f32(const Tensor& t, const char* op);

}  // namespace tandem::backend
