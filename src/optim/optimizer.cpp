#include "tandem/optim/optimizer.h"

#include <cmath>
#include <map>

#include "backend/backend.h"
#include "tandem/autograd.h"

namespace tandem::optim {

using backend::ParamSlot;

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  TANDEM_CHECK(lr >= 0.0, "learning rate must not be negative, got ", lr);
  for (const Tensor& p : params_) {
    TANDEM_CHECK(p.defined() && p.requires_grad(), "optimizer given a tensor that does not require a gradient");
    TANDEM_CHECK(p.is_contiguous(), "optimizer parameters must be contiguous, got ", p.str());
  }
}

void Optimizer::set_step_guard(Tensor verdict) {
  TANDEM_CHECK(!verdict.defined() || (verdict.numel() == 1 && verdict.dtype() == DType::f32),
               "a step guard is one f32 value, got ", verdict.str());
  guard_ = std::move(verdict);
}

bool Optimizer::guard_allows() const { return !guard_.defined() || std::isfinite(guard_.item<float>()); }

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none)
      p.set_grad(Tensor());
    else
      p.set_grad(g.zero_(), /*zeroed=*/true);
  }
}

namespace {
// Groups slots by device so each device gets one multi-tensor launch.
template <typename Fn>
void run_grouped(std::vector<ParamSlot>& slots, Fn fn) {
  std::map<std::pair<int, int>, std::vector<ParamSlot>> groups;
  for (ParamSlot& s : slots) {
    Device d = s.param.device();
    groups[{static_cast<int>(d.type), d.index}].push_back(std::move(s));
  }
  for (auto& [key, group] : groups) fn(backend::backend_for(group.front().param.device()), group);
}

void check_grad(const Tensor& p, const Tensor& g) {
  TANDEM_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device() && g.is_contiguous(),
               "gradient ", g.str(), " does not match parameter ", p.str());
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, const SgdOptions& opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt), momentum_(params_.size()) {
  TANDEM_CHECK(opt.momentum >= 0.0, "SGD momentum must not be negative, got ", opt.momentum);
  TANDEM_CHECK(opt.weight_decay >= 0.0, "SGD weight decay must not be negative, got ", opt.weight_decay);
  TANDEM_CHECK(!opt.nesterov || (opt.momentum > 0.0 && opt.dampening == 0.0),
               "Nesterov momentum needs momentum > 0 and dampening 0");
}

void SGD::step() {
  NoGradGuard no_grad;
  // Slots whose momentum buffer is new start it from the gradient (first_step); the others update it.
  std::vector<ParamSlot> fresh, running;
  std::vector<size_t> fresh_index;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g);
    ParamSlot s{params_[i], g, Tensor(), Tensor()};
    if (opt_.momentum != 0.0) {
      bool first = !momentum_[i].defined();
      if (first) {
        momentum_[i] = Tensor::empty(params_[i].shape(), params_[i].dtype(), params_[i].device());
        fresh_index.push_back(i);
      }
      s.buf0 = momentum_[i];
      (first ? fresh : running).push_back(std::move(s));
    } else {
      running.push_back(std::move(s));
    }
  }
  // A first step decides on the host: a skipped one must leave the momentum buffers unborn (a
  // running update from zeros would not be the first step's). Later steps leave the skip to the kernels.
  if (!fresh.empty() && !guard_allows()) {
    for (size_t i : fresh_index) momentum_[i] = Tensor();
    steps_++;
    return;
  }
  backend::SgdArgs args{lr_, opt_.momentum, opt_.dampening, opt_.weight_decay, opt_.nesterov, false};
  if (guard_.defined()) {
    TANDEM_CHECK(running.empty() || guard_.device() == running.front().param.device(), "the step guard is on ",
                 guard_.device().str(), " but the parameters are on ", running.front().param.device().str());
    args.guard = guard_.data<float>();
  }
  run_grouped(running, [&](backend::Backend& b, std::vector<ParamSlot>& g) {
    b.sgd_step(g.data(), static_cast<int64_t>(g.size()), args);
  });
  args.first_step = true;
  run_grouped(fresh, [&](backend::Backend& b, std::vector<ParamSlot>& g) {
    b.sgd_step(g.data(), static_cast<int64_t>(g.size()), args);
  });
  steps_++;
}

std::string SGD::replay_blocker() const {
  if (opt_.momentum == 0.0) return "";
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined() && !momentum_[i].defined()) return "sgd's first step initialises its momentum";
  return "";
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt), m_(params_.size()), v_(params_.size()), t_(params_.size()) {
  TANDEM_CHECK(opt.beta1 >= 0.0 && opt.beta1 < 1.0 && opt.beta2 >= 0.0 && opt.beta2 < 1.0,
               "Adam betas must lie in [0, 1)");
  TANDEM_CHECK(opt.eps > 0.0, "Adam eps must be positive");
  TANDEM_CHECK(opt.weight_decay >= 0.0, "Adam weight decay must not be negative");
}

void Adam::step() {
  NoGradGuard no_grad;
  // Adam's step counts live on the host, so its guard is read there.
  if (!guard_allows()) {
    steps_++;
    return;
  }
  // Parameters are grouped by their step count, which differs only if some skipped a step.
  std::map<int64_t, std::vector<ParamSlot>> by_step;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g);
    if (!m_[i].defined()) {
      m_[i] = Tensor::zeros(params_[i].shape(), params_[i].dtype(), params_[i].device());
      v_[i] = Tensor::zeros(params_[i].shape(), params_[i].dtype(), params_[i].device());
    }
    by_step[++t_[i]].push_back(ParamSlot{params_[i], g, m_[i], v_[i]});
  }
  for (auto& [t, slots] : by_step) {
    backend::AdamArgs args{lr_, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, t, opt_.decoupled};
    run_grouped(slots, [&](backend::Backend& b, std::vector<ParamSlot>& g) {
      b.adam_step(g.data(), static_cast<int64_t>(g.size()), args);
    });
  }
  steps_++;
}

}  // namespace tandem::optim
