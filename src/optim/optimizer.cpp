#include "tandem/optim/optimizer.h"

#include <cmath>
#include <map>
#include <unordered_map>

#include "backend/backend.h"
#include "core/tensor_impl.h"
#include "tandem/autograd.h"

namespace tandem::optim {

using backend::ParamSlot;

namespace {
std::vector<Tensor> flatten_groups(const std::vector<ParamGroup>& groups) {
  std::vector<Tensor> out;
  for (const ParamGroup& g : groups) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

void check_group_settings(double lr_scale, const std::optional<double>& weight_decay, size_t g) {
  TANDEM_CHECK(std::isfinite(lr_scale) && lr_scale >= 0.0, "parameter group ", g,
               ": the learning-rate factor must be finite and not negative, got ", lr_scale);
  TANDEM_CHECK(!weight_decay || (std::isfinite(*weight_decay) && *weight_decay >= 0.0), "parameter group ", g,
               ": weight decay must be finite and not negative, got ", weight_decay.value_or(0.0));
}
}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr)
    : params_(std::move(params)), lr_(lr), groups_(1), group_of_(params_.size(), 0) {
  TANDEM_CHECK(lr >= 0.0, "learning rate must not be negative, got ", lr);
  for (const Tensor& p : params_) {
    TANDEM_CHECK(p.defined() && p.requires_grad(), "optimizer given a tensor that does not require a gradient");
    TANDEM_CHECK(p.is_contiguous(), "optimizer parameters must be contiguous, got ", p.str());
  }
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr) : Optimizer(flatten_groups(groups), lr) {
  if (groups.empty()) return;
  groups_.clear();
  group_of_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group_settings(groups[g].lr_scale, groups[g].weight_decay, g);
    groups_.push_back({groups[g].lr_scale, groups[g].weight_decay});
    group_of_.insert(group_of_.end(), groups[g].params.size(), static_cast<int>(g));
  }
}

void Optimizer::set_lr(double lr) {
  TANDEM_CHECK(lr >= 0.0 && std::isfinite(lr), "learning rate must be finite and not negative, got ", lr);
  lr_ = lr;
}

void Optimizer::set_param_groups(const std::vector<ParamGroup>& groups) {
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].impl(), i);
  std::vector<int> of(params_.size(), -1);
  std::vector<GroupSettings> settings;
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group_settings(groups[g].lr_scale, groups[g].weight_decay, g);
    settings.push_back({groups[g].lr_scale, groups[g].weight_decay});
    for (const Tensor& t : groups[g].params) {
      auto it = t.defined() ? index.find(t.impl()) : index.end();
      TANDEM_CHECK(it != index.end(), "set_param_groups: group ", g, " holds ",
                   t.defined() ? t.str() : std::string("an undefined tensor"), ", which is not one of the optimizer's ",
                   params_.size(), " parameters");
      TANDEM_CHECK(of[it->second] < 0, "set_param_groups: parameter ", it->second, " ", t.str(), " is in groups ",
                   of[it->second], " and ", g, "; a parameter belongs to one group");
      of[it->second] = static_cast<int>(g);
    }
  }
  bool rest = false;
  for (int& g : of)
    if (g < 0) {
      g = static_cast<int>(settings.size());
      rest = true;
    }
  if (rest || settings.empty()) settings.push_back({});
  groups_ = std::move(settings);
  group_of_ = std::move(of);
}

void Optimizer::set_group_settings(size_t group, const GroupSettings& s) {
  TANDEM_CHECK(group < groups_.size(), "set_group_settings: group ", group, " of ", groups_.size());
  check_group_settings(s.lr_scale, s.weight_decay, group);
  groups_[group] = s;
}

void Optimizer::set_schedule(std::shared_ptr<const LrSchedule> schedule) {
  schedule_ = std::move(schedule);
  if (schedule_) set_lr(schedule_->lr(steps_));
}

void Optimizer::set_steps(int64_t n) {
  steps_ = n;
  if (schedule_) set_lr(schedule_->lr(steps_));
}

// ---- master weights

struct Optimizer::Binding {
  std::shared_ptr<Storage> storage;
  Shape strides;
  int64_t offset = 0;
};

void Optimizer::keep_master_weights(DType dtype) {
  TANDEM_CHECK(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32,
               "master weights keep bf16 or f16 parameters (f32: none), not ", dtype_name(dtype));
  for (const Tensor& p : params_)
    TANDEM_CHECK(p.dtype() == DType::f32, "master weights: parameter ", p.str(), " is not f32");
  restore_params(/*round=*/false);
  master_dtype_ = dtype;
  masters_.assign(params_.size(), Tensor());
  if (dtype == DType::f32) return;
  NoGradGuard no_grad;
  for (const Tensor& p : params_) p.detach().copy_(p.detach().to(dtype));
}

std::vector<Optimizer::StateList> Optimizer::all_state_lists() {
  std::vector<StateList> out = state_lists();
  if (master_dtype_ != DType::f32) out.push_back({"master", &masters_});
  return out;
}

std::string Optimizer::master_weights_blocker() const {
  if (master_dtype_ == DType::f32) return "";
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined() && (i >= masters_.size() || !masters_[i].defined()))
      return "master weights are made from the parameters at their first step";
  return "";
}

// Under master weights, the parameters that step view their masters while the step runs (made from the
// parameter at its first step); end_step points them back and writes the masters' rounding into them.
void Optimizer::begin_step() {
  if (schedule_) set_lr(schedule_->lr(steps_));
  if (master_dtype_ == DType::f32) return;
  restore_params(/*round=*/false);  // a step that threw midway
  if (masters_.size() != params_.size()) masters_.resize(params_.size());
  swapped_.assign(params_.size(), nullptr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    if (!masters_[i].defined()) masters_[i] = p.detach().clone();
    TensorImpl* impl = p.impl();
    swapped_[i] = std::make_shared<Binding>(Binding{impl->storage, impl->strides, impl->offset});
    rebind_storage(p, masters_[i]);
  }
}

void Optimizer::end_step() {
  steps_++;
  if (schedule_) set_lr(schedule_->lr(steps_));
  restore_params(/*round=*/true);  // nothing when no step of masters is in progress (a replay's count)
}

void Optimizer::restore_params(bool round) {
  if (swapped_.empty()) return;
  std::vector<std::shared_ptr<Binding>> swapped = std::move(swapped_);
  swapped_.clear();
  NoGradGuard no_grad;
  for (size_t i = 0; i < swapped.size(); ++i) {
    if (!swapped[i]) continue;
    TensorImpl* impl = params_[i].impl();
    impl->storage = swapped[i]->storage;
    impl->strides = swapped[i]->strides;
    impl->offset = swapped[i]->offset;
    if (!round) continue;
    // The 16-bit copy a step keeps is the master's rounding already; otherwise one is made.
    const Tensor& c = copies_.empty() ? Tensor() : copies_[i];
    params_[i].detach().copy_(c.defined() && c.dtype() == master_dtype_ ? c : masters_[i].to(master_dtype_));
  }
}

void Optimizer::count_replayed_step() { end_step(); }

void Optimizer::set_step_guard(Tensor verdict) {
  TANDEM_CHECK(!verdict.defined() || (verdict.numel() == 1 && verdict.dtype() == DType::f32),
               "a step guard is one f32 value, got ", verdict.str());
  guard_ = std::move(verdict);
}

void Optimizer::set_gradient_factor(Tensor factor) {
  TANDEM_CHECK(!factor.defined() || takes_gradient_factor(),
               "this optimizer does not take a gradient factor: scale the gradients before its step");
  TANDEM_CHECK(!factor.defined() || (factor.numel() == 1 && factor.dtype() == DType::f32 &&
                                     (params_.empty() || factor.device() == params_.front().device())),
               "a gradient factor is one f32 value on the parameters' device, got ", factor.str());
  grad_factor_ = std::move(factor);
}

void Optimizer::step_with_gradient_factor(const Tensor& factor) {
  if (!factor.defined()) return step();
  set_gradient_factor(factor);
  struct Clear {
    Optimizer& o;
    ~Clear() { o.grad_factor_ = Tensor(); }
  } clear{*this};
  step();
}

void Optimizer::set_parameter_copies(std::vector<Tensor> copies) {
  TANDEM_CHECK(copies.empty() || keeps_parameter_copies(), "this optimizer does not keep parameter copies");
  TANDEM_CHECK(copies.empty() || copies.size() == params_.size(), "set_parameter_copies: ", copies.size(),
               " copies for ", params_.size(), " parameters");
  for (size_t i = 0; i < copies.size(); ++i) {
    const Tensor& c = copies[i];
    if (!c.defined()) continue;
    TANDEM_CHECK((c.dtype() == DType::bf16 || c.dtype() == DType::f16) && c.is_contiguous() &&
                     c.shape() == params_[i].shape() && c.device() == params_[i].device() &&
                     params_[i].dtype() == DType::f32,
                 "set_parameter_copies: copy ", i, " ", c.str(), " is not a contiguous bf16 or f16 tensor of parameter ",
                 params_[i].str(), "'s shape and device (of an f32 parameter)");
  }
  copies_ = std::move(copies);
}

bool Optimizer::guard_allows() const { return !guard_.defined() || std::isfinite(guard_.item<float>()); }

std::shared_ptr<Optimizer> Optimizer::with_params(std::vector<ParamGroup>) const {
  TANDEM_CHECK(false, "this optimizer cannot step slices of its parameters (sharded state needs SGD, Adam, RMSProp "
               "or AdaGrad)");
}

namespace {
// groups with the settings of `from`'s groups, for with_params.
std::vector<ParamGroup> with_settings(std::vector<ParamGroup> groups, const Optimizer& from) {
  TANDEM_CHECK(groups.size() == from.groups().size(), "with_params: ", groups.size(), " groups for an optimizer of ",
               from.groups().size());
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].lr_scale = from.groups()[g].lr_scale;
    groups[g].weight_decay = from.groups()[g].weight_decay;
  }
  return groups;
}
}  // namespace

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

// The guard's address for kernels on the slots' device.
const float* device_guard(const Tensor& guard, const std::vector<ParamSlot>& slots) {
  if (!guard.defined()) return nullptr;
  TANDEM_CHECK(slots.empty() || guard.device() == slots.front().param.device(), "the step guard is on ",
               guard.device().str(), " but the parameters are on ", slots.front().param.device().str());
  return guard.data<float>();
}
}  // namespace

// ---- SGD

SGD::SGD(std::vector<Tensor> params, const SgdOptions& opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt), momentum_(params_.size()) {
  check_options();
}

SGD::SGD(std::vector<ParamGroup> groups, const SgdOptions& opt)
    : Optimizer(std::move(groups), opt.lr), opt_(opt), momentum_(params_.size()) {
  check_options();
}

std::shared_ptr<Optimizer> SGD::with_params(std::vector<ParamGroup> groups) const {
  auto out = std::make_shared<SGD>(with_settings(std::move(groups), *this), opt_);
  out->set_lr(lr_);
  return out;
}

void SGD::check_options() const {
  TANDEM_CHECK(opt_.momentum >= 0.0, "SGD momentum must not be negative, got ", opt_.momentum);
  TANDEM_CHECK(opt_.weight_decay >= 0.0, "SGD weight decay must not be negative, got ", opt_.weight_decay);
  TANDEM_CHECK(!opt_.nesterov || (opt_.momentum > 0.0 && opt_.dampening == 0.0),
               "Nesterov momentum needs momentum > 0 and dampening 0");
}

void SGD::step() {
  NoGradGuard no_grad;
  begin_step();
  // Slots whose momentum buffer is new start it from the gradient (first_step); the others update it.
  const size_t ngroups = groups_.size();
  std::vector<std::vector<ParamSlot>> fresh(ngroups), running(ngroups);
  std::vector<size_t> fresh_index;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g);
    const size_t grp = static_cast<size_t>(group_of_[i]);
    ParamSlot s{params_[i], g, Tensor(), Tensor(), copies_.empty() ? Tensor() : copies_[i]};
    if (opt_.momentum != 0.0) {
      bool first = !momentum_[i].defined();
      if (first) {
        momentum_[i] = Tensor::empty(params_[i].shape(), params_[i].dtype(), params_[i].device());
        fresh_index.push_back(i);
      }
      s.buf0 = momentum_[i];
      (first ? fresh : running)[grp].push_back(std::move(s));
    } else {
      running[grp].push_back(std::move(s));
    }
  }
  // A first step decides on the host: a skipped one must leave the momentum buffers unborn (a
  // running update from zeros would not be the first step's). Later steps leave the skip to the kernels.
  if (!fresh_index.empty() && !guard_allows()) {
    for (size_t i : fresh_index) momentum_[i] = Tensor();
    end_step();
    return;
  }
  for (size_t grp = 0; grp < ngroups; ++grp) {
    backend::SgdArgs args{group_lr(grp), opt_.momentum, opt_.dampening, group_decay(grp, opt_.weight_decay),
                          opt_.nesterov, false};
    args.guard = device_guard(guard_, running[grp]);
    run_grouped(running[grp], [&](backend::Backend& b, std::vector<ParamSlot>& g) {
      b.sgd_step(g.data(), static_cast<int64_t>(g.size()), args);
    });
    args.first_step = true;
    args.guard = device_guard(guard_, fresh[grp]);
    run_grouped(fresh[grp], [&](backend::Backend& b, std::vector<ParamSlot>& g) {
      b.sgd_step(g.data(), static_cast<int64_t>(g.size()), args);
    });
  }
  end_step();
}

std::string SGD::replay_blocker() const {
  if (opt_.momentum == 0.0) return "";
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined() && !momentum_[i].defined()) return "sgd's first step initialises its momentum";
  return "";
}

// ---- Adam

Adam::Adam(std::vector<Tensor> params, const AdamOptions& opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt), m_(params_.size()), v_(params_.size()), t_(params_.size()) {
  check_options();
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& opt)
    : Optimizer(std::move(groups), opt.lr), opt_(opt), m_(params_.size()), v_(params_.size()), t_(params_.size()) {
  check_options();
}

std::shared_ptr<Optimizer> Adam::with_params(std::vector<ParamGroup> groups) const {
  auto out = std::make_shared<Adam>(with_settings(std::move(groups), *this), opt_);
  out->set_lr(lr_);
  return out;
}

void Adam::check_options() const {
  TANDEM_CHECK(opt_.beta1 >= 0.0 && opt_.beta1 < 1.0 && opt_.beta2 >= 0.0 && opt_.beta2 < 1.0,
               "Adam betas must lie in [0, 1)");
  TANDEM_CHECK(opt_.eps > 0.0, "Adam eps must be positive");
  TANDEM_CHECK(opt_.weight_decay >= 0.0, "Adam weight decay must not be negative");
}

void Adam::step() {
  NoGradGuard no_grad;
  begin_step();
  // Adam's step counts live on the host, so its guard is read there.
  if (!guard_allows()) {
    end_step();
    return;
  }
  // Parameters are grouped by their group and step count (which differs only if some skipped a step).
  std::map<std::pair<int, int64_t>, std::vector<ParamSlot>> by_step;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g);
    if (!m_[i].defined()) {
      m_[i] = Tensor::zeros(params_[i].shape(), params_[i].dtype(), params_[i].device());
      v_[i] = Tensor::zeros(params_[i].shape(), params_[i].dtype(), params_[i].device());
    }
    by_step[{group_of_[i], ++t_[i]}].push_back(
        ParamSlot{params_[i], g, m_[i], v_[i], copies_.empty() ? Tensor() : copies_[i]});
  }
  // A step being recorded reads its factors from the device (written by after_recording and
  // prepare_replay), so that replays follow the schedule and the bias correction.
  const float* dyn = nullptr;
  if (!by_step.empty()) {
    const Device dev = by_step.begin()->second.front().param.device();
    if (dev.is_cuda()) {
      if (!dev_scalars_.defined() || dev_scalars_.device() != dev ||
          dev_scalars_.numel() != static_cast<int64_t>(3 * groups_.size()))
        dev_scalars_ = Tensor::zeros({static_cast<int64_t>(3 * groups_.size())}, DType::f32, dev);
      if (backend::backend_for(dev).recording(dev.index)) {
        fill_scalars(by_step.begin()->first.second, lr_);
        dyn = dev_scalars_.data<float>();
      }
    }
  }
  for (auto& [key, slots] : by_step) {
    const size_t grp = static_cast<size_t>(key.first);
    backend::AdamArgs args{group_lr(grp), opt_.beta1, opt_.beta2, opt_.eps, group_decay(grp, opt_.weight_decay),
                           key.second, opt_.decoupled};
    if (dyn) args.step_scalars = dyn + 3 * grp;
    if (grad_factor_.defined()) args.grad_factor = grad_factor_.data<float>();
    run_grouped(slots, [&](backend::Backend& b, std::vector<ParamSlot>& g) {
      b.adam_step(g.data(), static_cast<int64_t>(g.size()), args);
    });
  }
  end_step();
}

std::string Adam::replay_blocker() const {
  if (guard_.defined()) return "adam's step guard (loss scaling) is read on the host";
  bool any_state = false;
  for (const Tensor& m : m_) any_state = any_state || m.defined();
  if (!any_state) return "adam's first step creates its state";
  int64_t t = -1;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined() && !m_[i].defined()) continue;
    if (!m_[i].defined()) return "adam's first step creates its state";
    if (t >= 0 && t_[i] != t) return "adam's parameters have taken different numbers of steps";
    t = t_[i];
    if (params_[i].device() != params_.front().device()) return "adam's parameters are on several devices";
  }
  return "";
}

void Adam::fill_scalars(int64_t t, double lr) {
  const double td = static_cast<double>(t);
  const double bc1 = 1.0 - std::pow(opt_.beta1, td), inv_sqrt_bc2 = 1.0 / std::sqrt(1.0 - std::pow(opt_.beta2, td));
  host_scalars_.assign(3 * groups_.size(), 0.0f);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const double lr_g = lr * groups_[g].lr_scale, wd = group_decay(g, opt_.weight_decay);
    host_scalars_[3 * g] = static_cast<float>(lr_g / bc1);
    host_scalars_[3 * g + 1] = static_cast<float>(inv_sqrt_bc2);
    host_scalars_[3 * g + 2] = opt_.decoupled ? static_cast<float>(1.0 - lr_g * wd) : 1.0f;
  }
}

void Adam::upload_scalars() {
  if (!dev_scalars_.defined() || host_scalars_.size() != static_cast<size_t>(dev_scalars_.numel())) return;
  const Device dev = dev_scalars_.device();
  backend::backend_for(dev).copy_from_host(host_scalars_.data(), dev_scalars_.data<float>(),
                                           host_scalars_.size() * sizeof(float), dev.index);
}

void Adam::after_recording() { upload_scalars(); }

void Adam::prepare_replay() {
  int64_t t = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (m_[i].defined()) t = std::max(t, t_[i]);
  fill_scalars(t + 1, schedule_ ? schedule_->lr(steps_) : lr_);
  upload_scalars();
}

void Adam::count_replayed_step() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (m_[i].defined()) ++t_[i];
  Optimizer::count_replayed_step();
}

// ---- RMSProp

RMSProp::RMSProp(std::vector<Tensor> params, const RmsPropOptions& opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt), v_(params_.size()) {
  check_options();
}

RMSProp::RMSProp(std::vector<ParamGroup> groups, const RmsPropOptions& opt)
    : Optimizer(std::move(groups), opt.lr), opt_(opt), v_(params_.size()) {
  check_options();
}

std::shared_ptr<Optimizer> RMSProp::with_params(std::vector<ParamGroup> groups) const {
  auto out = std::make_shared<RMSProp>(with_settings(std::move(groups), *this), opt_);
  out->set_lr(lr_);
  return out;
}

void RMSProp::check_options() const {
  TANDEM_CHECK(opt_.alpha >= 0.0 && opt_.alpha < 1.0, "RMSProp alpha (rho) must lie in [0, 1), got ", opt_.alpha);
  TANDEM_CHECK(opt_.eps > 0.0, "RMSProp eps must be positive, got ", opt_.eps);
  TANDEM_CHECK(opt_.weight_decay >= 0.0, "RMSProp weight decay must not be negative, got ", opt_.weight_decay);
}

void RMSProp::step() {
  NoGradGuard no_grad;
  begin_step();
  std::vector<std::vector<ParamSlot>> slots(groups_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g);
    // A zero average is where the update starts from, so a guarded first step that is skipped leaves
    // the state as a first step would find it.
    if (!v_[i].defined()) v_[i] = Tensor::zeros(params_[i].shape(), params_[i].dtype(), params_[i].device());
    slots[static_cast<size_t>(group_of_[i])].push_back(ParamSlot{params_[i], g, v_[i], Tensor(), Tensor()});
  }
  for (size_t grp = 0; grp < slots.size(); ++grp) {
    backend::RmsPropArgs args{group_lr(grp), opt_.alpha, opt_.eps, group_decay(grp, opt_.weight_decay),
                              opt_.eps_inside_sqrt};
    args.guard = device_guard(guard_, slots[grp]);
    run_grouped(slots[grp], [&](backend::Backend& b, std::vector<ParamSlot>& g) {
      b.rmsprop_step(g.data(), static_cast<int64_t>(g.size()), args);
    });
  }
  end_step();
}

std::string RMSProp::replay_blocker() const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined() && !v_[i].defined()) return "rmsprop's first step creates its running averages";
  return "";
}

// ---- AdaGrad

AdaGrad::AdaGrad(std::vector<Tensor> params, const AdagradOptions& opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt), s_(params_.size()), t_(params_.size()) {
  check_options();
}

AdaGrad::AdaGrad(std::vector<ParamGroup> groups, const AdagradOptions& opt)
    : Optimizer(std::move(groups), opt.lr), opt_(opt), s_(params_.size()), t_(params_.size()) {
  check_options();
}

std::shared_ptr<Optimizer> AdaGrad::with_params(std::vector<ParamGroup> groups) const {
  auto out = std::make_shared<AdaGrad>(with_settings(std::move(groups), *this), opt_);
  out->set_lr(lr_);
  return out;
}

void AdaGrad::check_options() const {
  TANDEM_CHECK(opt_.eps > 0.0, "AdaGrad eps must be positive, got ", opt_.eps);
  TANDEM_CHECK(opt_.lr_decay >= 0.0, "AdaGrad lr_decay must not be negative, got ", opt_.lr_decay);
  TANDEM_CHECK(opt_.weight_decay >= 0.0, "AdaGrad weight decay must not be negative, got ", opt_.weight_decay);
  TANDEM_CHECK(opt_.initial_accumulator_value >= 0.0, "AdaGrad initial_accumulator_value must not be negative, got ",
               opt_.initial_accumulator_value);
}

void AdaGrad::step() {
  NoGradGuard no_grad;
  begin_step();
  // With a decaying rate the step counts matter, and they live on the host: so does the guard then.
  const bool decays = opt_.lr_decay != 0.0;
  if (decays && !guard_allows()) {
    end_step();
    return;
  }
  std::map<std::pair<int, int64_t>, std::vector<ParamSlot>> by_step;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g);
    if (!s_[i].defined())
      s_[i] = Tensor::full(params_[i].shape(), opt_.initial_accumulator_value, params_[i].dtype(), params_[i].device());
    ++t_[i];
    by_step[{group_of_[i], decays ? t_[i] : 0}].push_back(ParamSlot{params_[i], g, s_[i], Tensor(), Tensor()});
  }
  for (auto& [key, slots] : by_step) {
    const size_t grp = static_cast<size_t>(key.first);
    const double lr = decays ? group_lr(grp) / (1.0 + static_cast<double>(key.second - 1) * opt_.lr_decay) : group_lr(grp);
    backend::AdagradArgs args{lr, opt_.eps, group_decay(grp, opt_.weight_decay), opt_.eps_inside_sqrt};
    args.guard = decays ? nullptr : device_guard(guard_, slots);
    run_grouped(slots, [&](backend::Backend& b, std::vector<ParamSlot>& g) {
      b.adagrad_step(g.data(), static_cast<int64_t>(g.size()), args);
    });
  }
  end_step();
}

std::string AdaGrad::replay_blocker() const {
  if (opt_.lr_decay != 0.0) return "adagrad's decaying learning rate depends on a step count kept on the host";
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined() && !s_[i].defined()) return "adagrad's first step creates its sums";
  return "";
}

}  // namespace tandem::optim
