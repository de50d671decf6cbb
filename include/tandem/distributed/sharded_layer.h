#pragma once
// A layer group of sharded parameters (ZeRO stage 3: DistOptOptions::shard = Shard::parameters).
#include <memory>
#include <string>

#include "tandem/nn/module.h"

namespace tandem::dist {

namespace detail {
/// What gathers a layer group's parameters and frees them again (the distributed optimizer's).
class LayerGatherer {
 public:
  virtual ~LayerGatherer() = default;
  /// Makes group `group`'s parameters whole (waiting for their all-gathers), and starts the
  /// all-gathers of group `next` (when it is one) so that they are ready by its turn.
  virtual void gather(int group, int next) = 0;
  /// Frees group `group`'s whole parameters: only this rank's blocks stay.
  virtual void release(int group) = 0;
};
}  // namespace detail

/// Wraps a layer (or a block of layers) into one layer group. Under Shard::parameters its parameters
/// live sharded across the ranks between uses: they are gathered whole just before its forward, freed
/// after it, gathered again when backward reaches the layer and freed once backward has passed it,
/// the next group's gather started meanwhile. The wrapper's parameters and buffers are the layer's,
/// under the layer's names, so a wrapped model's checkpoints are those of the unwrapped one. Until a
/// DistOpt with Shard::parameters takes it over (its sync_parameters), it is the layer itself. Under
/// Shard::optimizer and gradients with DistOptOptions::overlap_gather, its parameters stay whole and its
/// forward first waits for their all-gather from the last step, which the forwards before it overlapped.
/// A parameter belongs to one group: layers that share one (tied weights) go into one wrapper; batch
/// norm is converted to sync batch norm before wrapping.
class ShardedLayer : public nn::Module {
 public:
  explicit ShardedLayer(nn::ModulePtr layer);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  nn::Module& layer() { return *layer_; }
  /// Called by DistOpt::sync_parameters: the gatherer of this group, and the group's number (groups
  /// count in the order the model registers them, which is the order forward runs them).
  void attach(const std::shared_ptr<detail::LayerGatherer>& gatherer, int group);

 protected:
  void on_train(bool on) override;
  nn::NamedGenerators own_generators() override;

 private:
  nn::ModulePtr layer_;
  std::weak_ptr<detail::LayerGatherer> gatherer_;
  int group_ = -1;
};

}  // namespace tandem::dist
