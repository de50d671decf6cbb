#pragma once
// Internal: the CPU backend. Kernels are split by family across the cpu_*.cpp files.
#include "backend/backend.h"

namespace tandem::backend {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  int device_count() override { return 1; }
  Allocator& allocator(int device) override { return *allocator_; }
  void copy_from_host(const void* src, void* dst, size_t nbytes, int device) override;
  void copy_to_host(const void* src, void* dst, size_t nbytes, int device) override;
  void copy_bytes(const void* src, void* dst, size_t nbytes, int device) override;
  void synchronize(int device) override {}

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

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
            const Tensor& b, double beta, Tensor& c) override;
  void gemm_fused(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                  const Tensor& b, double beta, Tensor& c, const GemmFusion& f) override;

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
                               const Tensor& rstd, int64_t n, int64_t c, bool rms, Tensor& acc, Tensor& dw, Tensor& db,
                               Tensor& acc_sums) override;
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

  void sgd_step(ParamSlot* slots, int64_t count, const SgdArgs& a) override;
  void adam_step(ParamSlot* slots, int64_t count, const AdamArgs& a) override;
  void rmsprop_step(ParamSlot* slots, int64_t count, const RmsPropArgs& a) override;
  void adagrad_step(ParamSlot* slots, int64_t count, const AdagradArgs& a) override;

 private:
  bool norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                     int64_t n, int64_t c, bool rms, Tensor& dx, Tensor& dw, Tensor& db, Tensor& dx_sums, bool add);

  std::unique_ptr<Allocator> allocator_;
};

}  // namespace tandem::backend
