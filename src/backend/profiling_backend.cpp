// The timing wrapper backend_for hands out while a device is profiled: each kernel call is timed alone,
// by name (host wall time; on a GPU the device is waited for before and after the kernel, so that
// the time is the kernel's own), and passed on to the device's backend. Nothing is timed while the
// device's work is being recorded (a recording runs no kernel) or inside another timed call.
#include "backend/profiling_backend.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "tandem/profiler.h"

namespace tandem::backend {

namespace {

using profiler::Phase;

thread_local int t_depth = 0;  // timed calls open on this thread

// ---- reductions along axes and indexing
const char* reduce_name(Backend::ReduceOp op) {
  switch (op) {
    case Backend::ReduceOp::Sum:
      return "reduce_sum";
    case Backend::ReduceOp::Max:
      return "reduce_max";
    case Backend::ReduceOp::Min:
      return "reduce_min";
    case Backend::ReduceOp::Prod:
      return "reduce_prod";
    case Backend::ReduceOp::ArgMax:
      return "argmax";
    case Backend::ReduceOp::ArgMin:
      return "argmin";
    case Backend::ReduceOp::Var:
      return "reduce_var";
    case Backend::ReduceOp::LogSumExp:
      return "logsumexp";
  }
  return "reduce";
}

// Times the call it encloses, when the device is timed now.
class Timed {
 public:
  Timed(Backend& inner, const std::atomic<int>& recordings, Device d, const char* name, Phase phase)
      : inner_(inner), device_(d), name_(name), phase_(phase) {
    const bool outermost = t_depth++ == 0;
    // While any thread records the device's work, waiting for the device would break the recording.
    if (!outermost || recordings.load() > 0 || inner.recording(d.index) || !profiler::detail::timing(d, phase))
      return;
    if (d.is_cuda()) inner.synchronize(d.index);  // earlier work is not this kernel's
    active_ = true;
    exceptions_ = std::uncaught_exceptions();
    start_ = std::chrono::steady_clock::now();
  }
  ~Timed() {
    --t_depth;
    if (!active_ || std::uncaught_exceptions() > exceptions_) return;  // a failed call is not timed
    try {
      if (device_.is_cuda()) inner_.synchronize(device_.index);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      profiler::detail::add(device_, name_, phase_, s);
    } catch (...) {
      // the device's failure reaches the caller at its next synchronisation
    }
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  Backend& inner_;
  Device device_;
  const char* name_;
  Phase phase_;
  bool active_ = false;
  int exceptions_ = 0;
  std::chrono::steady_clock::time_point start_;
};

class ProfilingBackend final : public Backend {
 public:
  ProfilingBackend(Backend& inner, Device d) : inner_(inner), device_(d) {}

  int device_count() override { return inner_.device_count(); }
  Allocator& allocator(int device) override { return inner_.allocator(device); }
  Allocator* pinned_allocator() override { return inner_.pinned_allocator(); }
  void copy_from_host(const void* src, void* dst, size_t nbytes, int device) override {
    Timed timed(inner_, recordings_, device_, "copy_from_host", profiler::detail::thread_phase());
    inner_.copy_from_host(src, dst, nbytes, device);
  }
  void copy_to_host(const void* src, void* dst, size_t nbytes, int device) override {
    Timed timed(inner_, recordings_, device_, "copy_to_host", profiler::detail::thread_phase());
    inner_.copy_to_host(src, dst, nbytes, device);
  }
  void copy_bytes(const void* src, void* dst, size_t nbytes, int device) override {
    Timed timed(inner_, recordings_, device_, "copy_bytes", profiler::detail::thread_phase());
    inner_.copy_bytes(src, dst, nbytes, device);
  }
  void synchronize(int device) override { return inner_.synchronize(device); }
  void profile_range(bool on) override { return inner_.profile_range(on); }
  std::unique_ptr<CapturedWork> capture(int device, const std::function<void()>& body) override {
    ++recordings_;
    struct Done {
      std::atomic<int>& n;
      ~Done() { --n; }
    } done{recordings_};
    return inner_.capture(device, body);
  }
  size_t captured_pool_bytes(int device) override { return inner_.captured_pool_bytes(device); }
  size_t captured_pool_peak_bytes(int device) override { return inner_.captured_pool_peak_bytes(device); }
  bool recording(int device) override { return inner_.recording(device); }
  void copy_strided(const Tensor& src, Tensor& dst) override {
    Timed timed(inner_, recordings_, device_, "copy_strided", profiler::detail::thread_phase());
    inner_.copy_strided(src, dst);
  }
  void fill(Tensor& t, double value) override {
    Timed timed(inner_, recordings_, device_, "fill", profiler::detail::thread_phase());
    inner_.fill(t, value);
  }
  void gather_samples(const Tensor& images, const Tensor& labels, const Tensor& order, Tensor& cursor, float divisor,
                      Tensor& x, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "gather_samples", profiler::detail::thread_phase());
    inner_.gather_samples(images, labels, order, cursor, divisor, x, y);
  }
  using Backend::token_windows;
  void token_windows(const Tensor& tokens, const Tensor& mask, Tensor& cursor, uint64_t seed, bool random,
                     int64_t frame, Tensor& x, Tensor& y, Tensor& pos) override {
    Timed timed(inner_, recordings_, device_, "token_windows", profiler::detail::thread_phase());
    inner_.token_windows(tokens, mask, cursor, seed, random, frame, x, y, pos);
  }
  void random_uniform(Tensor& t, uint64_t seed, uint64_t offset, double lo, double hi) override {
    Timed timed(inner_, recordings_, device_, "random_uniform", profiler::detail::thread_phase());
    inner_.random_uniform(t, seed, offset, lo, hi);
  }
  void random_normal(Tensor& t, uint64_t seed, uint64_t offset, double mean, double std) override {
    Timed timed(inner_, recordings_, device_, "random_normal", profiler::detail::thread_phase());
    inner_.random_normal(t, seed, offset, mean, std);
  }
  void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, op_name(op), profiler::detail::thread_phase());
    inner_.binary(op, a, b, out);
  }
  void unary(Unary op, const Tensor& a, Tensor& out, const EwArgs& args) override {
    Timed timed(inner_, recordings_, device_, op_name(op), profiler::detail::thread_phase());
    inner_.unary(op, a, out, args);
  }
  void ternary(Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, op_name(op), profiler::detail::thread_phase());
    inner_.ternary(op, a, b, c, out);
  }
  void affine(const Tensor& a, double alpha, double beta, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "affine", profiler::detail::thread_phase());
    inner_.affine(a, alpha, beta, out);
  }
  void axpy(double alpha, const Tensor& x, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "axpy", profiler::detail::thread_phase());
    inner_.axpy(alpha, x, y);
  }
  void unary_backward(Unary op, const Tensor& grad, const Tensor& saved, Tensor& out, const EwArgs& args) override {
    Timed timed(inner_, recordings_, device_, backward_name(op), profiler::detail::thread_phase());
    inner_.unary_backward(op, grad, saved, out, args);
  }
  void bias_add(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "bias_add", profiler::detail::thread_phase());
    inner_.bias_add(x, b, n, c, s, out);
  }
  void bias_grad(const Tensor& g, int64_t n, int64_t c, int64_t s, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "bias_grad", profiler::detail::thread_phase());
    inner_.bias_grad(g, n, c, s, out);
  }
  void bias_relu(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "bias_relu", profiler::detail::thread_phase());
    inner_.bias_relu(x, b, n, c, s, out);
  }
  void relu_bias_grad(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, int64_t s, Tensor& dx,
                      Tensor& db) override {
    Timed timed(inner_, recordings_, device_, "relu_bias_grad", profiler::detail::thread_phase());
    inner_.relu_bias_grad(dy, y, n, c, s, dx, db);
  }
  void sum(const Tensor& x, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "sum", profiler::detail::thread_phase());
    inner_.sum(x, out);
  }
  void softmax_rows(const Tensor& x, int64_t n, int64_t c, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "softmax_rows", profiler::detail::thread_phase());
    inner_.softmax_rows(x, n, c, y);
  }
  void softmax_rows_backward(const Tensor& dy, const Tensor& y, int64_t n, int64_t c, Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "softmax_rows_backward", profiler::detail::thread_phase());
    inner_.softmax_rows_backward(dy, y, n, c, dx);
  }
  // ---- softmax along an axis, layer / RMS normalisation, losses over N-D logits, attention
  void softmax_forward(const Tensor& x, int64_t outer, int64_t c, int64_t inner, bool log, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, log ? "log_softmax" : "softmax", profiler::detail::thread_phase());
    inner_.softmax_forward(x, outer, c, inner, log, y);
  }
  void softmax_backward(const Tensor& dy, const Tensor& y, int64_t outer, int64_t c, int64_t inner, bool log,
                        Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, log ? "log_softmax_backward" : "softmax_backward",
                profiler::detail::thread_phase());
    inner_.softmax_backward(dy, y, outer, c, inner, log, dx);
  }
  void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t n, int64_t c, double eps, bool rms,
                          Tensor& y, Tensor& mean, Tensor& rstd) override {
    Timed timed(inner_, recordings_, device_, rms ? "rms_norm" : "layer_norm", profiler::detail::thread_phase());
    inner_.layer_norm_forward(x, w, b, n, c, eps, rms, y, mean, rstd);
  }
  bool layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                           int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw, Tensor& db,
                           Tensor& dx_sums) override {
    Timed timed(inner_, recordings_, device_, rms ? "rms_norm_backward" : "layer_norm_backward",
                profiler::detail::thread_phase());
    return inner_.layer_norm_backward(dy, x, w, mean, rstd, n, c, rms, dx, dw, db, dx_sums);
  }
  bool layer_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                               const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& acc, Tensor& dw,
                               Tensor& db, Tensor& acc_sums) override {
    Timed timed(inner_, recordings_, device_, rms ? "rms_norm_backward" : "layer_norm_backward",
                profiler::detail::thread_phase());
    return inner_.layer_norm_backward_add(dy, x, w, mean, rstd, n, c, rms, acc, dw, db, acc_sums);
  }
  void xent_rows_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss, Tensor& lse,
                         Tensor& valid) override {
    Timed timed(inner_, recordings_, device_, "xent_rows_forward", profiler::detail::thread_phase());
    inner_.xent_rows_forward(logits, targets, ignore_index, loss, lse, valid);
  }
  void xent_rows_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g,
                          int64_t ignore_index, Tensor& dlogits) override {
    Timed timed(inner_, recordings_, device_, "xent_rows_backward", profiler::detail::thread_phase());
    inner_.xent_rows_backward(logits, targets, lse, g, ignore_index, dlogits);
  }
  void xent_rows_forward_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                              Tensor& valid, int64_t classes) override {
    Timed timed(inner_, recordings_, device_, "xent_rows_forward_grad", profiler::detail::thread_phase());
    inner_.xent_rows_forward_grad(logits, targets, ignore_index, loss, valid, classes);
  }
  void nll_rows_forward(const Tensor& logp, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                        Tensor& valid) override {
    Timed timed(inner_, recordings_, device_, "nll_rows_forward", profiler::detail::thread_phase());
    inner_.nll_rows_forward(logp, targets, ignore_index, loss, valid);
  }
  void nll_rows_backward(const Tensor& targets, const Tensor& g, int64_t ignore_index, Tensor& dlogp) override {
    Timed timed(inner_, recordings_, device_, "nll_rows_backward", profiler::detail::thread_phase());
    inner_.nll_rows_backward(targets, g, ignore_index, dlogp);
  }
  void pointwise_loss_forward(PointLoss op, const Tensor& x, const Tensor& t, Tensor& loss) override {
    Timed timed(inner_, recordings_, device_, "pointwise_loss_forward", profiler::detail::thread_phase());
    inner_.pointwise_loss_forward(op, x, t, loss);
  }
  void pointwise_loss_backward(PointLoss op, const Tensor& x, const Tensor& t, const Tensor& g, Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "pointwise_loss_backward", profiler::detail::thread_phase());
    inner_.pointwise_loss_backward(op, x, t, g, dx);
  }
  void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
                    const Tensor& a, int64_t stride_a, const Tensor& b, int64_t stride_b, double beta, Tensor& c,
                    int64_t stride_c) override {
    Timed timed(inner_, recordings_, device_, "gemm_batched", profiler::detail::thread_phase());
    inner_.gemm_batched(trans_a, trans_b, batch, m, n, k, alpha, a, stride_a, b, stride_b, beta, c, stride_c);
  }
  void attention_mask_documents(Tensor& s, int64_t heads, const Tensor& doc_pos) override {
    Timed timed(inner_, recordings_, device_, "attention_mask_documents", profiler::detail::thread_phase());
    inner_.attention_mask_documents(s, heads, doc_pos);
  }
  void attention_softmax(const Tensor& s, int64_t batch, int64_t tq, int64_t tk, double scale, bool causal,
                         Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "attention_softmax", profiler::detail::thread_phase());
    inner_.attention_softmax(s, batch, tq, tk, scale, causal, y);
  }
  bool fused_attention_supported(const AttentionGeom& g, DType dtype, int device) override {
    return inner_.fused_attention_supported(g, dtype, device);
  }
  void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionGeom& g, uint64_t seed,
                               uint64_t offset, Tensor& o, Tensor& stats) override {
    Timed timed(inner_, recordings_, device_, "fused_attention_forward", profiler::detail::thread_phase());
    inner_.fused_attention_forward(q, k, v, g, seed, offset, o, stats);
  }
  void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& dout,
                                const Tensor& stats, const AttentionGeom& g, uint64_t seed, uint64_t offset, Tensor& dq,
                                Tensor& dk, Tensor& dv) override {
    Timed timed(inner_, recordings_, device_, "fused_attention_backward", profiler::detail::thread_phase());
    inner_.fused_attention_backward(q, k, v, o, dout, stats, g, seed, offset, dq, dk, dv);
  }
  bool rotary_packed(const Tensor& x, const Tensor& cos, const Tensor& sin, const RotaryGeom& g, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, g.transpose ? "rotary_packed_backward" : "rotary_packed",
                profiler::detail::thread_phase());
    return inner_.rotary_packed(x, cos, sin, g, y);
  }
  bool swiglu_forward(const Tensor& x, int64_t rows, int64_t hidden, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "swiglu", profiler::detail::thread_phase());
    return inner_.swiglu_forward(x, rows, hidden, y);
  }
  bool swiglu_backward(const Tensor& dy, const Tensor& x, int64_t rows, int64_t hidden, Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "swiglu_backward", profiler::detail::thread_phase());
    return inner_.swiglu_backward(dy, x, rows, hidden, dx);
  }
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a, const Tensor& b,
            double beta, Tensor& c) override {
    Timed timed(inner_, recordings_, device_, "gemm", profiler::detail::thread_phase());
    inner_.gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g, Tensor& y,
                      bool relu) override {
    Timed timed(inner_, recordings_, device_, "conv2d_forward", profiler::detail::thread_phase());
    inner_.conv2d_forward(x, w, b, g, y, relu);
  }
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx,
                            bool accumulate) override {
    Timed timed(inner_, recordings_, device_, "conv2d_backward_data", profiler::detail::thread_phase());
    inner_.conv2d_backward_data(dy, w, g, dx, accumulate);
  }
  void conv2d_backward_weight(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw, Tensor& db) override {
    Timed timed(inner_, recordings_, device_, "conv2d_backward_weight", profiler::detail::thread_phase());
    inner_.conv2d_backward_weight(dy, x, g, dw, db);
  }
  void max_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y, Tensor& indices) override {
    Timed timed(inner_, recordings_, device_, "max_pool2d_forward", profiler::detail::thread_phase());
    inner_.max_pool2d_forward(x, g, y, indices);
  }
  void max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& indices, const PoolGeom& g,
                           Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "max_pool2d_backward", profiler::detail::thread_phase());
    inner_.max_pool2d_backward(dy, x, y, indices, g, dx);
  }
  void avg_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "avg_pool2d_forward", profiler::detail::thread_phase());
    inner_.avg_pool2d_forward(x, g, y);
  }
  void avg_pool2d_backward(const Tensor& dy, const PoolGeom& g, Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "avg_pool2d_backward", profiler::detail::thread_phase());
    inner_.avg_pool2d_backward(dy, g, dx);
  }
  void batch_norm_forward_train(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                                Tensor& running_mean, Tensor& running_var, const BnArgs& a, Tensor& y,
                                Tensor& save_mean, Tensor& save_invstd) override {
    Timed timed(inner_, recordings_, device_, "batch_norm_forward_train", profiler::detail::thread_phase());
    inner_.batch_norm_forward_train(x, z, gamma, beta, running_mean, running_var, a, y, save_mean, save_invstd);
  }
  void batch_norm_forward_eval(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, const BnArgs& a,
                               Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "batch_norm_forward_eval", profiler::detail::thread_phase());
    inner_.batch_norm_forward_eval(x, z, gamma, beta, running_mean, running_var, a, y);
  }
  void batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const BnArgs& a, Tensor& dx, Tensor& dz,
                           Tensor& dgamma, Tensor& dbeta) override {
    Timed timed(inner_, recordings_, device_, "batch_norm_backward", profiler::detail::thread_phase());
    inner_.batch_norm_backward(dy, x, y, gamma, save_mean, save_invstd, a, dx, dz, dgamma, dbeta);
  }
  void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) override {
    Timed timed(inner_, recordings_, device_, "softmax_xent_forward", profiler::detail::thread_phase());
    inner_.softmax_xent_forward(logits, labels, loss, probs);
  }
  void softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss, Tensor& dlogits) override {
    Timed timed(inner_, recordings_, device_, "softmax_xent_backward", profiler::detail::thread_phase());
    inner_.softmax_xent_backward(probs, labels, dloss, dlogits);
  }
  void softmax_xent_targets_forward(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& probs) override {
    Timed timed(inner_, recordings_, device_, "softmax_xent_targets_forward", profiler::detail::thread_phase());
    inner_.softmax_xent_targets_forward(logits, targets, loss, probs);
  }
  void softmax_xent_targets_backward(const Tensor& probs, const Tensor& targets, const Tensor& dloss,
                                     Tensor& dlogits) override {
    Timed timed(inner_, recordings_, device_, "softmax_xent_targets_backward", profiler::detail::thread_phase());
    inner_.softmax_xent_targets_backward(probs, targets, dloss, dlogits);
  }
  void argmax_rows(const Tensor& x, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "argmax_rows", profiler::detail::thread_phase());
    inner_.argmax_rows(x, out);
  }
  void count_correct(const Tensor& logits, const Tensor& labels, Tensor& out, bool accumulate) override {
    Timed timed(inner_, recordings_, device_, "count_correct", profiler::detail::thread_phase());
    inner_.count_correct(logits, labels, out, accumulate);
  }
  void tally_batch(const Tensor& loss, const Tensor& logits, const Tensor& labels, Tensor& loss_sum,
                   Tensor& correct) override {
    Timed timed(inner_, recordings_, device_, "tally_batch", profiler::detail::thread_phase());
    inner_.tally_batch(loss, logits, labels, loss_sum, correct);
  }
  void dropout_mask(Tensor& mask, uint64_t seed, uint64_t offset, double p) override {
    Timed timed(inner_, recordings_, device_, "dropout_mask", profiler::detail::thread_phase());
    inner_.dropout_mask(mask, seed, offset, p);
  }
  void scale_cast(const Tensor& src, Tensor& dst, double scale, double clip) override {
    Timed timed(inner_, recordings_, device_, "scale_cast", Phase::Distributed);
    inner_.scale_cast(src, dst, scale, clip);
  }
  void sparse_topk(const Tensor& g, int64_t k, Tensor& pairs) override {
    Timed timed(inner_, recordings_, device_, "sparse_topk", Phase::Distributed);
    inner_.sparse_topk(g, k, pairs);
  }
  void sparse_threshold(const Tensor& g, double threshold, Tensor& pairs, Tensor& count) override {
    Timed timed(inner_, recordings_, device_, "sparse_threshold", Phase::Distributed);
    inner_.sparse_threshold(g, threshold, pairs, count);
  }
  void sparse_accumulate(Tensor& dense, const Tensor& pairs, int64_t n, double scale) override {
    Timed timed(inner_, recordings_, device_, "sparse_accumulate", Phase::Distributed);
    inner_.sparse_accumulate(dense, pairs, n, scale);
  }
  void sparse_zero(Tensor& dense, const Tensor& pairs, int64_t n) override {
    Timed timed(inner_, recordings_, device_, "sparse_zero", Phase::Distributed);
    inner_.sparse_zero(dense, pairs, n);
  }
  void scale_by(const Tensor& x, const Tensor& factor, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "scale_by", Phase::Distributed);
    inner_.scale_by(x, factor, out);
  }
  void restore_if_nonfinite(const Tensor& verdict, const Tensor& saved, Tensor& dst) override {
    Timed timed(inner_, recordings_, device_, "restore_if_nonfinite", Phase::Distributed);
    inner_.restore_if_nonfinite(verdict, saved, dst);
  }
  void count_nonfinite(const Tensor& verdict, Tensor& counter) override {
    Timed timed(inner_, recordings_, device_, "count_nonfinite", Phase::Distributed);
    inner_.count_nonfinite(verdict, counter);
  }
  void loss_scale_update(const Tensor& verdict, Tensor& scale, Tensor& counts, double growth, double backoff,
                         int64_t interval) override {
    Timed timed(inner_, recordings_, device_, "loss_scale_update", Phase::Distributed);
    inner_.loss_scale_update(verdict, scale, counts, growth, backoff, interval);
  }
  void copy_chunk(const Tensor& src, Tensor& dst, const Tensor& index, bool into_chunk,
                  const Tensor& verdict) override {
    Timed timed(inner_, recordings_, device_, "copy_chunk", Phase::Distributed);
    inner_.copy_chunk(src, dst, index, into_chunk, verdict);
  }
  void advance_counter(Tensor& counter, int64_t modulo, const Tensor& verdict) override {
    Timed timed(inner_, recordings_, device_, "advance_counter", Phase::Distributed);
    inner_.advance_counter(counter, modulo, verdict);
  }
  void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format fmt, Tensor& q, Tensor& amax) override {
    Timed timed(inner_, recordings_, device_, "fp8_quantize", profiler::detail::thread_phase());
    inner_.fp8_quantize(x, scale, fmt, q, amax);
  }
  void fp8_quantize_transposed(const Tensor& x, const Tensor& scale, Fp8Format fmt, int64_t rows, int64_t cols,
                               Tensor& q, Tensor& qt, Tensor& amax) override {
    Timed timed(inner_, recordings_, device_, "fp8_quantize_transposed", profiler::detail::thread_phase());
    inner_.fp8_quantize_transposed(x, scale, fmt, rows, cols, q, qt, amax);
  }
  void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format fmt, Tensor& y) override {
    Timed timed(inner_, recordings_, device_, "fp8_dequantize", profiler::detail::thread_phase());
    inner_.fp8_dequantize(q, scale_inv, fmt, y);
  }
  void fp8_amax(const Tensor& x, Tensor& amax) override {
    Timed timed(inner_, recordings_, device_, "fp8_amax", profiler::detail::thread_phase());
    inner_.fp8_amax(x, amax);
  }
  void fp8_scale_update(Tensor& history, Tensor& scale, Tensor& scale_inv, float fp8_max, float margin_factor,
                        bool use_history_max, Tensor& verdict) override {
    Timed timed(inner_, recordings_, device_, "fp8_scale_update", profiler::detail::thread_phase());
    inner_.fp8_scale_update(history, scale, scale_inv, fp8_max, margin_factor, use_history_max, verdict);
  }
  void fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                const Tensor& b_scale_inv, int64_t m, int64_t n, int64_t k, Tensor& c) override {
    Timed timed(inner_, recordings_, device_, "fp8_gemm", profiler::detail::thread_phase());
    inner_.fp8_gemm(a, fa, a_scale_inv, b, fb, b_scale_inv, m, n, k, c);
  }
  // ---- reductions along axes and indexing
  void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double arg, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, reduce_name(op), profiler::detail::thread_phase());
    inner_.reduce(op, x, outer, n, inner, arg, out);
  }
  void prod_backward(const Tensor& x, const Tensor& g, int64_t outer, int64_t n, int64_t inner, Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "prod_backward", profiler::detail::thread_phase());
    inner_.prod_backward(x, g, outer, n, inner, dx);
  }
  void index_select(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                    Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "index_select", profiler::detail::thread_phase());
    inner_.index_select(x, index, outer, n, inner, out);
  }
  void index_add(const Tensor& g, const Tensor& index, int64_t outer, int64_t n, int64_t inner, Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "index_add", profiler::detail::thread_phase());
    inner_.index_add(g, index, outer, n, inner, dx);
  }
  void gather_elements(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                       Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "gather_elements", profiler::detail::thread_phase());
    inner_.gather_elements(x, index, outer, n, inner, out);
  }
  void scatter_elements(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                        bool accumulate, Tensor& dst) override {
    Timed timed(inner_, recordings_, device_, "scatter_elements", profiler::detail::thread_phase());
    inner_.scatter_elements(src, index, outer, n, inner, accumulate, dst);
  }
  void copy_into_strided(const Tensor& src, Tensor& dst) override {
    Timed timed(inner_, recordings_, device_, "copy_into_strided", profiler::detail::thread_phase());
    inner_.copy_into_strided(src, dst);
  }
  void pad_axis(const Tensor& x, int64_t outer, int64_t n, int64_t inner, int64_t before, int64_t after, bool reflect,
                Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "pad", profiler::detail::thread_phase());
    inner_.pad_axis(x, outer, n, inner, before, after, reflect, out);
  }
  void pad_axis_backward(const Tensor& g, int64_t outer, int64_t n, int64_t inner, int64_t before, int64_t after,
                         bool reflect, Tensor& dx) override {
    Timed timed(inner_, recordings_, device_, "pad_backward", profiler::detail::thread_phase());
    inner_.pad_axis_backward(g, outer, n, inner, before, after, reflect, dx);
  }
  void one_hot(const Tensor& index, int64_t outer, int64_t depth, int64_t inner, double off, double on,
               Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "one_hot", profiler::detail::thread_phase());
    inner_.one_hot(index, outer, depth, inner, off, on, out);
  }
  Tensor nonzero(const Tensor& x) override {
    Timed timed(inner_, recordings_, device_, "nonzero", profiler::detail::thread_phase());
    return inner_.nonzero(x);
  }
  void sgd_step(ParamSlot* slots, int64_t count, const SgdArgs& a) override {
    Timed timed(inner_, recordings_, device_, "sgd_step", Phase::Update);
    inner_.sgd_step(slots, count, a);
  }
  void adam_step(ParamSlot* slots, int64_t count, const AdamArgs& a) override {
    Timed timed(inner_, recordings_, device_, "adam_step", Phase::Update);
    inner_.adam_step(slots, count, a);
  }
  void rmsprop_step(ParamSlot* slots, int64_t count, const RmsPropArgs& a) override {
    Timed timed(inner_, recordings_, device_, "rmsprop_step", Phase::Update);
    inner_.rmsprop_step(slots, count, a);
  }
  void adagrad_step(ParamSlot* slots, int64_t count, const AdagradArgs& a) override {
    Timed timed(inner_, recordings_, device_, "adagrad_step", Phase::Update);
    inner_.adagrad_step(slots, count, a);
  }
  void embedding_forward(const Tensor& weight, const Tensor& indices, Tensor& out) override {
    Timed timed(inner_, recordings_, device_, "embedding_forward", profiler::detail::thread_phase());
    inner_.embedding_forward(weight, indices, out);
  }
  void embedding_backward(const Tensor& dy, const Tensor& indices, bool deterministic, Tensor& dweight) override {
    Timed timed(inner_, recordings_, device_, "embedding_backward", profiler::detail::thread_phase());
    inner_.embedding_backward(dy, indices, deterministic, dweight);
  }
  bool embedding_backward_add(const Tensor& dy, const Tensor& indices, bool deterministic, Tensor& dweight) override {
    Timed timed(inner_, recordings_, device_, "embedding_backward", profiler::detail::thread_phase());
    return inner_.embedding_backward_add(dy, indices, deterministic, dweight);
  }
  bool rnn_supported(const RnnGeom& g) override { return inner_.rnn_supported(g); }
  void rnn_forward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                   bool training, Tensor& y, Tensor& hy, Tensor& cy, Tensor& reserve) override {
    Timed timed(inner_, recordings_, device_, "rnn_forward", profiler::detail::thread_phase());
    inner_.rnn_forward(g, x, w, hx, cx, training, y, hy, cy, reserve);
  }
  void rnn_backward(const RnnGeom& g, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                    const Tensor& y, const Tensor& reserve, const Tensor& dy, const Tensor& dhy, const Tensor& dcy,
                    Tensor& dx, Tensor& dw, Tensor& dhx, Tensor& dcx) override {
    Timed timed(inner_, recordings_, device_, "rnn_backward", profiler::detail::thread_phase());
    inner_.rnn_backward(g, x, w, hx, cx, y, reserve, dy, dhy, dcy, dx, dw, dhx, dcx);
  }

 private:
  Backend& inner_;
  Device device_;
  std::atomic<int> recordings_{0};  // captures under way on the device, from any thread
};

}  // namespace

Backend& profiling_backend(Backend& inner, Device d) {
  if (!profiler::detail::enabled(d)) return inner;
  static std::mutex mu;
  static auto* wrappers = new std::map<std::pair<int, int>, std::unique_ptr<ProfilingBackend>>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  auto& w = (*wrappers)[{static_cast<int>(d.type), d.is_cpu() ? 0 : d.index}];
  if (!w) w = std::make_unique<ProfilingBackend>(inner, d);
  return *w;
}

}  // namespace tandem::backend
