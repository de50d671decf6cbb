#pragma once
// A layer group of sharded parameters (ZeRO stage 3: DistOptOptions::shard = Shard::parameters).
#include <memory>
#include <string>

#include "tandem/nn/layer_group.h"
#include "tandem/nn/module.h"

namespace tandem::dist {

namespace detail {
using LayerGatherer = nn::LayerGatherer;
}  // namespace detail

/// Wraps a layer (or a block of layers) into one layer group (nn::LayerGroup), for models whose own
/// classes declare none. Under Shard::parameters its parameters live sharded across the ranks between
/// uses: they are gathered whole just before its forward, freed after it, gathered again when backward
/// reaches the layer and freed once backward has passed it, the next group's gather started meanwhile.
/// The wrapper's parameters and buffers are the layer's, under the layer's names, so a wrapped model's
/// checkpoints are those of the unwrapped one. Until a DistOpt with Shard::parameters takes it over (its
/// sync_parameters), it is the layer itself. Under Shard::optimizer and gradients with
/// DistOptOptions::overlap_gather, its parameters stay whole and its forward first waits for their
/// all-gather from the last step, which the forwards before it overlapped. Batch norm is converted to sync
/// batch norm before wrapping.
class ShardedLayer : public nn::Module, public nn::LayerGroups {
 public:
  explicit ShardedLayer(nn::ModulePtr layer);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  nn::Module& layer() { return *layer_; }
  std::vector<nn::LayerGroup*> layer_groups() override { return {&group_}; }
  /// The group's gatherer and number (DistOpt::sync_parameters calls it through the group).
  void attach(const std::shared_ptr<detail::LayerGatherer>& gatherer, int group) { group_.attach(gatherer, group); }

 protected:
  void on_train(bool on) override;
  nn::NamedGenerators own_generators() override;

 private:
  nn::ModulePtr layer_;
  nn::LayerGroup group_;
};

}  // namespace tandem::dist
