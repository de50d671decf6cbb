// Batch normalisation and dropout.
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor batch_norm2d(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                    Tensor& running_var, bool training, double momentum, double eps) {
  check_dim(x, 4, "batch_norm2d", "input");
  check_floating(x, "batch_norm2d", "input");
  int64_t c = x.size(1);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&gamma, &beta, &running_mean, &running_var}) {
    check_dim(*t, 1, "batch_norm2d", "parameter");
    TANDEM_CHECK(t->size(0) == c && t->dtype() == x.dtype() && t->device() == x.device(), "batch_norm2d: ",
                 t->str(), " does not match the ", c, " channels of ", x.str());
    TANDEM_CHECK(t->is_contiguous(), "batch_norm2d: parameters must be contiguous");
  }
  TANDEM_CHECK(eps > 0, "batch_norm2d: eps must be positive");
  Tensor xc = x.contiguous();
  Tensor y = empty_like(xc);
  if (!training) {
    be(x).batch_norm_forward_eval(xc, gamma, beta, running_mean, running_var, eps, y);
    // Evaluation is an affine map per channel: y = (x - mean) * invstd * gamma + beta with the running
    // statistics, so dx = dy * gamma * invstd, dgamma = sum dy * xhat, dbeta = sum dy.
    const bool need_x = x.requires_grad(), need_g = gamma.requires_grad(), need_b = beta.requires_grad();
    Tensor sx = need_g ? xc.detach() : Tensor();
    Tensor sg = gamma.detach(), sm = running_mean.detach(), sv = running_var.detach();
    return record_op(y, {x, gamma, beta}, "batch_norm2d_eval",
                     [sx, sg, sm, sv, eps, c, need_x, need_g, need_b](const Tensor& grad) {
      Tensor dy = grad.contiguous();
      const int64_t n = dy.size(0), s = n * c != 0 ? dy.numel() / (n * c) : 0;
      auto per_channel = [&](const Tensor& v) {  // v [c] broadcast to dy's shape
        Tensor out = Tensor::zeros(dy.shape(), dy.dtype(), dy.device());
        be(dy).bias_add(out, v, n, c, s, out);
        return out;
      };
      Tensor invstd = unary_raw(backend::Unary::Sqrt, affine_raw(sv, 1.0, eps));
      invstd = binary_raw(backend::Binary::Div, Tensor::ones({c}, dy.dtype(), dy.device()), invstd);
      Tensor dx, dgamma, dbeta;
      if (need_x) dx = binary_raw(backend::Binary::Mul, dy, per_channel(binary_raw(backend::Binary::Mul, sg, invstd)));
      if (need_g) {
        Tensor xhat = empty_like(dy);
        be(dy).bias_add(sx, affine_raw(sm, -1.0, 0.0), n, c, s, xhat);
        xhat = binary_raw(backend::Binary::Mul, xhat, per_channel(invstd));
        dgamma = Tensor::empty({c}, dy.dtype(), dy.device());
        be(dy).bias_grad(binary_raw(backend::Binary::Mul, dy, xhat), n, c, s, dgamma);
      }
      if (need_b) {
        dbeta = Tensor::empty({c}, dy.dtype(), dy.device());
        be(dy).bias_grad(dy, n, c, s, dbeta);
      }
      return std::vector<Tensor>{dx, dgamma, dbeta};
    });
  }
  TANDEM_CHECK(c == 0 || x.numel() / c > 1, "batch_norm2d: training needs more than one value per channel, got ", x.str());
  Tensor save_mean = Tensor::empty({c}, x.dtype(), x.device());
  Tensor save_invstd = Tensor::empty({c}, x.dtype(), x.device());
  be(x).batch_norm_forward_train(xc, gamma, beta, running_mean, running_var, momentum, eps, y, save_mean,
                                 save_invstd);
  Tensor sx = xc.detach(), sg = gamma.detach();
  return record_op(y, {x, gamma, beta}, "batch_norm2d", [sx, sg, save_mean, save_invstd](const Tensor& grad) {
    Tensor dy = grad.contiguous();
    Tensor dx = empty_like(dy), dgamma = empty_like(sg), dbeta = empty_like(sg);
    be(dy).batch_norm_backward(dy, sx, sg, save_mean, save_invstd, dx, dgamma, dbeta);
    return std::vector<Tensor>{dx, dgamma, dbeta};
  });
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_floating(x, "dropout", "input");
  TANDEM_CHECK(p >= 0.0 && p < 1.0, "dropout: probability ", p, " outside [0, 1)");
  if (!training || p == 0.0) return x;
  Tensor mask = empty_like(x);
  uint64_t offset = gen.advance(static_cast<uint64_t>(x.numel()));
  be(x).dropout_mask(mask, gen.seed(), offset, p);
  Tensor y = binary_raw(backend::Binary::Mul, x, mask);
  return record_op(y, {x}, "dropout", [mask](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(backend::Binary::Mul, g, mask)};
  });
}

}  // namespace tandem
