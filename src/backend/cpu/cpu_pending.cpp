// Temporary: kernels not yet written throw. Each moves to its family file when implemented.
#include "backend/cpu/cpu_backend.h"

namespace tandem::backend {

void CpuBackend::binary(Binary op, const Tensor& a, const Tensor& b, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel binary missing"); }
void CpuBackend::unary(Unary op, const Tensor& a, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel unary missing"); }
void CpuBackend::affine(const Tensor& a, double alpha, double beta, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel affine missing"); }
void CpuBackend::axpy(double alpha, const Tensor& x, Tensor& y) { TANDEM_ASSERT(false, "CPU kernel axpy missing"); }
void CpuBackend::unary_backward(Unary op, const Tensor& grad, const Tensor& y, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel unary_backward missing"); }
void CpuBackend::bias_add(const Tensor& x, const Tensor& b, int64_t n, int64_t c, int64_t s, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel bias_add missing"); }
void CpuBackend::bias_grad(const Tensor& g, int64_t n, int64_t c, int64_t s, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel bias_grad missing"); }
void CpuBackend::sum(const Tensor& x, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel sum missing"); }
void CpuBackend::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a, const Tensor& b, double beta, Tensor& c) { TANDEM_ASSERT(false, "CPU kernel gemm missing"); }
void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g, Tensor& y) { TANDEM_ASSERT(false, "CPU kernel conv2d_forward missing"); }
void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx) { TANDEM_ASSERT(false, "CPU kernel conv2d_backward_data missing"); }
void CpuBackend::conv2d_backward_weight(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw, Tensor& db) { TANDEM_ASSERT(false, "CPU kernel conv2d_backward_weight missing"); }
void CpuBackend::max_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y, Tensor& indices) { TANDEM_ASSERT(false, "CPU kernel max_pool2d_forward missing"); }
void CpuBackend::max_pool2d_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& indices, const PoolGeom& g, Tensor& dx) { TANDEM_ASSERT(false, "CPU kernel max_pool2d_backward missing"); }
void CpuBackend::avg_pool2d_forward(const Tensor& x, const PoolGeom& g, Tensor& y) { TANDEM_ASSERT(false, "CPU kernel avg_pool2d_forward missing"); }
void CpuBackend::avg_pool2d_backward(const Tensor& dy, const PoolGeom& g, Tensor& dx) { TANDEM_ASSERT(false, "CPU kernel avg_pool2d_backward missing"); }
void CpuBackend::batch_norm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean, Tensor& running_var, double momentum, double eps, Tensor& y, Tensor& save_mean, Tensor& save_invstd) { TANDEM_ASSERT(false, "CPU kernel batch_norm_forward_train missing"); }
void CpuBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean, const Tensor& running_var, double eps, Tensor& y) { TANDEM_ASSERT(false, "CPU kernel batch_norm_forward_eval missing"); }
void CpuBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) { TANDEM_ASSERT(false, "CPU kernel batch_norm_backward missing"); }
void CpuBackend::softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) { TANDEM_ASSERT(false, "CPU kernel softmax_xent_forward missing"); }
void CpuBackend::softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss, Tensor& dlogits) { TANDEM_ASSERT(false, "CPU kernel softmax_xent_backward missing"); }
void CpuBackend::argmax_rows(const Tensor& x, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel argmax_rows missing"); }
void CpuBackend::count_correct(const Tensor& logits, const Tensor& labels, Tensor& out) { TANDEM_ASSERT(false, "CPU kernel count_correct missing"); }
void CpuBackend::sgd_step(ParamSlot* slots, int64_t count, const SgdArgs& a) { TANDEM_ASSERT(false, "CPU kernel sgd_step missing"); }
void CpuBackend::adam_step(ParamSlot* slots, int64_t count, const AdamArgs& a) { TANDEM_ASSERT(false, "CPU kernel adam_step missing"); }

}  // namespace tandem::backend
