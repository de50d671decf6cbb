// Batch normalisation and dropout.
#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor batch_norm2d(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                    Tensor& running_var, bool training, double momentum, double eps) {
  return batch_norm2d_act(x, Tensor(), gamma, beta, running_mean, running_var, training, false, momentum, eps);
}

namespace {
// The backward of evaluation mode, an affine map per channel: y = (x - mean) * invstd * gamma + beta with
// the running statistics, so dx = g * gamma * invstd, dgamma = sum g * xhat, dbeta = sum g. Rarely used
// (fine-tuning with frozen statistics), so it works in the parameters' type on contiguous copies.
std::vector<Tensor> eval_backward(const Tensor& g_in, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& var, double eps, bool need_x, bool need_g, bool need_b) {
  const DType pt = gamma.dtype();
  Tensor dy = g_in.contiguous().to(pt);
  const int64_t n = dy.size(0), c = dy.size(1), s = n * c != 0 ? dy.numel() / (n * c) : 0;
  auto per_channel = [&](const Tensor& v) {  // v [c] broadcast to dy's shape
    Tensor out = Tensor::zeros(dy.shape(), pt, dy.device());
    be(dy).bias_add(out, v, n, c, s, out);
    return out;
  };
  Tensor invstd = unary_raw(backend::Unary::Sqrt, affine_raw(var, 1.0, eps));
  invstd = binary_raw(backend::Binary::Div, Tensor::ones({c}, pt, dy.device()), invstd);
  Tensor dx, dgamma, dbeta;
  if (need_x) {
    dx = binary_raw(backend::Binary::Mul, dy, per_channel(binary_raw(backend::Binary::Mul, gamma, invstd)));
    dx = dx.to(x.dtype());
  }
  if (need_g) {
    Tensor xhat = empty_like(dy);
    be(dy).bias_add(x.contiguous().to(pt), affine_raw(mean, -1.0, 0.0), n, c, s, xhat);
    xhat = binary_raw(backend::Binary::Mul, xhat, per_channel(invstd));
    dgamma = Tensor::empty({c}, pt, dy.device());
    be(dy).bias_grad(binary_raw(backend::Binary::Mul, dy, xhat), n, c, s, dgamma);
  }
  if (need_b) {
    dbeta = Tensor::empty({c}, pt, dy.device());
    be(dy).bias_grad(dy, n, c, s, dbeta);
  }
  return {dx, dgamma, dbeta};
}
}  // namespace

Tensor batch_norm2d_act(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                        Tensor& running_mean, Tensor& running_var, bool training, bool relu, double momentum,
                        double eps) {
  check_dim(x, 4, "batch_norm2d", "input");
  check_floating(x, "batch_norm2d", "input");
  int64_t c = x.size(1);
  // Parameters share the input's type, except that 16-bit CUDA activations take f32 parameters.
  const bool mixed = x.device().is_cuda() && (x.dtype() == DType::f16 || x.dtype() == DType::bf16);
  const DType pt = mixed ? DType::f32 : x.dtype();
  for (const Tensor* t : std::initializer_list<const Tensor*>{&gamma, &beta, &running_mean, &running_var}) {
    check_dim(*t, 1, "batch_norm2d", "parameter");
    TANDEM_CHECK(t->size(0) == c && t->dtype() == pt && t->device() == x.device(), "batch_norm2d: ", t->str(),
                 " does not match the ", c, " channels of ", x.str(), mixed ? " (16-bit inputs take f32 parameters)" : "");
    TANDEM_CHECK(t->is_contiguous(), "batch_norm2d: parameters must be contiguous");
  }
  TANDEM_CHECK(eps > 0, "batch_norm2d: eps must be positive");
  if (residual.defined()) {
    TANDEM_CHECK(residual.shape() == x.shape() && residual.device() == x.device(), "batch_norm2d: residual ",
                 residual.str(), " does not match the input ", x.str());
    check_floating(residual, "batch_norm2d", "residual");
  }
  backend::BnArgs args;
  args.momentum = momentum;
  args.eps = eps;
  args.relu = relu;
  args.nhwc = x.device().is_cuda() && strictly_channels_last(x);
  Tensor xc = to_dense(x, x.dtype(), args.nhwc);
  Tensor zc = residual.defined() ? to_dense(residual, x.dtype(), args.nhwc) : Tensor();
  Tensor y = empty_dense_like(xc);
  const bool need_z = residual.defined() && residual.requires_grad();
  if (!training) {
    be(x).batch_norm_forward_eval(xc, zc, gamma, beta, running_mean, running_var, args, y);
    const bool need_x = x.requires_grad(), need_g = gamma.requires_grad(), need_b = beta.requires_grad();
    Tensor sx = need_g ? xc.detach() : Tensor(), sy = relu ? y.detach() : Tensor();
    Tensor sg = gamma.detach(), sm = running_mean.detach(), sv = running_var.detach();
    const DType zt = residual.defined() ? residual.dtype() : x.dtype();
    return record_op(y, {x, residual, gamma, beta}, "batch_norm2d_eval",
                     [sx, sy, sg, sm, sv, eps, need_x, need_g, need_b, need_z, zt](const Tensor& grad) {
      Tensor g = grad;
      if (sy.defined()) {  // below the fused ReLU: the gradient where the output was positive
        Tensor gl = to_dense(grad, sy.dtype(), strictly_channels_last(sy));
        g = empty_dense_like(gl);
        be(gl).unary_backward(backend::Unary::Relu, gl, sy, g);
      }
      std::vector<Tensor> d = eval_backward(g, sx.defined() ? sx : g, sg, sm, sv, eps, need_x, need_g, need_b);
      return std::vector<Tensor>{d[0], need_z ? g.to(zt) : Tensor(), d[1], d[2]};
    });
  }
  TANDEM_CHECK(c == 0 || x.numel() / c > 1, "batch_norm2d: training needs more than one value per channel, got ", x.str());
  Tensor save_mean = Tensor::empty({c}, pt, x.device());
  Tensor save_invstd = Tensor::empty({c}, pt, x.device());
  be(x).batch_norm_forward_train(xc, zc, gamma, beta, running_mean, running_var, args, y, save_mean, save_invstd);
  Tensor sx = xc.detach(), sg = gamma.detach(), sy = relu ? y.detach() : Tensor();
  const DType zt = residual.defined() ? residual.dtype() : x.dtype();
  return record_op(y, {x, residual, gamma, beta}, "batch_norm2d",
                   [sx, sg, sy, save_mean, save_invstd, args, need_z, zt](const Tensor& grad) {
    Tensor dy = to_dense(grad, sx.dtype(), args.nhwc);
    Tensor dx = empty_dense_like(dy), dz = need_z ? empty_dense_like(dy) : Tensor();
    Tensor dgamma = grad_buffer(2, sg.shape(), sg.dtype(), sg.device()),
           dbeta = grad_buffer(3, sg.shape(), sg.dtype(), sg.device());
    be(dy).batch_norm_backward(dy, sx, sy, sg, save_mean, save_invstd, args, dx, dz, dgamma, dbeta);
    if (dz.defined() && zt != dz.dtype()) dz = to_dense(dz, zt, args.nhwc);
    return std::vector<Tensor>{dx, dz, dgamma, dbeta};
  });
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_floating(x, "dropout", "input");
  TANDEM_CHECK(p >= 0.0 && p < 1.0, "dropout: probability ", p, " outside [0, 1)");
  if (!training || p == 0.0) return x;
  Tensor mask = empty_dense_like(is_dense(x) ? x : x.contiguous());
  uint64_t offset = gen.advance(static_cast<uint64_t>(x.numel()));
  be(x).dropout_mask(mask, gen.seed(), offset, p);
  Tensor y = binary_raw(backend::Binary::Mul, x, mask);
  return record_op(y, {x}, "dropout", [mask](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(backend::Binary::Mul, g, mask)};
  });
}

}  // namespace tandem
