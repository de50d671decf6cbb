// Layers (the C++ modules the Python layers are made of), ready-made models, optimizers, checkpoints.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "binding.h"
#include "tandem/checkpoint.h"
#include "tandem/nn/layer_group.h"
#include "tandem/nn/layers.h"
#include "tandem/nn/models.h"
#include "tandem/nn/module.h"
#include "tandem/optim/optimizer.h"

namespace tandem::py {

namespace {

// A module whose parameters, buffers and children are registered from Python: it gives a model
// written in Python the named, ordered parameter list that DistOpt and checkpoints work with, and the
// layer groups (its layers, in the order its forward calls them) that DistOpt's --shard parameters finds.
class ParamModule : public nn::Module, public nn::LayerGroups {
 public:
  std::vector<nn::LayerGroup*> layer_groups() override {
    std::vector<nn::LayerGroup*> out;
    for (const auto& g : groups_) out.push_back(g.get());
    return out;
  }
  void set_layer_groups(std::vector<std::shared_ptr<nn::LayerGroup>> groups) {
    for (const auto& g : groups) TANDEM_CHECK(g != nullptr, "set_layer_groups: a group is None");
    groups_ = std::move(groups);
  }
  const std::vector<std::shared_ptr<nn::LayerGroup>>& groups() const { return groups_; }

  Tensor forward(const Tensor&) override {
    TANDEM_CHECK(false, "this module only collects the parameters of a Python model: call the Python model instead");
  }
  std::string describe() const override { return "ParamModule"; }
  // A tensor keeps its requires_grad: a parameter frozen from Python stays frozen each time a layer's
  // parameters are listed again (register_parameter makes a parameter trainable).
  Tensor add_parameter(const std::string& name, const Tensor& t) {
    const bool trained = t.requires_grad();
    Tensor p = register_parameter(name, t);
    if (!trained) p.requires_grad_(false);
    return p;
  }
  Tensor add_buffer(const std::string& name, const Tensor& t) { return register_buffer(name, t); }
  void add_module(const std::string& name, nn::ModulePtr m) {
    TANDEM_CHECK(m != nullptr, "add_module: module '", name, "' is None");
    register_module(name, std::move(m));
  }

 private:
  std::vector<std::shared_ptr<nn::LayerGroup>> groups_;
};

// The tensors a Python body returned (a list of tensors) as the C++ side takes them.
std::vector<Tensor> body_outputs(const nb::handle& result) {
  if (!nb::isinstance<nb::list>(result) && !nb::isinstance<nb::tuple>(result))
    throw nb::type_error("LayerGroup.run: the body must return a list of tensors");
  std::vector<Tensor> out;
  for (nb::handle h : result) {
    if (!nb::isinstance<Tensor>(h)) throw nb::type_error("LayerGroup.run: the body must return a list of tensors");
    out.push_back(nb::cast<Tensor>(h));
  }
  return out;
}

// SINGA's Optimizer.apply(name, param, grad): one parameter's step with a gradient given for it. The
// other parameters' gradients are set aside meanwhile, so that the step touches that parameter alone.
void step_param(optim::Optimizer& opt, size_t index, const Tensor& grad) {
  const std::vector<Tensor>& params = opt.params();
  TANDEM_CHECK(index < params.size(), "step_param: parameter ", index, " of ", params.size());
  Tensor param = params[index];
  TANDEM_CHECK(grad.defined() && grad.shape() == param.shape() && grad.dtype() == param.dtype() &&
                   grad.device() == param.device(),
               "the gradient ", grad.defined() ? grad.str() : std::string("None"), " does not match its parameter ",
               param.str(), " in shape, dtype or device");
  std::vector<Tensor> saved;
  for (const Tensor& p : params) {
    saved.push_back(p.grad());
    Tensor(p).set_grad(Tensor());
  }
  param.set_grad(grad);
  try {
    opt.step();
  } catch (...) {
    for (size_t i = 0; i < params.size(); ++i) Tensor(params[i]).set_grad(i == index ? Tensor() : saved[i]);
    throw;
  }
  for (size_t i = 0; i < params.size(); ++i) Tensor(params[i]).set_grad(i == index ? Tensor() : saved[i]);
}

// A missing checkpoint is an OSError (FileNotFoundError), as Python's own file functions raise.
void require_file(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    PyErr_Format(PyExc_FileNotFoundError, "checkpoint '%s' does not exist", path.c_str());
    throw nb::python_error();
  }
}

}  // namespace

void bind_nn(nb::module_& m) {
  nb::class_<nn::Module>(m, "Module", "A layer or model owning named parameters and buffers in a fixed order.")
      .def("forward", &nn::Module::forward, nb::arg("x"), release_gil())
      .def("__call__", &nn::Module::forward, nb::arg("x"), release_gil())
      .def("named_parameters", &nn::Module::named_parameters)
      .def("named_buffers", &nn::Module::named_buffers)
      .def("parameters", &nn::Module::parameters)
      .def("num_parameters", &nn::Module::num_parameters)
      .def("train", &nn::Module::train, nb::arg("on") = true)
      .def("eval", &nn::Module::eval)
      .def_prop_ro("training", &nn::Module::is_training)
      .def("to", [](nn::Module& mod, nb::handle d) {
        Device device = to_device(d);
        nb::gil_scoped_release unlocked;
        mod.to(device);
      }, nb::arg("device"), "Moves parameters and buffers in place: existing handles follow.")
      .def_prop_ro("device", [](const nn::Module& mod) { return device_object(mod.device()); })
      .def("describe", &nn::Module::describe);

  nb::class_<ParamModule, nn::Module>(m, "ParamModule", "Parameters, buffers and children registered by name from Python.")
      .def(nb::init<>())
      .def("add_parameter", &ParamModule::add_parameter, nb::arg("name"), nb::arg("tensor"),
           "Registers a parameter; it keeps its requires_grad (False: frozen, left out of the optimizer).")
      .def("add_buffer", &ParamModule::add_buffer, nb::arg("name"), nb::arg("tensor"))
      .def("add_module", &ParamModule::add_module, nb::arg("name"), nb::arg("module"))
      .def("set_layer_groups", &ParamModule::set_layer_groups, nb::arg("groups"),
           "The layer groups DistOpt's --shard parameters finds in this module, in the order forward runs them.")
      .def("layer_groups", &ParamModule::groups);

  nb::class_<nn::LayerGroup>(m, "LayerGroup",
                             "A part of a model's forward and the parameters it uses: under DistOpt's --shard "
                             "parameters they are gathered whole just for its forward and backward.")
      .def(nb::init<std::string, std::vector<Tensor>>(), nb::arg("name"), nb::arg("params"))
      .def_prop_ro("name", &nn::LayerGroup::name)
      .def_prop_ro("params", &nn::LayerGroup::params)
      .def_prop_ro("attached", &nn::LayerGroup::attached,
                   "True once a DistOpt of sharded parameters took the group (its sync_parameters).")
      .def_prop_ro("index", &nn::LayerGroup::index, "The group's number in forward order (-1 until attached).")
      .def(
          "run",
          [](nn::LayerGroup& g, const std::vector<Tensor>& inputs, nb::callable body) {
            // The body calls back into Python: it takes the GIL for that, which is let go meanwhile (the gathers
            // wait for the other ranks).
            PyObject* fn = body.ptr();
            auto call = [fn](const std::vector<Tensor>& in) {
              nb::gil_scoped_acquire locked;
              nb::object result = nb::borrow<nb::callable>(fn)(nb::cast(in));
              return body_outputs(result);
            };
            nb::gil_scoped_release unlocked;
            return g.run(inputs, call);
          },
          nb::arg("inputs"), nb::arg("body"),
          "body(inputs) (a list of tensors to a list of tensors) as the group's forward: with a DistOpt of sharded "
          "parameters attached, the group is gathered for it and released after, and again in backward (the op "
          "that releases it recorded on the inputs that need gradients, the one that gathers it on the outputs).");

  nb::class_<nn::Conv2d, nn::Module>(m, "Conv2d")
      .def(nb::init<int64_t, int64_t, int, Generator&, int, int, bool, bool, int>(), nb::arg("in_channels"),
           nb::arg("out_channels"), nb::arg("kernel"), nb::arg("generator"), nb::arg("stride") = 1,
           nb::arg("padding") = 0, nb::arg("bias") = true, nb::arg("relu") = false, nb::arg("groups") = 1,
           "relu fuses max(., 0) into the output; groups splits the channels (groups == in_channels: depthwise).")
      .def_prop_ro("weight", [](const nn::Conv2d& c) { return c.weight; })
      .def_prop_ro("bias", [](const nn::Conv2d& c) { return c.bias.defined() ? nb::cast(c.bias) : nb::none(); });
  nb::class_<nn::Linear, nn::Module>(m, "Linear")
      .def(nb::init<int64_t, int64_t, Generator&, bool, bool>(), nb::arg("in_features"), nb::arg("out_features"),
           nb::arg("generator"), nb::arg("bias") = true, nb::arg("relu") = false,
           "relu fuses max(., 0) into the output.")
      .def_prop_ro("weight", [](const nn::Linear& l) { return l.weight; })
      .def_prop_ro("bias", [](const nn::Linear& l) { return l.bias.defined() ? nb::cast(l.bias) : nb::none(); });
  nb::class_<nn::BatchNorm2d, nn::Module>(m, "BatchNorm2d")
      .def(nb::init<int64_t, double, double>(), nb::arg("channels"), nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5,
           "running = (1 - momentum) * running + momentum * batch.")
      .def(
          "forward_act",
          [](nn::BatchNorm2d& b, const Tensor& x, const std::optional<Tensor>& residual, bool relu) {
            return b.forward_act(x, residual.value_or(Tensor()), relu);
          },
          nb::arg("x"), nb::arg("residual").none() = nb::none(), nb::arg("relu") = false, release_gil(),
          "max(bn(x) + residual, 0) with relu, bn(x) + residual without, in one pass.")
      .def_prop_ro("gamma", [](const nn::BatchNorm2d& b) { return b.gamma; })
      .def_prop_ro("beta", [](const nn::BatchNorm2d& b) { return b.beta; })
      .def_prop_ro("running_mean", [](const nn::BatchNorm2d& b) { return b.running_mean; })
      .def_prop_ro("running_var", [](const nn::BatchNorm2d& b) { return b.running_var; });
  nb::class_<nn::Dropout, nn::Module>(m, "Dropout")
      .def(nb::init<double, uint64_t>(), nb::arg("p"), nb::arg("seed") = 0);

  m.def(
      "make_model",
      [](const std::string& name, int64_t in_channels, int64_t height, int64_t width, int64_t num_classes,
         std::vector<int64_t> hidden, uint64_t seed) {
        return nn::make_model(name, nn::ModelConfig{in_channels, height, width, num_classes, std::move(hidden), seed, {}});
      },
      nb::arg("name"), nb::arg("in_channels") = 1, nb::arg("height") = 28, nb::arg("width") = 28,
      nb::arg("num_classes") = 10, nb::arg("hidden") = std::vector<int64_t>{}, nb::arg("seed") = 0,
      "One of the C++ models of `tandem train --model` (cnn, mlp, resnet18 ... resnet152).");
  m.def("model_names", &nn::model_names);
  // Bound here for layer.Cat; the op itself is tandem::cat (tandem/ops.h).
  m.def("cat", &tandem::cat, nb::arg("tensors"), nb::arg("dim") = 0, release_gil(),
        "The tensors joined along dimension dim (negative: from the end); the other extents must agree.");

  nb::class_<optim::Optimizer>(m, "Optimizer", "Applies accumulated gradients to parameters.")
      .def("step", &optim::Optimizer::step, release_gil())
      .def("zero_grad", &optim::Optimizer::zero_grad, nb::arg("set_to_none") = false, release_gil())
      .def_prop_rw("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_prop_ro("steps", &optim::Optimizer::steps)
      .def("params", &optim::Optimizer::params)
      .def("replay_blocker", &optim::Optimizer::replay_blocker,
           "Why its steps could not be recorded once and replayed; empty when they can.")
      .def("step_param", &step_param, nb::arg("index"), nb::arg("grad"), release_gil(),
           "Steps parameter `index` alone with `grad` (the others' gradients are left as they were); its own "
           "gradient is cleared afterwards.");
  nb::class_<optim::SGD, optim::Optimizer>(m, "SGD")
      .def(
          "__init__",
          [](optim::SGD* self, std::vector<Tensor> params, double lr, double momentum, double dampening,
             double weight_decay, bool nesterov) {
            new (self) optim::SGD(std::move(params), optim::SgdOptions{lr, momentum, dampening, weight_decay, nesterov});
          },
          nb::arg("params"), nb::arg("lr") = 0.01, nb::arg("momentum") = 0.0, nb::arg("dampening") = 0.0,
          nb::arg("weight_decay") = 0.0, nb::arg("nesterov") = false);
  nb::class_<optim::Adam, optim::Optimizer>(m, "Adam")
      .def(
          "__init__",
          [](optim::Adam* self, std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay, bool decoupled) {
            new (self) optim::Adam(std::move(params), optim::AdamOptions{lr, beta1, beta2, eps, weight_decay, decoupled});
          },
          nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("beta1") = 0.9, nb::arg("beta2") = 0.999,
          nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 0.0, nb::arg("decoupled") = false);

  m.def(
      "save_checkpoint",
      [](const std::string& path, const nn::Module& model, optim::Optimizer* opt, const std::string& meta) {
        save_checkpoint(path, model, opt, meta);
      },
      nb::arg("path"), nb::arg("model"), nb::arg("optimizer").none() = nb::none(), nb::arg("meta_json") = "{}",
      release_gil(), "Writes parameters, buffers and optimizer state atomically.");
  m.def(
      "load_checkpoint",
      [](const std::string& path, nn::Module& model, optim::Optimizer* opt) {
        require_file(path);
        nb::gil_scoped_release unlocked;
        return load_checkpoint(path, model, opt);
      },
      nb::arg("path"), nb::arg("model"), nb::arg("optimizer").none() = nb::none(),
      "Loads what save_checkpoint wrote; returns its meta JSON.");
  m.def(
      "checkpoint_meta",
      [](const std::string& path) {
        require_file(path);
        return checkpoint_meta(path);
      },
      nb::arg("path"));
}

}  // namespace tandem::py
