#pragma once
// Module: a layer or model owning named parameters and buffers in a deterministic order.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/random.h"
#include "tandem/tensor.h"

namespace tandem::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using NamedGenerators = std::vector<std::pair<std::string, Generator*>>;

/// Base of every layer and model. Parameters and buffers are listed in registration order (children
/// in the order they were registered, depth first), which is identical on every rank: the
/// distributed optimizer relies on it.
class Module {
 public:
  virtual ~Module() = default;
  /// The layer's computation; ops record autograd as they run.
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// Trainable tensors with dotted names ("conv1.weight").
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  /// State that is not trained but must match across ranks (batch-norm running statistics).
  NamedTensors named_buffers() const;
  /// Number of trainable scalars.
  int64_t num_parameters() const;

  /// Calls fn on this module, then on every descendant (depth first, in registration order).
  void apply(const std::function<void(Module&)>& fn);

  /// Switches training behaviour (dropout, batch-norm statistics) for this module and its children.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Moves every parameter and buffer to the device in place: existing handles follow.
  void to(Device device);
  /// The device of the first parameter (CPU for a module without parameters).
  Device device() const;
  /// Short description, one line per layer.
  virtual std::string describe() const;

  /// The floating-point operations one training step spends per token of a sequence of `context`
  /// tokens (forward and backward), for language models that know it (GPT: 6 N + 12 L T d, as
  /// nanoGPT and llm.c count); 0 when the model does not say. Throughput reports derive MFU from it.
  virtual double flops_per_token(int64_t context) const { return 0.0; }

  /// The random generators of this module and its descendants (dropout's) with dotted names
  /// ("drop.rng"), in registration order: a checkpoint keeps their offsets, so that a resumed run
  /// draws the masks the uninterrupted one would have drawn.
  NamedGenerators named_generators();

 protected:
  /// Registers a trainable tensor (marked as requiring a gradient) and returns its handle.
  Tensor register_parameter(std::string name, Tensor t);
  Tensor register_buffer(std::string name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> m) {
    children_.emplace_back(std::move(name), m);
    return m;
  }
  /// Called after train(); layers with mode-dependent state override it.
  virtual void on_train(bool on) {}
  /// The generators this module itself draws from while training (not its children's), by name;
  /// layers that own one override it.
  virtual NamedGenerators own_generators() { return {}; }

 private:
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

using ModulePtr = std::shared_ptr<Module>;

}  // namespace tandem::nn
