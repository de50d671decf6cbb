#include "tandem/nn/module.h"

#include "core/tensor_impl.h"

namespace tandem::nn {

Tensor Module::register_parameter(std::string name, Tensor t) {
  TANDEM_CHECK(t.defined(), "register_parameter: '", name, "' is undefined");
  t.requires_grad_(true);
  params_.emplace_back(std::move(name), t);
  return t;
}

Tensor Module::register_buffer(std::string name, Tensor t) {
  TANDEM_CHECK(t.defined(), "register_buffer: '", name, "' is undefined");
  buffers_.emplace_back(std::move(name), t);
  return t;
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (const auto& [name, t] : params ? params_ : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

NamedGenerators Module::named_generators() {
  NamedGenerators out;
  std::function<void(Module&, const std::string&)> walk = [&](Module& m, const std::string& prefix) {
    for (auto& [name, g] : m.own_generators()) out.emplace_back(prefix + name, g);
    for (auto& [name, child] : m.children_) walk(*child, prefix + name + ".");
  };
  walk(*this, "");
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& [name, child] : children_) child->apply(fn);
}

void Module::train(bool on) {
  training_ = on;
  on_train(on);
  for (auto& [name, child] : children_) child->train(on);
}

namespace {
// Replaces the tensor's storage with a copy on the device; every handle to it sees the move.
void move_in_place(const Tensor& t, Device device) {
  if (t.device() == device) return;
  rebind_storage(t, t.detach().to(device));
  TensorImpl* impl = t.impl();
  if (impl->grad) impl->grad = Tensor(impl->grad).to(device).impl_ptr();
}
}  // namespace

void Module::to(Device device) {
  check_device(device);
  for (auto& [name, t] : named_parameters()) move_in_place(t, device);
  for (auto& [name, t] : named_buffers()) move_in_place(t, device);
}

Device Module::device() const {
  auto params = named_parameters();
  return params.empty() ? Device::cpu() : params.front().second.device();
}

std::string Module::describe() const {
  std::string out;
  for (const auto& [name, child] : children_) out += name + ": " + child->describe() + "\n";
  return out;
}

}  // namespace tandem::nn
