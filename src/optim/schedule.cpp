// Learning-rate schedules, and the split of a model's parameters into weight-decay groups.
#include <cmath>
#include <unordered_set>

#include "tandem/nn/layers.h"
#include "tandem/optim/optimizer.h"

namespace tandem::optim {

ConstantLr::ConstantLr(double value) : value_(value) {
  TANDEM_CHECK(std::isfinite(value) && value >= 0.0, "ConstantLr: the rate must be finite and not negative, got ",
               value);
}

std::string ConstantLr::describe() const { return detail::cat("constant ", value_); }

ExponentialDecay::ExponentialDecay(double init, int64_t decay_steps, double rate, bool staircase)
    : init_(init), rate_(rate), decay_steps_(decay_steps), staircase_(staircase) {
  TANDEM_CHECK(decay_steps > 0, "ExponentialDecay: decay_steps must be positive, got ", decay_steps);
  TANDEM_CHECK(std::isfinite(init) && init >= 0.0 && std::isfinite(rate) && rate > 0.0,
               "ExponentialDecay: the initial rate must be finite and not negative and the decay rate positive, got ",
               init, " and ", rate);
}

double ExponentialDecay::lr(int64_t step) const {
  const double e = staircase_ ? static_cast<double>(step / decay_steps_)
                              : static_cast<double>(step) / static_cast<double>(decay_steps_);
  return init_ * std::pow(rate_, e);
}

std::string ExponentialDecay::describe() const {
  return detail::cat("exponential decay from ", init_, " by ", rate_, " every ", decay_steps_, " steps",
                     staircase_ ? " (staircase)" : "");
}

WarmupCosine::WarmupCosine(double peak, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : peak_(peak), min_(min_lr), warmup_(warmup_steps), total_(total_steps) {
  TANDEM_CHECK(std::isfinite(peak) && peak >= 0.0 && std::isfinite(min_lr) && min_lr >= 0.0 && min_lr <= peak,
               "WarmupCosine: rates must satisfy 0 <= min_lr <= peak, got peak ", peak, " and min_lr ", min_lr);
  TANDEM_CHECK(warmup_steps >= 0 && total_steps > warmup_steps, "WarmupCosine: needs 0 <= warmup_steps < total_steps, got ",
               warmup_steps, " and ", total_steps);
}

double WarmupCosine::lr(int64_t step) const {
  if (step < warmup_) return peak_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_) return min_;
  const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return min_ + (peak_ - min_) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

std::string WarmupCosine::describe() const {
  return detail::cat("linear warm-up over ", warmup_, " steps to ", peak_, ", then cosine decay to ", min_,
                     " at step ", total_);
}

std::vector<ParamGroup> decay_groups(const nn::Module& model, double weight_decay) {
  TANDEM_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, "decay_groups: weight decay must be finite and not "
               "negative, got ", weight_decay);
  std::unordered_set<const TensorImpl*> tables;
  const_cast<nn::Module&>(model).apply([&](nn::Module& m) {
    if (auto* e = dynamic_cast<nn::Embedding*>(&m)) tables.insert(e->weight.impl());
  });
  std::vector<ParamGroup> out(2);
  out[0].weight_decay = weight_decay;
  out[1].weight_decay = 0.0;
  for (const Tensor& p : model.parameters()) {
    const bool decays = p.dim() >= 2 && !tables.count(p.impl());
    out[decays ? 0 : 1].params.push_back(p);
  }
  return out;
}

}  // namespace tandem::optim
