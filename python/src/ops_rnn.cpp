// Embedding, recurrent networks, the RMSProp and AdaGrad optimizers, parameter groups and learning-rate
// schedules.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "binding.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem::py {

namespace {

RnnMode parse_mode(const std::string& s) {
  if (s == "tanh" || s == "rnn_tanh" || s == "vanilla") return RnnMode::RnnTanh;
  if (s == "relu" || s == "rnn_relu") return RnnMode::RnnRelu;
  if (s == "lstm") return RnnMode::Lstm;
  if (s == "gru") return RnnMode::Gru;
  throw nb::value_error(("unknown recurrent mode '" + s + "' (tanh, relu, lstm, gru)").c_str());
}

std::vector<GroupTuple> from_groups(const std::vector<optim::ParamGroup>& groups) {
  std::vector<GroupTuple> out;
  for (const auto& g : groups) out.emplace_back(g.params, g.lr_scale, g.weight_decay);
  return out;
}

nb::tuple rnn_result(const RnnResult& r) {
  return nb::make_tuple(r.y, r.hy, r.cy.defined() ? nb::cast(r.cy) : nb::none());
}

}  // namespace

std::vector<optim::ParamGroup> to_groups(const std::vector<GroupTuple>& groups) {
  std::vector<optim::ParamGroup> out;
  for (const auto& [params, scale, decay] : groups) out.push_back({params, scale, decay});
  return out;
}

void bind_rnn(nb::module_& m) {
  m.def("embedding", &embedding, nb::arg("weight"), nb::arg("indices"), release_gil(),
        "The rows of weight [V, D] that indices (int32 / int64, any shape) pick: [..., D]. Duplicate indices add "
        "their gradients (in index order under set_deterministic_algorithms(True)).");
  m.def("rnn_weight_size",
        [](const std::string& mode, int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bidirectional,
           bool bias) { return rnn_weight_size(parse_mode(mode), input_size, hidden_size, num_layers, bidirectional, bias); },
        nb::arg("mode"), nb::arg("input_size"), nb::arg("hidden_size"), nb::arg("num_layers") = 1,
        nb::arg("bidirectional") = false, nb::arg("bias") = true,
        "Elements of the flat weight of a recurrent network (mode: tanh, relu, lstm, gru).");
  m.def(
      "rnn",
      [](const Tensor& x, const Tensor& weight, const std::optional<Tensor>& hx, const std::optional<Tensor>& cx,
         const std::string& mode, int64_t hidden_size, int64_t num_layers, bool bidirectional, bool batch_first,
         bool bias, double dropout, bool training, Generator* gen) {
        RnnOptions o;
        o.mode = parse_mode(mode);
        o.hidden_size = hidden_size;
        o.num_layers = num_layers;
        o.bidirectional = bidirectional;
        o.batch_first = batch_first;
        o.bias = bias;
        o.dropout = dropout;
        o.training = training;
        RnnResult r;
        {
          nb::gil_scoped_release unlocked;
          r = rnn(x, weight, hx.value_or(Tensor()), cx.value_or(Tensor()), o, gen);
        }
        return rnn_result(r);
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("hx").none() = nb::none(), nb::arg("cx").none() = nb::none(),
      nb::arg("mode") = "lstm", nb::arg("hidden_size"), nb::arg("num_layers") = 1, nb::arg("bidirectional") = false,
      nb::arg("batch_first") = false, nb::arg("bias") = true, nb::arg("dropout") = 0.0, nb::arg("training") = true,
      nb::arg("generator").none() = nb::none(),
      "A multi-layer recurrent network over x [T, N, I] ([N, T, I] with batch_first) with one flat weight in "
      "PyTorch's parameter order; returns (y, hy, cy), cy None unless mode is lstm.");

  nb::class_<nn::Embedding, nn::Module>(m, "Embedding")
      .def(nb::init<int64_t, int64_t, Generator&, bool>(), nb::arg("num_embeddings"), nb::arg("dim"),
           nb::arg("generator"), nb::arg("uniform") = false,
           "A table drawn from N(0, 1), or from U(-1, 1) with uniform.")
      .def_prop_ro("weight", [](const nn::Embedding& e) { return e.weight; });
  nb::class_<nn::RecurrentNet, nn::Module>(m, "RecurrentNet")
      .def(
          "__init__",
          [](nn::RecurrentNet* self, const std::string& mode, int64_t input_size, int64_t hidden_size, Generator& gen,
             int64_t num_layers, bool bias, bool batch_first, double dropout, bool bidirectional) {
            RnnOptions o;
            o.mode = parse_mode(mode);
            o.hidden_size = hidden_size;
            o.num_layers = num_layers;
            o.bias = bias;
            o.batch_first = batch_first;
            o.dropout = dropout;
            o.bidirectional = bidirectional;
            new (self) nn::RecurrentNet(input_size, o, gen);
          },
          nb::arg("mode"), nb::arg("input_size"), nb::arg("hidden_size"), nb::arg("generator"), nb::arg("num_layers") = 1,
          nb::arg("bias") = true, nb::arg("batch_first") = false, nb::arg("dropout") = 0.0,
          nb::arg("bidirectional") = false,
          "An RNN (mode tanh or relu), LSTM or GRU with PyTorch's parameters (weight_ih_l0, ...).")
      .def(
          "forward_states",
          [](nn::RecurrentNet& r, const Tensor& x, const std::optional<Tensor>& hx, const std::optional<Tensor>& cx) {
            RnnResult out;
            {
              nb::gil_scoped_release unlocked;
              out = r.forward_states(x, hx.value_or(Tensor()), cx.value_or(Tensor()));
            }
            return rnn_result(out);
          },
          nb::arg("x"), nb::arg("hx").none() = nb::none(), nb::arg("cx").none() = nb::none(),
          "(y, hy, cy) from x and the initial states (None: zeros); cy None unless an LSTM.")
      .def("flat_weight", &nn::RecurrentNet::flat_weight, release_gil())
      .def_prop_ro("input_size", &nn::RecurrentNet::input_size)
      .def_prop_ro("hidden_size", [](const nn::RecurrentNet& r) { return r.options().hidden_size; })
      .def_prop_ro("num_layers", [](const nn::RecurrentNet& r) { return r.options().num_layers; })
      .def_prop_ro("bidirectional", [](const nn::RecurrentNet& r) { return r.options().bidirectional; });

  // ---- optimizers, groups and schedules
  nb::class_<optim::RMSProp, optim::Optimizer>(m, "RMSProp")
      .def(
          "__init__",
          [](optim::RMSProp* self, std::vector<Tensor> params, double lr, double alpha, double eps, double weight_decay,
             bool eps_inside_sqrt) {
            new (self) optim::RMSProp(std::move(params), optim::RmsPropOptions{lr, alpha, eps, weight_decay, eps_inside_sqrt});
          },
          nb::arg("params"), nb::arg("lr") = 0.01, nb::arg("alpha") = 0.99, nb::arg("eps") = 1e-8,
          nb::arg("weight_decay") = 0.0, nb::arg("eps_inside_sqrt") = false,
          "v = alpha v + (1 - alpha) g^2; p -= lr g / (sqrt(v) + eps), or / sqrt(v + eps) with eps_inside_sqrt (SINGA's).");
  nb::class_<optim::AdaGrad, optim::Optimizer>(m, "AdaGrad")
      .def(
          "__init__",
          [](optim::AdaGrad* self, std::vector<Tensor> params, double lr, double lr_decay, double weight_decay,
             double initial_accumulator_value, double eps, bool eps_inside_sqrt) {
            new (self) optim::AdaGrad(std::move(params), optim::AdagradOptions{lr, lr_decay, weight_decay,
                                                                               initial_accumulator_value, eps,
                                                                               eps_inside_sqrt});
          },
          nb::arg("params"), nb::arg("lr") = 0.01, nb::arg("lr_decay") = 0.0, nb::arg("weight_decay") = 0.0,
          nb::arg("initial_accumulator_value") = 0.0, nb::arg("eps") = 1e-10, nb::arg("eps_inside_sqrt") = false,
          "s += g^2; p -= lr g / (sqrt(s) + eps), or / sqrt(s + eps) with eps_inside_sqrt (SINGA's).");

  m.def(
      "set_param_groups",
      [](optim::Optimizer& opt, const std::vector<GroupTuple>& groups) { opt.set_param_groups(to_groups(groups)); },
      nb::arg("optimizer"), nb::arg("groups"),
      "Regroups the optimizer's parameters: groups are (params, lr_scale, weight_decay or None); those in none "
      "form one more group with the optimizer's settings.");
  m.def(
      "param_groups",
      [](const optim::Optimizer& opt) {
        std::vector<GroupTuple> out(opt.groups().size());
        for (size_t g = 0; g < out.size(); ++g) {
          std::get<1>(out[g]) = opt.groups()[g].lr_scale;
          std::get<2>(out[g]) = opt.groups()[g].weight_decay;
        }
        for (size_t i = 0; i < opt.params().size(); ++i)
          std::get<0>(out[static_cast<size_t>(opt.group_of()[i])]).push_back(opt.params()[i]);
        return out;
      },
      nb::arg("optimizer"), "The optimizer's groups as (params, lr_scale, weight_decay or None).");
  m.def(
      "decay_groups",
      [](const nn::Module& model, double weight_decay) { return from_groups(optim::decay_groups(model, weight_decay)); },
      nb::arg("model"), nb::arg("weight_decay"),
      "(decayed, not decayed) groups of a module's parameters: biases, normalisation parameters and embedding "
      "tables are not decayed.");

  nb::class_<optim::LrSchedule>(m, "LrSchedule", "A learning rate as a function of the step count.")
      .def("lr", &optim::LrSchedule::lr, nb::arg("step"))
      .def("describe", &optim::LrSchedule::describe);
  nb::class_<optim::ConstantLr, optim::LrSchedule>(m, "ConstantLr").def(nb::init<double>(), nb::arg("value"));
  nb::class_<optim::ExponentialDecay, optim::LrSchedule>(m, "ExponentialDecayLr")
      .def(nb::init<double, int64_t, double, bool>(), nb::arg("init"), nb::arg("decay_steps"), nb::arg("rate"),
           nb::arg("staircase") = false);
  nb::class_<optim::WarmupCosine, optim::LrSchedule>(m, "WarmupCosineLr")
      .def(nb::init<double, int64_t, int64_t, double>(), nb::arg("peak"), nb::arg("warmup_steps"),
           nb::arg("total_steps"), nb::arg("min_lr") = 0.0);
  m.def(
      "set_schedule",
      [](optim::Optimizer& opt, std::shared_ptr<optim::LrSchedule> s) { opt.set_schedule(std::move(s)); },
      nb::arg("optimizer"), nb::arg("schedule").none(),
      "Every later step of the C++ optimizer takes its rate from the schedule (None: the rate stays as set).");
}

}  // namespace tandem::py
