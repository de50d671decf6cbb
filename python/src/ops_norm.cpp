// Softmax, normalisation, losses and attention, and their layers, as module functions and classes.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"

namespace tandem::py {

namespace {
Tensor opt(const std::optional<Tensor>& t) { return t.value_or(Tensor()); }
nb::object maybe(const Tensor& t) { return t.defined() ? nb::cast(t) : nb::none(); }
}  // namespace

void bind_norm(nb::module_& m) {
  m.def("log_softmax", &log_softmax, nb::arg("x"), nb::arg("dim") = -1, release_gil(),
        "log(softmax(x)) along one dimension, computed stably.");
  m.def(
      "layer_norm",
      [](const Tensor& x, const std::vector<int64_t>& shape, const std::optional<Tensor>& w,
         const std::optional<Tensor>& b, double eps) { return layer_norm(x, shape, opt(w), opt(b), eps); },
      nb::arg("x"), nb::arg("normalized_shape"), nb::arg("weight").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("eps") = 1e-5, release_gil(),
      "Layer normalisation over the trailing dimensions normalized_shape (weight and bias optional).");
  m.def(
      "rms_norm",
      [](const Tensor& x, const std::vector<int64_t>& shape, const std::optional<Tensor>& w, double eps) {
        return rms_norm(x, shape, opt(w), eps);
      },
      nb::arg("x"), nb::arg("normalized_shape"), nb::arg("weight").none() = nb::none(), nb::arg("eps") = 1e-6,
      release_gil(), "x / sqrt(mean(x^2) + eps) * weight over the trailing dimensions normalized_shape.");
  m.def(
      "cross_entropy_loss",
      [](const Tensor& logits, const Tensor& targets, const std::string& reduction, int64_t ignore_index) {
        return softmax_cross_entropy(logits, targets, parse_reduction(reduction, "softmax_cross_entropy"),
                                     ignore_index);
      },
      nb::arg("logits"), nb::arg("targets"), nb::arg("reduction") = "mean", nb::arg("ignore_index") = -100,
      release_gil(),
      "Softmax cross-entropy over the last axis of logits [..., C] against class indices [...]; positions whose "
      "target is ignore_index add nothing (mean: over the others).");
  m.def(
      "nll_loss",
      [](const Tensor& logp, const Tensor& targets, const std::string& reduction, int64_t ignore_index) {
        return nll_loss(logp, targets, parse_reduction(reduction, "nll_loss"), ignore_index);
      },
      nb::arg("logp"), nb::arg("targets"), nb::arg("reduction") = "mean", nb::arg("ignore_index") = -100,
      release_gil(), "-logp[target] over the last axis of log-probabilities [..., C], reduced.");
  m.def(
      "mse_loss",
      [](const Tensor& x, const Tensor& t, const std::string& reduction) {
        return mse_loss(x, t, parse_reduction(reduction, "mse_loss"));
      },
      nb::arg("x"), nb::arg("target"), nb::arg("reduction") = "mean", release_gil(), "(x - target)^2, reduced.");
  m.def(
      "binary_cross_entropy",
      [](const Tensor& p, const Tensor& t, const std::string& reduction) {
        return binary_cross_entropy(p, t, parse_reduction(reduction, "binary_cross_entropy"));
      },
      nb::arg("p"), nb::arg("target"), nb::arg("reduction") = "mean", release_gil(),
      "-(t log p + (1 - t) log(1 - p)) for probabilities p, each log at least -100, reduced.");
  m.def(
      "binary_cross_entropy_with_logits",
      [](const Tensor& x, const Tensor& t, const std::string& reduction) {
        return binary_cross_entropy_with_logits(x, t, parse_reduction(reduction, "binary_cross_entropy_with_logits"));
      },
      nb::arg("x"), nb::arg("target"), nb::arg("reduction") = "mean", release_gil(),
      "Binary cross-entropy of sigmoid(x), computed stably from the logits x, reduced.");
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
         const std::optional<double>& scale, Generator* gen) {
        return scaled_dot_product_attention(q, k, v, causal, dropout_p, scale.value_or(0.0), gen);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = false, nb::arg("dropout_p") = 0.0,
      nb::arg("scale").none() = nb::none(), nb::arg("generator").none() = nb::none(), release_gil(),
      "softmax(scale q k^T) v for [B, H, T, d] tensors (scale None: 1/sqrt(d)); causal masks later keys; "
      "dropout_p > 0 needs a generator. 16-bit on a GPU: cuDNN's fused flash attention.");

  nb::class_<nn::LayerNorm, nn::Module>(m, "LayerNorm")
      .def(nb::init<std::vector<int64_t>, double, bool, bool>(), nb::arg("normalized_shape"), nb::arg("eps") = 1e-5,
           nb::arg("affine") = true, nb::arg("bias") = true)
      .def_prop_ro("weight", [](const nn::LayerNorm& l) { return maybe(l.weight); })
      .def_prop_ro("bias", [](const nn::LayerNorm& l) { return maybe(l.bias); })
      .def_prop_ro("normalized_shape", [](const nn::LayerNorm& l) { return l.normalized_shape(); })
      .def_prop_ro("eps", &nn::LayerNorm::eps);
  nb::class_<nn::RMSNorm, nn::Module>(m, "RMSNorm")
      .def(nb::init<std::vector<int64_t>, double, bool>(), nb::arg("normalized_shape"), nb::arg("eps") = 1e-6,
           nb::arg("affine") = true)
      .def_prop_ro("weight", [](const nn::RMSNorm& l) { return maybe(l.weight); })
      .def_prop_ro("normalized_shape", [](const nn::RMSNorm& l) { return l.normalized_shape(); })
      .def_prop_ro("eps", &nn::RMSNorm::eps);
  nb::class_<nn::MultiHeadAttention, nn::Module>(m, "MultiHeadAttention")
      .def(nb::init<int64_t, int64_t, Generator&, bool, bool, double, uint64_t>(), nb::arg("embed_dim"),
           nb::arg("num_heads"), nb::arg("generator"), nb::arg("causal") = false, nb::arg("bias") = true,
           nb::arg("dropout") = 0.0, nb::arg("seed") = 0)
      .def(
          "attend",
          [](nn::MultiHeadAttention& a, const Tensor& q, const Tensor& k, const Tensor& v) { return a.forward(q, k, v); },
          nb::arg("query"), nb::arg("key"), nb::arg("value"), release_gil(),
          "Attention of query [B, Tq, E] over key and value [B, Tk, E].")
      .def_prop_ro("embed_dim", &nn::MultiHeadAttention::embed_dim)
      .def_prop_ro("num_heads", &nn::MultiHeadAttention::num_heads)
      .def_prop_ro("causal", &nn::MultiHeadAttention::causal)
      .def_prop_ro("q_proj", [](const nn::MultiHeadAttention& a) { return a.q_proj; })
      .def_prop_ro("k_proj", [](const nn::MultiHeadAttention& a) { return a.k_proj; })
      .def_prop_ro("v_proj", [](const nn::MultiHeadAttention& a) { return a.v_proj; })
      .def_prop_ro("out_proj", [](const nn::MultiHeadAttention& a) { return a.out_proj; });
}

}  // namespace tandem::py
