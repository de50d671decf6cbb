#include "tandem/distributed/loss_scaler.h"

#include <cmath>

#include "backend/backend.h"
#include "tandem/ops.h"

namespace tandem::dist {

LossScaler::LossScaler(DistOpt& opt, LossScalerOptions options) : opt_(opt), options_(options) {
  TANDEM_CHECK(opt.options().skip_nonfinite, "LossScaler: the DistOpt must check its gradients for inf/NaN "
               "(DistOptOptions::skip_nonfinite = true)");
  TANDEM_CHECK(options.init_scale > 0 && options.init_scale < 3e38 && options.growth_factor >= 1 &&
                   options.backoff_factor > 0 && options.backoff_factor < 1 && options.growth_interval >= 1,
               "LossScaler: the scale must be positive (and an f32), growth at least 1, backoff in (0, 1), the "
               "interval at least 1");
  const Device d = opt.communicator().device();
  scale_ = Tensor::from_vector(std::vector<float>{static_cast<float>(options.init_scale),
                                                  static_cast<float>(1.0 / options.init_scale)},
                               {2})
               .to(d);
  counts_ = Tensor::zeros({2}, DType::i64, d);
  opt_.set_gradient_scale(scale_.narrow(0, 1, 1));
}

LossScaler::~LossScaler() { opt_.set_gradient_scale(Tensor()); }

Tensor LossScaler::scale_loss(const Tensor& loss) const {
  TANDEM_CHECK(loss.numel() == 1 && loss.dtype() == DType::f32, "LossScaler: the loss must be one f32 value, got ",
               loss.str());
  Tensor s = scale_.narrow(0, 0, 1);
  return mul(loss, loss.dim() == 0 ? s.view({}) : s.view(loss.shape()));
}

bool LossScaler::update() {
  const bool applied = opt_.update();
  backend::backend_for(scale_.device())
      .loss_scale_update(opt_.step_verdict(), scale_, counts_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
  return applied;
}

double LossScaler::scale() const { return scale_.to_vector<float>()[0]; }

int64_t LossScaler::skipped_steps() const { return counts_.to_vector<int64_t>()[1]; }

std::vector<std::pair<std::string, Tensor>> LossScaler::state() const { return {{"scale", scale_}, {"counts", counts_}}; }

void LossScaler::load_state(const std::vector<std::pair<std::string, Tensor>>& saved) {
  bool got_scale = false, got_counts = false;
  for (const auto& [name, t] : saved) {
    Tensor& dst = name == "scale" ? scale_ : counts_;
    if (name != "scale" && name != "counts") continue;
    TANDEM_CHECK(t.numel() == 2 && t.dtype() == dst.dtype(), "saved loss scale state '", name, "' is ", t.str(),
                 "; expected ", dst.str());
    if (name == "scale") {
      const std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
      TANDEM_CHECK(std::isfinite(v[0]) && v[0] > 0 && v[1] == 1.0f / v[0], "the saved loss scale ", v[0],
                   " (inverse ", v[1], ") is not a usable scale");
    }
    dst.copy_(t.view({2}));
    (name == "scale" ? got_scale : got_counts) = true;
  }
  TANDEM_CHECK(got_scale && got_counts, "the saved loss scale state lacks its ", got_scale ? "counts" : "scale");
}

}  // namespace tandem::dist
