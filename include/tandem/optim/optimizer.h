#pragma once
// Optimizers: apply accumulated gradients to parameters.
#include <string>
#include <vector>

#include "tandem/tensor.h"

namespace tandem::optim {

/// Base of every optimizer. step() runs without recording autograd and skips parameters that
/// have no gradient.
class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  /// Applies each parameter's gradient.
  virtual void step() = 0;
  /// Zeroes the gradients (or drops them, leaving them undefined, with set_to_none).
  void zero_grad(bool set_to_none = false);
  const std::vector<Tensor>& params() const { return params_; }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  /// One kind of per-parameter state ("momentum", "exp_avg", ...): entry i belongs to params()[i]
  /// and stays undefined until that parameter's first step.
  struct StateList {
    std::string kind;
    std::vector<Tensor>* tensors;
  };
  /// The optimizer's per-parameter state, for checkpoints.
  virtual std::vector<StateList> state_lists() { return {}; }
  /// Per-parameter step counts where the update depends on them (Adam's bias correction), else null.
  virtual std::vector<int64_t>* step_counts() { return nullptr; }
  /// From now on, a step changes nothing when `verdict` (one f32 value on the parameters' device)
  /// is not finite at the time the step runs: the skip of a step whose gradients overflowed, decided
  /// where the verdict is (on the device, where the optimizer's kernels can read it, so that such a
  /// step can be recorded). An undefined tensor removes the guard.
  void set_step_guard(Tensor verdict);
  const Tensor& step_guard() const { return guard_; }
  /// Steps taken so far (steps skipped by the guard included).
  int64_t steps() const { return steps_; }
  void set_steps(int64_t n) { steps_ = n; }
  /// Why the next step could not be recorded once and replayed as a DeviceGraph (its arguments
  /// would change between replays); empty when it can.
  virtual std::string replay_blocker() const { return "this optimizer's steps are not recorded"; }
  /// The host-side bookkeeping of a step whose device work a replay did.
  virtual void count_replayed_step() { steps_++; }

 protected:
  /// Whether the guard, read on the host (a wait for the device), lets this step run.
  bool guard_allows() const;

  std::vector<Tensor> params_;
  double lr_;
  int64_t steps_ = 0;
  Tensor guard_;
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
  void step() override;
  std::vector<StateList> state_lists() override { return {{"momentum", &momentum_}}; }
  const SgdOptions& options() const { return opt_; }
  /// Empty once every momentum buffer exists (the first step initialises them differently).
  std::string replay_blocker() const override;

 private:
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
  void step() override;
  std::vector<StateList> state_lists() override { return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}}; }
  std::vector<int64_t>* step_counts() override { return &t_; }
  std::string replay_blocker() const override {
    return "adam's bias correction depends on a step count kept on the host (use --optimizer sgd)";
  }

 private:
  AdamOptions opt_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> t_;  // per-parameter step count
};

}  // namespace tandem::optim
