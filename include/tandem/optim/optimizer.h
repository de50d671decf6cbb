#pragma once
// Optimizers: apply accumulated gradients to parameters.
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
  /// Per-parameter state tensors (momentum, Adam moments) for checkpoints and rank synchronisation.
  virtual std::vector<Tensor> state() const { return {}; }
  /// Steps taken so far.
  int64_t steps() const { return steps_; }

 protected:
  std::vector<Tensor> params_;
  double lr_;
  int64_t steps_ = 0;
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
  std::vector<Tensor> state() const override;
  const SgdOptions& options() const { return opt_; }

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
  std::vector<Tensor> state() const override;

 private:
  AdamOptions opt_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> t_;  // per-parameter step count
};

}  // namespace tandem::optim
