// LayerGroup: a part of the forward between a gather and a release of its parameters, and two identity ops
// that do the same in backward. The op on the output runs first in backward (it was recorded last): it
// gathers the group again and starts the previous group's gather. The op on the input was recorded before
// every op of the part, so backward reaches it only once all of them have run: it frees the group.
#include "tandem/nn/layer_group.h"

#include "core/tensor_impl.h"
#include "tandem/autograd.h"

namespace tandem::nn {

namespace {

// Another handle on x's data, so that an op can be recorded for it.
Tensor alias(const Tensor& x) { return as_strided(x, x.shape(), x.strides(), x.storage_offset()); }

}  // namespace

void LayerGroup::attach(const std::shared_ptr<LayerGatherer>& gatherer, int index) {
  gatherer_ = gatherer;
  index_ = index;
}

Tensor LayerGroup::run(const Tensor& x, const std::function<Tensor(const Tensor&)>& body) {
  if (gatherer_.expired()) return body(x);
  auto one = [&body](const std::vector<Tensor>& in) { return std::vector<Tensor>{body(in[0])}; };
  return run(std::vector<Tensor>{x}, one).front();
}

std::vector<Tensor> LayerGroup::run(const std::vector<Tensor>& xs,
                                    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body) {
  std::shared_ptr<LayerGatherer> g = gatherer_.lock();
  if (!g) return body(xs);
  std::weak_ptr<LayerGatherer> weak = gatherer_;
  const int group = index_;
  g->gather(group, group + 1);
  std::vector<Tensor> in = xs;
  for (Tensor& x : in)
    if (grad_enabled() && x.defined() && x.requires_grad())
      x = record_op(alias(x), {x}, "layer_group_release", [weak, group](const Tensor& dy) {
        if (auto gatherer = weak.lock()) gatherer->release(group);
        return std::vector<Tensor>{dy};
      });
  std::vector<Tensor> out;
  try {
    out = body(in);
  } catch (...) {
    g->release(group);
    throw;
  }
  g->release(group);
  for (Tensor& y : out)
    if (grad_enabled() && y.defined() && y.requires_grad())
      y = record_op(alias(y), {y}, "layer_group_gather", [weak, group](const Tensor& dy) {
        if (auto gatherer = weak.lock()) gatherer->gather(group, group - 1);
        return std::vector<Tensor>{dy};
      });
  return out;
}

}  // namespace tandem::nn
