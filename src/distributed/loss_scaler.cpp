#include "tandem/distributed/loss_scaler.h"

#include "tandem/ops.h"

namespace tandem::dist {

LossScaler::LossScaler(DistOpt& opt, LossScalerOptions options) : opt_(opt), options_(options) {
  TANDEM_CHECK(opt.options().skip_nonfinite, "LossScaler: the DistOpt must check its gradients for inf/NaN "
               "(DistOptOptions::skip_nonfinite = true)");
  TANDEM_CHECK(options.init_scale > 0 && options.growth_factor >= 1 && options.backoff_factor > 0 &&
                   options.backoff_factor < 1 && options.growth_interval >= 1,
               "LossScaler: the scale must be positive, growth at least 1, backoff in (0, 1), the interval at least 1");
  const Device d = opt.communicator().device();
  scale_t_ = Tensor::empty({}, DType::f32, d);
  inverse_t_ = Tensor::empty({}, DType::f32, d);
  set_scale(options.init_scale);
}

void LossScaler::set_scale(double s) {
  scale_ = s;
  scale_t_.fill_(s);  // a fill queued on the device: no host wait
  inverse_t_.fill_(1.0 / s);
}

Tensor LossScaler::scale_loss(const Tensor& loss) const {
  TANDEM_CHECK(loss.numel() == 1 && loss.dtype() == DType::f32, "LossScaler: the loss must be one f32 value, got ",
               loss.str());
  return mul(loss, loss.dim() == 0 ? scale_t_ : scale_t_.view(loss.shape()));
}

void LossScaler::unscale() { opt_.scale_gradients(inverse_t_); }

bool LossScaler::update() {
  const bool applied = opt_.update();
  if (!applied) {
    ++skipped_;
    clean_ = 0;
    set_scale(scale_ * options_.backoff_factor);
  } else if (++clean_ >= options_.growth_interval) {
    clean_ = 0;
    set_scale(scale_ * options_.growth_factor);
  }
  return applied;
}

}  // namespace tandem::dist
