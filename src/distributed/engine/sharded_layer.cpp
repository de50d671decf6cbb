// ShardedLayer: the wrapped layer's forward as one layer group.
#include "tandem/distributed/sharded_layer.h"

namespace tandem::dist {

ShardedLayer::ShardedLayer(nn::ModulePtr layer) : layer_(std::move(layer)) {
  TANDEM_CHECK(layer_ != nullptr, "ShardedLayer needs a layer");
  for (auto& [name, t] : layer_->named_parameters()) register_parameter(name, t);
  for (auto& [name, t] : layer_->named_buffers()) register_buffer(name, t);
  group_ = nn::LayerGroup(layer_->describe(), layer_->parameters());
}

Tensor ShardedLayer::forward(const Tensor& x) {
  return group_.run(x, [this](const Tensor& in) { return layer_->forward(in); });
}

std::string ShardedLayer::describe() const { return "ShardedLayer(" + layer_->describe() + ")"; }

void ShardedLayer::on_train(bool on) { layer_->train(on); }

nn::NamedGenerators ShardedLayer::own_generators() { return layer_->named_generators(); }

}  // namespace tandem::dist
