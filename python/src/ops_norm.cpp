// Softmax, normalisation, losses and attention, and their layers, as module functions and classes.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "tandem/nn/gpt.h"
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
         const std::optional<double>& scale, Generator* gen, const std::optional<Tensor>& doc_positions) {
        return scaled_dot_product_attention(q, k, v, causal, dropout_p, scale.value_or(0.0), gen,
                                            doc_positions.value_or(Tensor()));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = false, nb::arg("dropout_p") = 0.0,
      nb::arg("scale").none() = nb::none(), nb::arg("generator").none() = nb::none(),
      nb::arg("doc_positions").none() = nb::none(), release_gil(),
      "softmax(scale q k^T) v for [B, H, T, d] tensors (scale None: 1/sqrt(d)); causal masks later keys; "
      "dropout_p > 0 needs a generator; doc_positions (int32 [B, T], causal only): each token's position in its "
      "document, keys of other documents masked. 16-bit on a GPU: cuDNN's fused flash attention.");

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

  // ---- transformer blocks and the GPT
  nb::class_<nn::KVCache>(m, "KVCache",
                          "The keys and values a SelfAttention layer computed for the positions seen so far "
                          "([capacity, B, heads, head_dim] each), for forward_cached.")
      .def(nb::init<>())
      .def_prop_ro("length", [](const nn::KVCache& c) { return c.length; })
      .def_prop_ro("capacity", &nn::KVCache::capacity)
      .def_prop_ro("keys", [](const nn::KVCache& c) { return maybe(c.keys); })
      .def_prop_ro("values", [](const nn::KVCache& c) { return maybe(c.values); })
      .def("clear", &nn::KVCache::clear, "Forgets the positions (the memory is kept).");
  nb::class_<nn::SelfAttention, nn::Module>(m, "SelfAttention")
      .def(nb::init<int64_t, int64_t, Generator&, bool, bool, double, double, double>(), nb::arg("width"),
           nb::arg("heads"), nb::arg("generator"), nb::arg("causal") = true, nb::arg("bias") = true,
           nb::arg("dropout") = 0.0, nb::arg("init_std") = 0.02, nb::arg("proj_std") = 0.02,
           "GPT-2's self-attention over [B, T, width]: one query-key-value projection c_attn, heads, c_proj.")
      .def("forward_cached", &nn::SelfAttention::forward_cached, nb::arg("x"), nb::arg("cache"), nb::arg("capacity"),
           release_gil(), "Attention of the next positions x [B, Tn, width] over them and those in cache (appended to it).")
      .def_prop_ro("c_attn", [](const nn::SelfAttention& a) { return a.c_attn; })
      .def_prop_ro("c_proj", [](const nn::SelfAttention& a) { return a.c_proj; })
      .def_prop_ro("width", &nn::SelfAttention::width)
      .def_prop_ro("num_heads", &nn::SelfAttention::num_heads)
      .def_prop_ro("causal", &nn::SelfAttention::causal);
  nb::class_<nn::FeedForward, nn::Module>(m, "FeedForward")
      .def(nb::init<int64_t, int64_t, Generator&, bool, double, double>(), nb::arg("width"), nb::arg("hidden"),
           nb::arg("generator"), nb::arg("bias") = true, nb::arg("init_std") = 0.02, nb::arg("proj_std") = 0.02,
           "GPT-2's MLP: c_fc (width -> hidden), tanh-GELU, c_proj (hidden -> width).")
      .def_prop_ro("c_fc", [](const nn::FeedForward& f) { return f.c_fc; })
      .def_prop_ro("c_proj", [](const nn::FeedForward& f) { return f.c_proj; });
  nb::class_<nn::TransformerBlock, nn::Module>(m, "TransformerBlock")
      .def(
          "__init__",
          [](nn::TransformerBlock* self, int64_t width, int64_t heads, Generator& gen, bool causal, double dropout,
             bool bias, int64_t mlp_ratio, double init_std, int64_t residual_layers, double eps) {
            nn::TransformerBlockOptions o;
            o.causal = causal, o.dropout = dropout, o.bias = bias, o.mlp_ratio = mlp_ratio, o.init_std = init_std;
            o.residual_layers = residual_layers, o.eps = eps;
            new (self) nn::TransformerBlock(width, heads, gen, o);
          },
          nb::arg("width"), nb::arg("heads"), nb::arg("generator"), nb::arg("causal") = true, nb::arg("dropout") = 0.0,
          nb::arg("bias") = true, nb::arg("mlp_ratio") = 4, nb::arg("init_std") = 0.02, nb::arg("residual_layers") = 1,
          nb::arg("eps") = 1e-5,
          "Pre-norm block x + drop(attn(ln_1(x))), x + drop(mlp(ln_2(x))); the output projections are drawn with "
          "init_std / sqrt(2 residual_layers).")
      .def("forward_cached", &nn::TransformerBlock::forward_cached, nb::arg("x"), nb::arg("cache"),
           nb::arg("capacity"), release_gil(),
           "The block over the next positions x [B, Tn, width], the attention's earlier keys and values in cache.")
      .def(
          "set_document_positions",
          [](nn::TransformerBlock& b, const std::optional<Tensor>& p) {
            b.attn->set_document_positions(p.value_or(Tensor()));
          },
          nb::arg("positions").none(),
          "Packed documents for the forwards that follow: int32 [B, T], each token's position in its document "
          "(attention kept within documents); None: none.")
      .def_prop_ro("ln_1", [](const nn::TransformerBlock& b) { return b.ln_1; })
      .def_prop_ro("attn", [](const nn::TransformerBlock& b) { return b.attn; })
      .def_prop_ro("ln_2", [](const nn::TransformerBlock& b) { return b.ln_2; })
      .def_prop_ro("mlp", [](const nn::TransformerBlock& b) { return b.mlp; })
      .def_prop_ro("width", &nn::TransformerBlock::width);

  nb::class_<nn::GptConfig>(m, "GptConfig", "The shape of a GPT (gpt_config names the standard ones).")
      .def(nb::init<>())
      .def_rw("layers", &nn::GptConfig::layers)
      .def_rw("heads", &nn::GptConfig::heads)
      .def_rw("width", &nn::GptConfig::width)
      .def_rw("context", &nn::GptConfig::context)
      .def_rw("vocab", &nn::GptConfig::vocab)
      .def_rw("dropout", &nn::GptConfig::dropout)
      .def_rw("bias", &nn::GptConfig::bias)
      .def_rw("logical_vocab", &nn::GptConfig::logical_vocab,
              "The token ids in use when fewer than vocab (a padded table); 0: all of vocab.")
      .def("used_vocab", &nn::GptConfig::used_vocab)
      .def("to_json", &nn::gpt_config_to_json)
      .def_static("from_json", &nn::gpt_config_from_json, nb::arg("json"));
  m.def("gpt_config", &nn::gpt_config, nb::arg("name"), "\"gpt2\", \"gpt2-medium\" or \"char\".");
  m.def("gpt_config_names", &nn::gpt_config_names);
  m.def("gpt_checkpoint_meta", &nn::gpt_checkpoint_meta, nb::arg("config"),
        "The meta JSON of a GPT checkpoint: {\"model\": \"gpt\", \"gpt\": {...}}.");
  m.def("gpt_config_from_meta", &nn::gpt_config_from_meta, nb::arg("meta_json"), nb::arg("what") = "checkpoint");
  m.def("gpt_num_parameters", &nn::gpt_num_parameters, nb::arg("config"), nb::arg("include_position_table") = true);
  m.def("gpt_flops_per_token", &nn::gpt_flops_per_token, nb::arg("config"), nb::arg("seq_len") = 0,
        "6 N + 12 layers width seq_len: a training step's FLOPs per token (nanoGPT's estimate).");
  m.def(
      "sample_logits",
      [](const std::vector<float>& logits, double temperature, int64_t top_k, Generator& gen) {
        return nn::sample_logits(logits, nn::SampleOptions{temperature, top_k, gen.seed()}, gen);
      },
      nb::arg("logits"), nb::arg("temperature") = 1.0, nb::arg("top_k") = 0, nb::arg("generator"),
      "A token drawn from one position's logits as GPT.generate draws it (temperature 0: the most likely).");
  nb::class_<nn::GptCache>(m, "GptCache", "A GPT's incremental-decoding state: one KVCache per block.")
      .def(nb::init<>())
      .def_prop_ro("length", [](const nn::GptCache& c) { return c.length; })
      .def("clear", &nn::GptCache::clear);
  nb::class_<nn::GPT, nn::Module>(m, "GPT")
      .def(nb::init<const nn::GptConfig&, uint64_t>(), nb::arg("config"), nb::arg("seed") = 0,
           "GPT-2's language model: tokens [B, T] -> logits [B, T, vocab], initialised from seed.")
      .def("forward_cached", &nn::GPT::forward_cached, nb::arg("tokens"), nb::arg("cache"), release_gil(),
           "Logits for the next tokens [B, Tn] of sequences whose earlier tokens cache holds.")
      .def(
          "set_recompute", [](nn::GPT& g, const std::string& policy) { g.set_recompute(nn::parse_recompute(policy)); },
          nb::arg("policy"), "Activation recompute of the blocks: none, selective or full.")
      .def_prop_ro("recompute", [](const nn::GPT& g) { return std::string(nn::recompute_name(g.recompute_policy())); })
      .def(
          "set_document_positions",
          [](nn::GPT& g, const std::optional<Tensor>& p) { g.set_document_positions(p.value_or(Tensor())); },
          nb::arg("positions").none(), "Packed documents (CausalLm::set_document_positions); None: none.")
      .def(
          "generate",
          [](nn::GPT& g, const std::vector<int64_t>& prompt, int64_t n, double temperature, int64_t top_k,
             uint64_t seed) { return g.generate(prompt, n, nn::SampleOptions{temperature, top_k, seed}); },
          nb::arg("prompt"), nb::arg("n"), nb::arg("temperature") = 1.0, nb::arg("top_k") = 0, nb::arg("seed") = 0,
          release_gil(), "n tokens continuing prompt, drawn one at a time with a key-value cache.")
      .def_prop_ro("config", &nn::GPT::config)
      .def_prop_ro("wte", [](const nn::GPT& g) { return g.wte; })
      .def_prop_ro("wpe", [](const nn::GPT& g) { return g.wpe; })
      .def_prop_ro("h", [](const nn::GPT& g) { return g.h; })
      .def_prop_ro("ln_f", [](const nn::GPT& g) { return g.ln_f; });
}

}  // namespace tandem::py
