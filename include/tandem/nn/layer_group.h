#pragma once
// Layer groups: the parts of a model's forward (a transformer block, a ResNet block, the embeddings, the
// head) with the parameters each part uses. Under DistOpt's --shard parameters (ZeRO stage 3) a group's
// parameters are kept sharded across the ranks between uses and gathered whole just for the group's
// forward and backward. A parameter may belong to several groups (a token table that is also the output
// layer): it is gathered for each and freed once none holds it.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tensor.h"

namespace tandem::nn {

/// What gathers a layer group's parameters and frees them again (the distributed optimizer's).
class LayerGatherer {
 public:
  virtual ~LayerGatherer() = default;
  /// Makes group `group`'s parameters whole (waiting for their all-gathers), and starts the
  /// all-gathers of group `next` (when it is one) so that they are ready by its turn.
  virtual void gather(int group, int next) = 0;
  /// Frees group `group`'s whole parameters (those no other group holds now): only this rank's blocks stay.
  virtual void release(int group) = 0;
};

/// One layer group: a name, the parameters its part of the forward uses, and (once a DistOpt of
/// sharded parameters attached one) the gatherer that makes them whole for it.
class LayerGroup {
 public:
  LayerGroup() = default;
  LayerGroup(std::string name, std::vector<Tensor> params) : name_(std::move(name)), params_(std::move(params)) {}

  /// body(x) as the group's forward. With a gatherer attached: the group is gathered before body (the next
  /// group's gather started meanwhile) and released after it; in backward, the op recorded on the output
  /// gathers it again (and starts the previous group's), the op recorded on the input releases it once
  /// backward has passed every op of body. Without one: body(x).
  Tensor run(const Tensor& x, const std::function<Tensor(const Tensor&)>& body);
  /// run() for a part of several inputs and outputs (a layer written in Python, say): body(xs) as the group's
  /// forward, the op that releases the group in backward recorded on every input that needs a gradient and
  /// the op that gathers it on every output that has one. Backward runs an op recorded later first among
  /// those it can run, so the first of the releasing ops runs only once backward has passed every op of body
  /// (the others find the group released). A body that throws leaves the group released.
  std::vector<Tensor> run(const std::vector<Tensor>& xs,
                          const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body);
  /// Called by DistOpt::sync_parameters: the gatherer, and this group's number (groups count in the order
  /// forward runs them).
  void attach(const std::shared_ptr<LayerGatherer>& gatherer, int index);
  /// Whether a gatherer is attached (and still there): run() then gathers the group.
  bool attached() const { return !gatherer_.expired(); }
  /// The group's number among the model's groups (-1 until attached).
  int index() const { return index_; }
  const std::string& name() const { return name_; }
  const std::vector<Tensor>& params() const { return params_; }
  void set_params(std::vector<Tensor> params) { params_ = std::move(params); }

 private:
  std::string name_;
  std::vector<Tensor> params_;
  std::weak_ptr<LayerGatherer> gatherer_;
  int index_ = -1;
};

/// A model (or layer) made of layer groups: lists them in the order its forward runs them. DistOpt with
/// --shard parameters finds these in a model (its own module or any descendant), attaches its gatherer to
/// each, and shards every parameter of the optimizer along them; a parameter in no group is refused by
/// name.
class LayerGroups {
 public:
  virtual ~LayerGroups() = default;
  virtual std::vector<LayerGroup*> layer_groups() = 0;
};

}  // namespace tandem::nn
