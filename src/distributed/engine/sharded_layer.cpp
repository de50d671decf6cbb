// ShardedLayer: the wrapped layer's forward between a gather and a release of its group, and two
// identity ops that do the same in backward. The op on the layer's output runs first in backward
// (it was recorded last): it gathers the group again, and starts the previous group's gather. The op
// on the input was recorded before every op of the layer, so backward reaches it only once all of
// them have run (backward takes ops in reverse order of recording): it frees the group.
#include "tandem/distributed/sharded_layer.h"

#include "core/tensor_impl.h"
#include "tandem/autograd.h"

namespace tandem::dist {

namespace {

// Another handle on x's data, so that an op can be recorded for it.
Tensor alias(const Tensor& x) { return as_strided(x, x.shape(), x.strides(), x.storage_offset()); }

}  // namespace

ShardedLayer::ShardedLayer(nn::ModulePtr layer) : layer_(std::move(layer)) {
  TANDEM_CHECK(layer_ != nullptr, "ShardedLayer needs a layer");
  for (auto& [name, t] : layer_->named_parameters()) register_parameter(name, t);
  for (auto& [name, t] : layer_->named_buffers()) register_buffer(name, t);
}

void ShardedLayer::attach(const std::shared_ptr<detail::LayerGatherer>& gatherer, int group) {
  gatherer_ = gatherer;
  group_ = group;
}

Tensor ShardedLayer::forward(const Tensor& x) {
  std::shared_ptr<detail::LayerGatherer> g = gatherer_.lock();
  if (!g) return layer_->forward(x);
  std::weak_ptr<detail::LayerGatherer> weak = gatherer_;
  const int group = group_;
  g->gather(group, group + 1);
  Tensor in = x;
  if (grad_enabled() && x.requires_grad())
    in = record_op(alias(x), {x}, "sharded_layer_release", [weak, group](const Tensor& dy) {
      if (auto gatherer = weak.lock()) gatherer->release(group);
      return std::vector<Tensor>{dy};
    });
  Tensor out = layer_->forward(in);
  g->release(group);
  if (grad_enabled() && out.requires_grad())
    out = record_op(alias(out), {out}, "sharded_layer_gather", [weak, group](const Tensor& dy) {
      if (auto gatherer = weak.lock()) gatherer->gather(group, group - 1);
      return std::vector<Tensor>{dy};
    });
  return out;
}

std::string ShardedLayer::describe() const { return "ShardedLayer(" + layer_->describe() + ")"; }

void ShardedLayer::on_train(bool on) { layer_->train(on); }

nn::NamedGenerators ShardedLayer::own_generators() { return layer_->named_generators(); }

}  // namespace tandem::dist
