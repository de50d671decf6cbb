#pragma once
// Optimizers: apply accumulated gradients to parameters. Parameters come in groups, each with its own
// learning-rate factor and weight decay; the learning rate may follow a schedule of the step count.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/tensor.h"

namespace tandem::nn {
class Module;
}  // namespace tandem::nn

namespace tandem::optim {

/// A learning rate as a function of the step: lr(k) is the rate of the step taken after k others.
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr(int64_t step) const = 0;
  /// One line: the schedule's kind and parameters.
  virtual std::string describe() const = 0;
};

/// The same rate at every step (SINGA's opt.Constant).
class ConstantLr final : public LrSchedule {
 public:
  explicit ConstantLr(double value);
  double lr(int64_t) const override { return value_; }
  std::string describe() const override;

 private:
  double value_;
};

/// init * rate^(step / decay_steps), the exponent rounded down with staircase (SINGA's
/// opt.ExponentialDecay; PyTorch's ExponentialLR with gamma = rate^(1 / decay_steps), or StepLR with
/// step_size = decay_steps and gamma = rate under staircase).
class ExponentialDecay final : public LrSchedule {
 public:
  ExponentialDecay(double init, int64_t decay_steps, double rate, bool staircase = false);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double init_, rate_;
  int64_t decay_steps_;
  bool staircase_;
};

/// Linear warm-up, then cosine decay (as GPT training runs): step k < warmup has peak * (k + 1) / warmup;
/// from warmup to total_steps the rate falls along half a cosine from peak to min_lr,
/// min_lr + (peak - min_lr) (1 + cos(pi (k - warmup) / (total_steps - warmup))) / 2, and stays at min_lr
/// after it (PyTorch: LinearLR(1 / warmup, 1, warmup - 1) then CosineAnnealingLR(total_steps - warmup,
/// min_lr) in a SequentialLR).
class WarmupCosine final : public LrSchedule {
 public:
  WarmupCosine(double peak, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
  double lr(int64_t step) const override;
  std::string describe() const override;

 private:
  double peak_, min_;
  int64_t warmup_, total_;
};

/// Parameters that share a learning-rate factor and a weight decay.
struct ParamGroup {
  std::vector<Tensor> params;
  /// The group's learning rate is the optimizer's (or its schedule's) times this.
  double lr_scale = 1.0;
  /// The group's weight decay; unset: the optimizer's own.
  std::optional<double> weight_decay;
};

/// A model's parameters in two groups, as GPT training splits them: group 0 decays with weight_decay
/// (matrices, filters, recurrent weights), group 1 not at all (biases and normalisation scales and
/// shifts, i.e. every parameter of fewer than two dimensions, and the tables of nn::Embedding layers).
/// Either may be empty; the order within each is the model's.
std::vector<ParamGroup> decay_groups(const nn::Module& model, double weight_decay);

/// Base of every optimizer. step() runs without recording autograd and skips parameters that
/// have no gradient.
class Optimizer {
 public:
  /// One group of all the parameters, with the optimizer's own settings.
  explicit Optimizer(std::vector<Tensor> params, double lr);
  /// The groups' parameters in order (params() lists them so), each with its group's settings.
  Optimizer(std::vector<ParamGroup> groups, double lr);
  virtual ~Optimizer() = default;
  /// Applies each parameter's gradient.
  virtual void step() = 0;
  /// Zeroes the gradients (or drops them, leaving them undefined, with set_to_none).
  void zero_grad(bool set_to_none = false);
  const std::vector<Tensor>& params() const { return params_; }
  /// The learning rate of the next step (before its group's factor).
  double lr() const { return lr_; }
  /// Sets the learning rate; a schedule (set_schedule) sets it again at every step.
  void set_lr(double lr);

  /// A group's settings.
  struct GroupSettings {
    double lr_scale = 1.0;
    std::optional<double> weight_decay;  // unset: the optimizer's own
  };
  /// Regroups the optimizer's own parameters (params() keeps its order, and every parameter its state):
  /// the groups given become groups 0, 1, ...; a parameter may be in one of them at most, and those in
  /// none form one more group with the optimizer's settings. Throws naming a tensor that is not one of
  /// the parameters, or one listed twice.
  void set_param_groups(const std::vector<ParamGroup>& groups);
  const std::vector<GroupSettings>& groups() const { return groups_; }
  /// For each parameter, the index of its group.
  const std::vector<int>& group_of() const { return group_of_; }
  void set_group_settings(size_t group, const GroupSettings& s);
  /// Makes every later step take its learning rate from the schedule, at the number of steps taken
  /// before it (so a checkpoint's step count restores the rate); null: the rate stays as set.
  void set_schedule(std::shared_ptr<const LrSchedule> schedule);
  const std::shared_ptr<const LrSchedule>& schedule() const { return schedule_; }

  /// One kind of per-parameter state ("momentum", "exp_avg", ...): entry i belongs to params()[i]
  /// and stays undefined until that parameter's first step.
  struct StateList {
    std::string kind;
    std::vector<Tensor>* tensors;
  };
  /// The optimizer's per-parameter state, for checkpoints.
  virtual std::vector<StateList> state_lists() { return {}; }
  /// How many tensors of its parameter's size and dtype the optimizer keeps per parameter once that
  /// parameter has stepped (Adam 2, SGD with momentum 1, without 0): its state's size before it exists.
  virtual int state_copies() const { return 0; }
  /// An optimizer of the same kind and settings, with fresh state, over other parameters in as many
  /// groups as this one has (group g taking this optimizer's group g's settings). The distributed
  /// optimizer steps one over the slices of the parameters a rank owns (ZeRO); every update rule
  /// here is element-wise, so a slice steps exactly as it would within its whole parameter. Throws
  /// for optimizers that cannot be cut so.
  virtual std::shared_ptr<Optimizer> with_params(std::vector<ParamGroup> groups) const;
  /// Per-parameter step counts where the update depends on them (Adam's bias correction), else null.
  virtual std::vector<int64_t>* step_counts() { return nullptr; }
  /// From now on, a step changes nothing when `verdict` (one f32 value on the parameters' device)
  /// is not finite at the time the step runs: the skip of a step whose gradients overflowed, decided
  /// where the verdict is (on the device, where the optimizer's kernels can read it, so that such a
  /// step can be recorded). An undefined tensor removes the guard.
  void set_step_guard(Tensor verdict);
  const Tensor& step_guard() const { return guard_; }
  /// Whether step() can multiply the gradients by a factor as it reads them (set_gradient_factor): Adam's
  /// fused step does; the others need the gradients scaled beforehand.
  virtual bool takes_gradient_factor() const { return false; }
  /// From now on (until called with an undefined tensor), every gradient a step reads is multiplied by
  /// `factor`, one f32 value on the parameters' device read when the step runs (a clipping coefficient
  /// computed there): the update is the one scaling the gradients first gives, bit for bit, without the
  /// pass over them. Throws for an optimizer that does not take one (takes_gradient_factor).
  void set_gradient_factor(Tensor factor);
  const Tensor& gradient_factor() const { return grad_factor_; }
  /// One step() with `factor` as its gradient factor, cleared again after it (also when it throws); an
  /// undefined factor: a plain step().
  void step_with_gradient_factor(const Tensor& factor);
  /// Whether step() can keep 16-bit copies of the parameters up to date (set_parameter_copies): SGD's and
  /// Adam's do.
  virtual bool keeps_parameter_copies() const { return false; }
  /// copies[i]: undefined, or a contiguous bf16 or f16 tensor of params()[i]'s shape that every later step
  /// writes with the parameter it updates, rounded to nearest as Tensor::to rounds — a copy that starts as
  /// the parameter's rounding stays so, and the 16-bit products read it instead of converting the
  /// parameter at every step. An empty list stops the writing. Throws for an optimizer that does not keep
  /// copies, a list of another length, or a copy of another size.
  void set_parameter_copies(std::vector<Tensor> copies);
  const std::vector<Tensor>& parameter_copies() const { return copies_; }
  /// Mixed-precision master weights: from now on every parameter holds a bf16 or f16 value (rounded to
  /// nearest now, kept in its own f32 storage), and the optimizer keeps an f32 master copy of it, made from
  /// the parameter at its first step: a step updates the master with the parameter's gradient, then writes
  /// the master's rounding into the parameter. The master is optimizer state ("master" in state lists and
  /// checkpoints; sharded with the rest under DistOpt's --shard). f32 stops keeping masters (they are dropped;
  /// the parameters keep their values). Throws for another dtype or a parameter that is not f32.
  void keep_master_weights(DType dtype);
  /// The parameters' precision under master weights (bf16 or f16); f32 when masters are not kept.
  DType master_weights() const { return master_dtype_; }
  /// state_lists() and, while master weights are kept, the masters ("master").
  std::vector<StateList> all_state_lists();
  /// Why the next step could not be recorded for its master weights (a parameter with a gradient whose master
  /// the step would make: a recorded copy would make it again at every replay); empty when it can.
  std::string master_weights_blocker() const;
  /// Steps taken so far (steps skipped by the guard included).
  int64_t steps() const { return steps_; }
  /// Sets the step count (a checkpoint's); with a schedule, the learning rate follows.
  void set_steps(int64_t n);
  /// Why the next step could not be recorded once and replayed as a DeviceGraph (its arguments
  /// would change between replays); empty when it can.
  virtual std::string replay_blocker() const { return "this optimizer's steps are not recorded"; }
  /// The host-side bookkeeping of a step whose device work a replay did.
  virtual void count_replayed_step();
  /// Whether a recorded step reads its learning rate (and any other factor that changes from step to
  /// step) from the device, written there by after_recording and prepare_replay: a replay then follows
  /// a schedule. False: a replay repeats the recorded learning rate.
  virtual bool replays_follow_the_rate() const { return false; }
  /// Writes, on the device, the factors of the step just recorded (about to be replayed for the first time).
  virtual void after_recording() {}
  /// Writes, on the device, the factors of the next step, which a replay is about to run.
  virtual void prepare_replay() {}

 protected:
  /// Whether the guard, read on the host (a wait for the device), lets this step run.
  bool guard_allows() const;
  /// The learning rate the step about to run uses (the schedule's, when one is set); call first in step().
  void begin_step();
  /// Counts the step (and moves a scheduled learning rate on); call last in step().
  void end_step();
  /// The learning rate of group g.
  double group_lr(size_t g) const { return lr_ * groups_[g].lr_scale; }
  /// The weight decay of group g: its own, or `fallback` (the optimizer's option).
  double group_decay(size_t g, double fallback) const { return groups_[g].weight_decay.value_or(fallback); }

  std::vector<Tensor> params_;
  double lr_;
  int64_t steps_ = 0;
  Tensor guard_;
  Tensor grad_factor_;          // set_gradient_factor
  std::vector<Tensor> copies_;  // set_parameter_copies
  DType master_dtype_ = DType::f32;  // keep_master_weights
  std::vector<Tensor> masters_;      // per parameter; undefined until its first step
  struct Binding;
  std::vector<std::shared_ptr<Binding>> swapped_;  // the parameters' own storage while a step writes the masters
  void restore_params(bool round);
  std::vector<GroupSettings> groups_;
  std::vector<int> group_of_;
  std::shared_ptr<const LrSchedule> schedule_;
};

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// Stochastic gradient descent with momentum, dampening, weight decay and Nesterov (PyTorch's rule).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SgdOptions& opt);
  SGD(std::vector<ParamGroup> groups, const SgdOptions& opt);
  void step() override;
  std::vector<StateList> state_lists() override { return {{"momentum", &momentum_}}; }
  int state_copies() const override { return opt_.momentum != 0.0 ? 1 : 0; }
  std::shared_ptr<Optimizer> with_params(std::vector<ParamGroup> groups) const override;
  bool keeps_parameter_copies() const override { return true; }
  const SgdOptions& options() const { return opt_; }
  /// Empty once every momentum buffer exists (the first step initialises them differently).
  std::string replay_blocker() const override;

 private:
  void check_options() const;
  SgdOptions opt_;
  std::vector<Tensor> momentum_;  // per parameter; undefined until its first step
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;  // AdamW
};

/// Adam (or AdamW with decoupled weight decay), with bias correction.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& opt);
  Adam(std::vector<ParamGroup> groups, const AdamOptions& opt);
  void step() override;
  std::vector<StateList> state_lists() override { return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}}; }
  int state_copies() const override { return 2; }
  std::shared_ptr<Optimizer> with_params(std::vector<ParamGroup> groups) const override;
  std::vector<int64_t>* step_counts() override { return &t_; }
  bool takes_gradient_factor() const override { return true; }
  bool keeps_parameter_copies() const override { return true; }
  /// Empty once every parameter has its state and all have taken the same number of steps, without a
  /// step guard (read on the host): a recorded step then reads its rate and bias corrections from the
  /// device.
  std::string replay_blocker() const override;
  void count_replayed_step() override;
  bool replays_follow_the_rate() const override { return true; }
  void after_recording() override;
  void prepare_replay() override;

 private:
  void check_options() const;
  /// The device factors of every group at step count t with the base rate lr, into host_scalars_.
  void fill_scalars(int64_t t, double lr);
  void upload_scalars();
  AdamOptions opt_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> t_;  // per-parameter step count
  // A recorded step's factors (AdamArgs::step_scalars), three per group, on the parameters' device.
  Tensor dev_scalars_;
  std::vector<float> host_scalars_;
};

struct RmsPropOptions {
  double lr = 0.01;
  double alpha = 0.99;  // SINGA's rho: the weight the running average of squares keeps
  double eps = 1e-8;
  double weight_decay = 0.0;
  /// false: p -= lr g / (sqrt(v) + eps) (PyTorch's); true: p -= lr g / sqrt(v + eps) (SINGA's).
  bool eps_inside_sqrt = false;
};

/// RMSProp: v = alpha v + (1 - alpha) g^2 (v from zeros), g with L2 weight decay added.
class RMSProp : public Optimizer {
 public:
  RMSProp(std::vector<Tensor> params, const RmsPropOptions& opt);
  RMSProp(std::vector<ParamGroup> groups, const RmsPropOptions& opt);
  void step() override;
  std::vector<StateList> state_lists() override { return {{"square_avg", &v_}}; }
  int state_copies() const override { return 1; }
  std::shared_ptr<Optimizer> with_params(std::vector<ParamGroup> groups) const override;
  const RmsPropOptions& options() const { return opt_; }
  /// Empty once every running average exists (the first step creates them).
  std::string replay_blocker() const override;

 private:
  void check_options() const;
  RmsPropOptions opt_;
  std::vector<Tensor> v_;
};

struct AdagradOptions {
  double lr = 0.01;
  double lr_decay = 0.0;  // step t (from 1) uses lr / (1 + (t - 1) lr_decay)
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  /// false: p -= lr g / (sqrt(s) + eps) (PyTorch's); true: p -= lr g / sqrt(s + eps) (SINGA's).
  bool eps_inside_sqrt = false;
};

/// AdaGrad: s += g^2 (s from initial_accumulator_value), g with L2 weight decay added.
class AdaGrad : public Optimizer {
 public:
  AdaGrad(std::vector<Tensor> params, const AdagradOptions& opt);
  AdaGrad(std::vector<ParamGroup> groups, const AdagradOptions& opt);
  void step() override;
  std::vector<StateList> state_lists() override { return {{"sum", &s_}}; }
  int state_copies() const override { return 1; }
  std::shared_ptr<Optimizer> with_params(std::vector<ParamGroup> groups) const override;
  std::vector<int64_t>* step_counts() override { return &t_; }
  const AdagradOptions& options() const { return opt_; }
  /// Empty once every sum exists and the learning rate does not decay with a host-side step count.
  std::string replay_blocker() const override;

 private:
  void check_options() const;
  AdagradOptions opt_;
  std::vector<Tensor> s_;
  std::vector<int64_t> t_;  // per-parameter step count
};

}  // namespace tandem::optim
