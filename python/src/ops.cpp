// Differentiable operations and autograd, as module functions.
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autograd/retain_graph.h"
#include "binding.h"
#include "core/tensor_impl.h"
#include "tandem/autograd.h"
#include "tandem/nn/module.h"
#include "tandem/random.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem::py {

namespace {

using Pair = std::array<int, 2>;

// Leaves that need a gradient and are reachable from t's graph, each once, in a deterministic order
// (depth first from t), so that every rank of a job lists the same parameters in the same order.
std::vector<Tensor> graph_leaves(const Tensor& t) {
  std::vector<Tensor> out;
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  if (t.grad_fn()) stack.push_back(t.grad_fn().get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->leaf) out.emplace_back(n->leaf);
    for (auto it = n->next.rbegin(); it != n->next.rend(); ++it) stack.push_back(it->get());
  }
  return out;
}

// A Python callable held by graph nodes, which the engine may free without the GIL.
std::shared_ptr<nb::object> hold_callable(nb::object fn) {
  return std::shared_ptr<nb::object>(new nb::object(std::move(fn)), [](nb::object* o) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
    nb::gil_scoped_acquire gil;
    delete o;
  });
}

// SINGA's Operator subclasses with a Python forward/backward: each floating-point output gets a node whose
// backward calls backward(*dys) under the GIL (zeros for the other outputs' gradients) and takes what it
// returns as the inputs' gradients: moved to each input's device and dtype, checked against its shape.
// Only shapes, dtypes and devices are kept, no Python object but the callable.
std::vector<Tensor> record_function(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                    nb::object backward_fn, const std::string& name) {
  TANDEM_CHECK(PyCallable_Check(backward_fn.ptr()), name, ": backward must be callable");
  struct Meta {
    Shape shape;
    DType dtype;
    Device device;
  };
  auto meta = [](const Tensor& t) { return Meta{t.shape(), t.dtype(), t.device()}; };
  auto ins = std::make_shared<std::vector<Meta>>();
  auto outs = std::make_shared<std::vector<Meta>>();
  for (const Tensor& x : inputs) {
    TANDEM_CHECK(x.defined(), name, ": an input is an undefined tensor");
    ins->push_back(meta(x));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    TANDEM_CHECK(outputs[i].defined(), name, ": output ", i, " is an undefined tensor");
    outs->push_back(meta(outputs[i]));
  }
  auto fn = hold_callable(std::move(backward_fn));
  // The callable (a bound method: its instance, its module's globals) is held from C++, where the
  // collector cannot see it: a tensor in a module global whose graph holds one is still alive when the
  // extension is torn down at exit. That is no leak of a running program; nanobind would report it.
  if (grad_enabled()) nb::set_leak_warnings(false);
  std::vector<Tensor> out;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor y = outputs[i].detach();  // an output may be an input returned as it is
    if (!is_floating(y.dtype())) {
      out.push_back(y);
      continue;
    }
    out.push_back(record_op(y, inputs, name.c_str(), [fn, i, name, ins, outs](const Tensor& dy) {
      std::vector<Tensor> dys;
      for (size_t k = 0; k < outs->size(); ++k) {
        const Meta& m = (*outs)[k];
        dys.push_back(k == i ? dy : Tensor::zeros(m.shape, m.dtype, m.device));
      }
      nb::gil_scoped_acquire gil;
      nb::object r = (*fn)(*nb::cast(dys));
      std::vector<nb::object> given;
      if (nb::isinstance<nb::tuple>(r) || nb::isinstance<nb::list>(r)) {
        for (nb::handle h : r) given.push_back(nb::borrow(h));
      } else {
        given.push_back(r);
      }
      TANDEM_CHECK(given.size() == ins->size(), name, ".backward gave ", given.size(), " gradient(s) for ",
                   ins->size(), " input(s): it must give one (a tensor, or None) for each");
      std::vector<Tensor> grads;
      for (size_t j = 0; j < given.size(); ++j) {
        if (given[j].is_none()) {
          grads.emplace_back();
          continue;
        }
        TANDEM_CHECK(nb::isinstance<Tensor>(given[j]), name, ".backward: the gradient of input ", j,
                     " must be a tensor or None, got ", nb::type_name(given[j].type()).c_str());
        Tensor t = nb::cast<Tensor>(given[j]);
        const Meta& m = (*ins)[j];
        TANDEM_CHECK(t.shape() == m.shape, name, ".backward: the gradient of input ", j, " has shape ",
                     shape_str(t.shape()), " but the input has ", shape_str(m.shape));
        if (t.device() != m.device) t = t.to(m.device);
        if (t.dtype() != m.dtype) t = t.to(m.dtype);
        grads.push_back(std::move(t));
      }
      return grads;
    }));
  }
  return out;
}

// Disables graph recording inside a `with` block.
struct NoGradScope {
  std::unique_ptr<NoGradGuard> guard;
};

// Sets the precision of the ops run inside a `with` block on this thread.
struct PrecisionBlock {
  Precision precision;
  std::unique_ptr<PrecisionScope> scope;
};

}  // namespace

void bind_ops(nb::module_& m) {
  auto bias = [](const std::optional<Tensor>& b) { return b.value_or(Tensor()); };

  m.def("add", &add, nb::arg("a"), nb::arg("b"), release_gil());
  m.def("sub", &sub, nb::arg("a"), nb::arg("b"), release_gil());
  m.def("mul", &mul, nb::arg("a"), nb::arg("b"), release_gil());
  m.def("scale", &scale, nb::arg("a"), nb::arg("s"), release_gil());
  m.def("add_scalar", &add_scalar, nb::arg("a"), nb::arg("s"), release_gil());
  m.def("div", &div, nb::arg("a"), nb::arg("b"), release_gil());
  m.def("exp", static_cast<Tensor (*)(const Tensor&)>(&tandem::exp), nb::arg("x"), release_gil());
  m.def("log", static_cast<Tensor (*)(const Tensor&)>(&tandem::log), nb::arg("x"), release_gil());
  m.def(
      "compare",
      [](const Tensor& a, const Tensor& b, const std::string& op) {
        static const std::pair<const char*, Comparison> ops[] = {
            {"gt", Comparison::Greater}, {"ge", Comparison::GreaterEqual}, {"lt", Comparison::Less},
            {"le", Comparison::LessEqual}, {"eq", Comparison::Equal}};
        for (const auto& [name, c] : ops) {
          if (op != name) continue;
          nb::gil_scoped_release unlocked;
          return compare(a, b, c);
        }
        throw nb::value_error(("compare: unknown comparison '" + op + "' (gt, ge, lt, le, eq)").c_str());
      },
      nb::arg("a"), nb::arg("b"), nb::arg("op"), "1 where `a op b` holds, else 0 (op: gt, ge, lt, le, eq); b broadcasts.");
  m.def("relu", &relu, nb::arg("x"), release_gil());
  m.def("sigmoid", &sigmoid, nb::arg("x"), release_gil());
  m.def("tanh", static_cast<Tensor (*)(const Tensor&)>(&tandem::tanh), nb::arg("x"), release_gil());
  m.def("bias_add", &bias_add, nb::arg("x"), nb::arg("b"), release_gil());
  m.def("reshape", [](const Tensor& x, const std::vector<int64_t>& s) { return reshape(x, s); }, nb::arg("x"),
        nb::arg("shape"), release_gil());
  m.def("flatten", &flatten, nb::arg("x"), nb::arg("start_dim") = 1, release_gil());
  m.def("sum", static_cast<Tensor (*)(const Tensor&)>(&sum), nb::arg("x"), release_gil());
  m.def("sum_dims", static_cast<Tensor (*)(const Tensor&, const std::vector<int64_t>&, bool)>(&sum), nb::arg("x"),
        nb::arg("dims"), nb::arg("keepdim") = false, release_gil(), "Sum over the dimensions (keepdim: as extents of 1).");
  m.def("expand", [](const Tensor& x, const std::vector<int64_t>& s) { return expand(x, s); }, nb::arg("x"),
        nb::arg("shape"), release_gil(), "x stretched to shape by broadcasting.");
  m.def("permute", &permute, nb::arg("x"), nb::arg("perm"), release_gil(),
        "Dimension i of the result is dimension perm[i] of x.");
  m.def("concat", &concat, nb::arg("tensors"), nb::arg("dim"), release_gil(), "The tensors joined along dim.");
  m.def("slice", &slice, nb::arg("x"), nb::arg("dim"), nb::arg("start"), nb::arg("length"), release_gil(),
        "Elements [start, start + length) of dimension dim.");
  m.def("softmax", &softmax, nb::arg("x"), nb::arg("dim") = -1, release_gil(), "Softmax along one dimension.");
  m.def("dropout", &dropout, nb::arg("x"), nb::arg("p"), nb::arg("training"), nb::arg("generator"), release_gil(),
        "Zeroes each element with probability p and scales the rest by 1/(1-p) in training; x itself otherwise.");
  m.def("mean", static_cast<Tensor (*)(const Tensor&)>(&mean), nb::arg("x"), release_gil());
  m.def("matmul", &matmul, nb::arg("a"), nb::arg("b"), release_gil());
  m.def(
      "linear",
      [bias](const Tensor& x, const Tensor& w, const std::optional<Tensor>& b, bool relu) {
        return linear(x, w, bias(b), relu);
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias").none() = nb::none(), nb::arg("relu") = false, release_gil(),
      "x [N, in] w [out, in]^T + b; relu fuses max(., 0).");
  m.def(
      "conv2d",
      [bias](const Tensor& x, const Tensor& w, const std::optional<Tensor>& b, Pair stride, Pair padding, bool relu,
             int groups) { return conv2d(x, w, bias(b), Conv2dOptions{stride, padding, relu, groups}); },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias").none() = nb::none(), nb::arg("stride") = Pair{1, 1},
      nb::arg("padding") = Pair{0, 0}, nb::arg("relu") = false, nb::arg("groups") = 1, release_gil(),
      "NCHW convolution; weight [K, C / groups, R, S]; relu fuses max(., 0).");
  m.def(
      "batch_norm2d",
      [](const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor running_mean, Tensor running_var,
         bool training, double momentum, double eps) {
        return batch_norm2d(x, gamma, beta, running_mean, running_var, training, momentum, eps);
      },
      nb::arg("x"), nb::arg("gamma"), nb::arg("beta"), nb::arg("running_mean"), nb::arg("running_var"),
      nb::arg("training"), nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5, release_gil(),
      "Batch normalisation of NCHW x per channel: batch statistics in training (the running ones updated in "
      "place: (1 - momentum) running + momentum batch), the running ones otherwise.");
  m.def(
      "max_pool2d",
      [](const Tensor& x, Pair kernel, Pair stride, Pair padding, const std::optional<Pair>& padding_end,
         bool ceil_mode) {
        return max_pool2d(x, Pool2dOptions{kernel, stride, padding, padding_end.value_or(Pair{-1, -1}), ceil_mode});
      },
      nb::arg("x"), nb::arg("kernel"), nb::arg("stride"), nb::arg("padding") = Pair{0, 0},
      nb::arg("padding_end").none() = nb::none(), nb::arg("ceil_mode") = false, release_gil(),
      "Max over each window of NCHW x; padding before the input (top, left) and, unless padding_end is given, "
      "after it; ceil_mode rounds the output size up (a last window that starts inside the input or its "
      "leading padding).");
  m.def(
      "avg_pool2d",
      [](const Tensor& x, Pair kernel, Pair stride, Pair padding, const std::optional<Pair>& padding_end,
         bool ceil_mode, bool count_include_pad) {
        return avg_pool2d(x, Pool2dOptions{kernel, stride, padding, padding_end.value_or(Pair{-1, -1}), ceil_mode,
                                           count_include_pad});
      },
      nb::arg("x"), nb::arg("kernel"), nb::arg("stride"), nb::arg("padding") = Pair{0, 0},
      nb::arg("padding_end").none() = nb::none(), nb::arg("ceil_mode") = false,
      nb::arg("count_include_pad") = true, release_gil(),
      "Mean over each window of NCHW x (padding and ceil_mode as max_pool2d's); count_include_pad: padded "
      "positions count in the divisor, else only the input's do.");
  m.def("softmax_cross_entropy", static_cast<Tensor (*)(const Tensor&, const Tensor&)>(&softmax_cross_entropy),
        nb::arg("logits"), nb::arg("labels"), release_gil(),
        "Mean over the batch of -log softmax(logits)[label]; labels i32 or i64 [N], or targets [N, C] "
        "(one-hot rows or a distribution per row: the mean of -sum(t * log softmax)).");
  m.def("argmax", static_cast<Tensor (*)(const Tensor&)>(&argmax), nb::arg("x"), release_gil(), "Index of the largest element of each row, i64 [N].");
  m.def("count_correct", &count_correct, nb::arg("logits"), nb::arg("labels"), release_gil(),
        "Rows whose argmax equals the label, as a one-element i64 tensor on the device.");

  m.def("backward", [](const Tensor& loss, const std::optional<Tensor>& g) { backward(loss, {}, g.value_or(Tensor())); },
        nb::arg("loss"), nb::arg("grad_output").none() = nb::none(), release_gil(),
        "Back-propagates from loss into the gradients of every leaf that requires one.");
  m.def(
      "backward_fresh",
      [](const Tensor& loss, const std::optional<Tensor>& grad_output, bool retain_graph) {
        std::vector<Tensor> ready;
        nb::gil_scoped_release unlocked;
        for (Tensor& leaf : graph_leaves(loss)) leaf.set_grad(Tensor());
        std::optional<RetainGraphGuard> keep;
        if (retain_graph) keep.emplace();
        backward(
            loss, [&](const Tensor& leaf) { if (leaf.grad().defined()) ready.push_back(leaf); },
            grad_output.value_or(Tensor()));
        return ready;
      },
      nb::arg("loss"), nb::arg("grad_output").none() = nb::none(), nb::arg("retain_graph") = false,
      "Back-propagates from loss into fresh gradients (each leaf's earlier gradient dropped first) and returns the "
      "leaves in the order their gradients became final (SINGA's autograd.backward). retain_graph keeps the graph, "
      "so that backward can run over it again (it goes with the last tensor that refers to it).");
  m.def("record_function", &record_function, nb::arg("outputs"), nb::arg("inputs"), nb::arg("backward"),
        nb::arg("name"),
        "Gives outputs (computed outside the graph) a graph node over inputs whose gradient backward(i, dy) computes "
        "in Python: i the output, dy its gradient; it returns one tensor or None per input. Returns the outputs as "
        "new tensors on the same memory (floating-point ones carry the node when grad mode is on and an input needs "
        "a gradient).");
  m.def("graph_leaves", &graph_leaves, nb::arg("tensor"),
        "The leaves needing a gradient that tensor was computed from, in a deterministic order.");
  m.def("grad_enabled", &grad_enabled, "False inside a no_grad block.");
  m.def(
      "recompute_module",
      [](std::shared_ptr<nn::Module> mod, const Tensor& x, const std::string& policy) {
        if (policy == "selective") {
          RecomputeRegion region;
          return region.close(mod->forward(x));
        }
        TANDEM_CHECK(policy == "full", "recompute_module: the policy is full or selective, not '", policy, "'");
        std::vector<Generator*> gens;
        for (auto& [name, g] : mod->named_generators()) gens.push_back(g);
        return recompute([mod](const Tensor& in) { return mod->forward(in); }, x, mod->parameters(), gens);
      },
      nb::arg("module"), nb::arg("x"), nb::arg("policy") = "full", release_gil(),
      "module(x) under activation recompute: full keeps only x for backward and runs the module again there (its "
      "dropout masks replayed); selective frees what the module marks as cheap to make again (a transformer "
      "block's norms' and activation's outputs) and makes it again in backward.");
  nb::class_<NoGradScope>(m, "no_grad", "with no_grad(): operations inside record no graph (evaluation).")
      .def(nb::init<>())
      .def("__enter__", [](NoGradScope& s) { s.guard = std::make_unique<NoGradGuard>(); })
      .def("__exit__", [](NoGradScope& s, nb::args) { s.guard.reset(); });

  nb::enum_<Precision>(m, "Precision", "How convolutions and matrix products compute on GPUs.")
      .value("f32", Precision::f32)
      .value("tf32", Precision::tf32)
      .value("bf16", Precision::bf16)
      .value("f16", Precision::f16);
  m.def("parse_precision", [](const std::string& s) { return parse_precision(s); }, nb::arg("name"));
  m.def("current_precision", &current_precision, "The precision ops on this thread run at now.");
  m.def("set_deterministic_algorithms", &set_deterministic_algorithms, nb::arg("on"),
        "GPU convolutions take only algorithms that give the same bits on every run (as tandem train "
        "--deterministic).");
  m.def("deterministic_algorithms", &deterministic_algorithms);
  m.def("default_precision", [](nb::handle d) { return default_precision(to_device(d)); }, nb::arg("device").none(),
        "tf32 on CUDA, f32 on the CPU.");
  nb::class_<PrecisionBlock>(m, "precision",
                             "with precision('bf16'): convolutions and matrix products on GPUs inside the block run "
                             "at that precision (the CPU always computes exact f32); backward follows its forward.")
      .def("__init__", [](PrecisionBlock* self, nb::handle p) {
        new (self) PrecisionBlock{nb::isinstance<Precision>(p) ? nb::cast<Precision>(p)
                                                                : parse_precision(nb::cast<std::string>(p)), nullptr};
      }, nb::arg("precision"))
      .def("__enter__", [](PrecisionBlock& b) { b.scope = std::make_unique<PrecisionScope>(b.precision); })
      .def("__exit__", [](PrecisionBlock& b, nb::args) { b.scope.reset(); });
}

}  // namespace tandem::py
