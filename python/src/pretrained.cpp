// Llama models and Hugging Face directories in Python: nn::Llama with its configuration, from_pretrained and
// save_pretrained (tandem.models.Llama and tandem.models.from_pretrained wrap them).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "binding.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/pretrained.h"

namespace tandem::py {

void bind_pretrained(nb::module_& m) {
  nb::class_<RopeScaling>(m, "RopeScaling", "Llama 3's rotary rescaling (factor 0: none).")
      .def(nb::init<>())
      .def_rw("factor", &RopeScaling::factor)
      .def_rw("low_freq_factor", &RopeScaling::low_freq_factor)
      .def_rw("high_freq_factor", &RopeScaling::high_freq_factor)
      .def_rw("original_context", &RopeScaling::original_context);
  nb::class_<nn::LlamaConfig>(m, "LlamaConfig", "The shape of a Llama (llama_config names the standard ones).")
      .def(nb::init<>())
      .def_rw("layers", &nn::LlamaConfig::layers)
      .def_rw("width", &nn::LlamaConfig::width)
      .def_rw("heads", &nn::LlamaConfig::heads)
      .def_rw("kv_heads", &nn::LlamaConfig::kv_heads)
      .def_rw("mlp_hidden", &nn::LlamaConfig::mlp_hidden)
      .def_rw("vocab", &nn::LlamaConfig::vocab)
      .def_rw("context", &nn::LlamaConfig::context)
      .def_rw("rope_theta", &nn::LlamaConfig::rope_theta)
      .def_rw("rope_scaling", &nn::LlamaConfig::rope_scaling)
      .def_rw("rms_eps", &nn::LlamaConfig::rms_eps)
      .def_rw("tied", &nn::LlamaConfig::tied)
      .def_rw("attention_bias", &nn::LlamaConfig::attention_bias)
      .def_rw("mlp_bias", &nn::LlamaConfig::mlp_bias)
      .def_rw("init_std", &nn::LlamaConfig::init_std)
      .def_rw("dropout", &nn::LlamaConfig::dropout)
      .def("to_json", &nn::llama_config_to_json)
      .def_static("from_json", &nn::llama_config_from_json, nb::arg("json"));
  m.def("llama_config", &nn::llama_config, nb::arg("name"), "\"llama-1b\", \"llama-3b\" or \"llama-8b\".");
  m.def("llama_config_names", &nn::llama_config_names);
  m.def("llama_num_parameters", &nn::llama_num_parameters, nb::arg("config"), nb::arg("include_token_table") = true);
  m.def("llama_flops_per_token", &nn::llama_flops_per_token, nb::arg("config"), nb::arg("seq_len") = 0);
  nb::class_<nn::Llama, nn::Module>(m, "Llama")
      .def(nb::init<const nn::LlamaConfig&, uint64_t>(), nb::arg("config"), nb::arg("seed") = 0,
           "A Llama language model: tokens [B, T] -> logits [B, T, vocab], initialised from seed.")
      .def("loss", &nn::Llama::loss, nb::arg("tokens"), nb::arg("targets"), nb::arg("ignore_index") = -100,
           release_gil(), "The mean cross-entropy of targets (the head taken with the loss).")
      .def(
          "set_recompute", [](nn::Llama& l, const std::string& policy) { l.set_recompute(nn::parse_recompute(policy)); },
          nb::arg("policy"), "Activation recompute of the blocks: none, selective or full.")
      .def_prop_ro("recompute", [](const nn::Llama& l) { return std::string(nn::recompute_name(l.recompute_policy())); })
      .def(
          "set_document_positions",
          [](nn::Llama& l, const std::optional<Tensor>& p) { l.set_document_positions(p.value_or(Tensor())); },
          nb::arg("positions").none(), "Packed documents (CausalLm::set_document_positions); None: none.")
      .def("forward_cached", &nn::Llama::forward_cached, nb::arg("tokens"), nb::arg("cache"), release_gil(),
           "Logits for the next tokens [B, Tn] of sequences whose earlier tokens cache holds.")
      .def(
          "generate",
          [](nn::Llama& l, const std::vector<int64_t>& prompt, int64_t n, double temperature, int64_t top_k,
             double top_p, uint64_t seed, int64_t stop_token) {
            nn::SampleOptions o{temperature, top_k, seed};
            o.top_p = top_p;
            o.stop_token = stop_token;
            return l.generate(prompt, n, o);
          },
          nb::arg("prompt"), nb::arg("n"), nb::arg("temperature") = 1.0, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0,
          nb::arg("seed") = 0, nb::arg("stop_token") = -1, release_gil(),
          "Up to n tokens continuing prompt, drawn one at a time with a key-value cache (stop_token ends it).")
      .def_prop_ro("config", &nn::Llama::config);
  m.def(
      "from_pretrained",
      [](const std::string& dir, nb::handle device, int64_t context) {
        const Device d = to_device(device);
        nn::Pretrained p;
        {
          nb::gil_scoped_release unlocked;
          p = nn::from_pretrained(dir, d, context);
        }
        return nb::make_tuple(p.family, p.model, p.config_json);
      },
      nb::arg("dir"), nb::arg("device").none(), nb::arg("context") = 0,
      "(family, model, config_json) of the Hugging Face model in dir: \"llama\" (a Llama) or \"gpt2\" (a GPT).");
  m.def("save_pretrained", &nn::save_pretrained, nb::arg("model"), nb::arg("dir"), nb::arg("config_json") = "",
        nb::arg("dtype") = DType::f32, release_gil(),
        "Writes a Llama or GPT as a Hugging Face directory (config.json, model.safetensors).");
}

}  // namespace tandem::py
