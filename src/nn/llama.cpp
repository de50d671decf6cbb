// Llama: the model, its configuration as JSON, its size and cost.
#include "tandem/nn/llama.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tandem/autograd.h"
#include "tandem/precision.h"

namespace tandem::nn {

namespace {
using Json = nlohmann::json;

[[noreturn]] void input_error(const std::string& msg) { throw Error(Error::Kind::Input, msg); }

constexpr const char* kKeys[] = {"layers",         "width",    "heads",        "kv_heads",      "mlp_hidden",
                                 "vocab",          "context",  "rope_theta",   "rope_scaling",  "rms_eps",
                                 "tied",           "attention_bias", "mlp_bias", "init_std",     "dropout"};
}  // namespace

// ---- configuration

LlamaConfig llama_config(const std::string& name) {
  LlamaConfig c;
  c.rope_scaling = RopeScaling{32.0, 1.0, 4.0, 8192};
  if (name == "llama-1b") return c;
  if (name == "llama-3b") {
    c.layers = 28, c.width = 3072, c.heads = 24, c.kv_heads = 8, c.mlp_hidden = 8192;
    return c;
  }
  if (name == "llama-8b") {
    c.layers = 32, c.width = 4096, c.heads = 32, c.kv_heads = 8, c.mlp_hidden = 14336, c.tied = false;
    c.rope_scaling.factor = 8.0;
    return c;
  }
  input_error("unknown Llama configuration '" + name + "' (use llama-1b, llama-3b or llama-8b)");
}

std::vector<std::string> llama_config_names() { return {"llama-1b", "llama-3b", "llama-8b"}; }

void check_llama_config(const LlamaConfig& c) {
  auto positive = [](int64_t v, const char* name) {
    if (v <= 0) input_error(detail::cat("Llama configuration: ", name, " ", v, " must be positive"));
  };
  positive(c.layers, "layers");
  positive(c.heads, "heads");
  positive(c.kv_heads, "kv_heads");
  positive(c.width, "width");
  positive(c.mlp_hidden, "mlp_hidden");
  positive(c.context, "context");
  positive(c.vocab, "vocab");
  if (c.width % c.heads != 0)
    input_error(detail::cat("Llama configuration: width ", c.width, " must be a multiple of heads ", c.heads));
  if (c.heads % c.kv_heads != 0)
    input_error(detail::cat("Llama configuration: kv_heads ", c.kv_heads, " must divide heads ", c.heads));
  if ((c.width / c.heads) % 2 != 0)
    input_error(detail::cat("Llama configuration: the head size ", c.width / c.heads,
                            " must be even (rotary position embeddings rotate pairs)"));
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0.0))
    input_error(detail::cat("Llama configuration: rope_theta ", c.rope_theta, " must be positive"));
  if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0.0))
    input_error(detail::cat("Llama configuration: rms_eps ", c.rms_eps, " must be positive"));
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    input_error(detail::cat("Llama configuration: dropout ", c.dropout, " outside [0, 1)"));
  if (!(std::isfinite(c.init_std) && c.init_std >= 0.0))
    input_error(detail::cat("Llama configuration: init_std ", c.init_std, " must be a finite non-negative number"));
  const RopeScaling& r = c.rope_scaling;
  if (r.factor < 0.0 || (r.factor > 0.0 && !(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor &&
                                             r.original_context > 0)))
    input_error(detail::cat("Llama configuration: rope_scaling (factor ", r.factor, ", low_freq_factor ",
                            r.low_freq_factor, ", high_freq_factor ", r.high_freq_factor,
                            ", original_max_position_embeddings ", r.original_context,
                            ") must have factor >= 0, and when positive high_freq_factor > low_freq_factor > 0 and "
                            "a positive original context"));
}

std::string llama_config_to_json(const LlamaConfig& c) {
  Json scaling = c.rope_scaling.factor > 0.0
                     ? Json{{"factor", c.rope_scaling.factor},
                            {"low_freq_factor", c.rope_scaling.low_freq_factor},
                            {"high_freq_factor", c.rope_scaling.high_freq_factor},
                            {"original_max_position_embeddings", c.rope_scaling.original_context}}
                     : Json(nullptr);
  Json j = {{"layers", c.layers},     {"width", c.width},       {"heads", c.heads},
            {"kv_heads", c.kv_heads}, {"mlp_hidden", c.mlp_hidden}, {"vocab", c.vocab},
            {"context", c.context},   {"rope_theta", c.rope_theta}, {"rope_scaling", scaling},
            {"rms_eps", c.rms_eps},   {"tied", c.tied},         {"attention_bias", c.attention_bias},
            {"mlp_bias", c.mlp_bias}, {"init_std", c.init_std}, {"dropout", c.dropout}};
  return j.dump();
}

LlamaConfig llama_config_from_json(const std::string& text) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    input_error(std::string("Llama configuration: not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) input_error("Llama configuration: must be a JSON object, got " + j.dump());
  for (const auto& [key, value] : j.items())
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      input_error("Llama configuration: unknown key '" + key + "'");
  auto need = [&](const char* key) -> const Json& {
    if (!j.contains(key)) input_error(detail::cat("Llama configuration: no '", key, "'"));
    return j[key];
  };
  auto integer = [&](const char* key) {
    const Json& v = need(key);
    if (!v.is_number_integer()) input_error(detail::cat("Llama configuration: '", key, "' is ", v.dump(), ", not an integer"));
    return v.get<int64_t>();
  };
  auto number = [&](const char* key) {
    const Json& v = need(key);
    if (!v.is_number()) input_error(detail::cat("Llama configuration: '", key, "' is ", v.dump(), ", not a number"));
    return v.get<double>();
  };
  auto boolean = [&](const char* key) {
    const Json& v = need(key);
    if (!v.is_boolean()) input_error(detail::cat("Llama configuration: '", key, "' is ", v.dump(), ", not true or false"));
    return v.get<bool>();
  };
  LlamaConfig c;
  c.layers = integer("layers");
  c.width = integer("width");
  c.heads = integer("heads");
  c.kv_heads = integer("kv_heads");
  c.mlp_hidden = integer("mlp_hidden");
  c.vocab = integer("vocab");
  c.context = integer("context");
  c.rope_theta = number("rope_theta");
  c.rms_eps = number("rms_eps");
  c.tied = boolean("tied");
  c.attention_bias = boolean("attention_bias");
  c.mlp_bias = boolean("mlp_bias");
  c.init_std = number("init_std");
  c.dropout = number("dropout");
  const Json& r = need("rope_scaling");
  c.rope_scaling = RopeScaling{};
  if (!r.is_null()) {
    if (!r.is_object()) input_error("Llama configuration: 'rope_scaling' must be an object or null, got " + r.dump());
    try {
      c.rope_scaling.factor = r.at("factor").get<double>();
      c.rope_scaling.low_freq_factor = r.at("low_freq_factor").get<double>();
      c.rope_scaling.high_freq_factor = r.at("high_freq_factor").get<double>();
      c.rope_scaling.original_context = r.at("original_max_position_embeddings").get<int64_t>();
    } catch (const Json::exception& e) {
      input_error(std::string("Llama configuration: 'rope_scaling' ") + r.dump() + " is malformed (" + e.what() + ")");
    }
  }
  check_llama_config(c);
  return c;
}

int64_t llama_num_parameters(const LlamaConfig& c, bool include_token_table) {
  check_llama_config(c);
  const int64_t w = c.width, d = c.width / c.heads, kv = c.kv_heads * d;
  const int64_t attn = w * (w + 2 * kv) + w * w + (c.attention_bias ? w + 2 * kv + w : 0);
  const int64_t mlp = 3 * w * c.mlp_hidden + (c.mlp_bias ? 2 * c.mlp_hidden + w : 0);
  const int64_t block = attn + mlp + 2 * w;
  const int64_t table = c.vocab * w;
  return (include_token_table || !c.tied ? table : 0) + (c.tied ? 0 : table) + c.layers * block + w;
}

double llama_flops_per_token(const LlamaConfig& c, int64_t seq_len) {
  const int64_t t = seq_len > 0 ? seq_len : c.context;
  return 6.0 * static_cast<double>(llama_num_parameters(c, false)) +
         12.0 * static_cast<double>(c.layers) * static_cast<double>(c.width) * static_cast<double>(t);
}

// ---- the model

Llama::Llama(const LlamaConfig& cfg, uint64_t seed) : cfg_(cfg) {
  check_llama_config(cfg);
  Generator gen(seed);
  wte = register_module("wte", std::make_shared<Embedding>(cfg.vocab, cfg.width, gen));
  {
    NoGradGuard no_grad;
    wte->weight.copy_(scale(wte->weight, cfg.init_std));  // drawn from N(0, 1)
  }
  rotary_ = std::make_shared<RotaryCache>(cfg.width / cfg.heads, cfg.context, cfg.rope_theta, cfg.rope_scaling);
  TransformerBlockOptions opt;
  opt.causal = true;
  opt.dropout = cfg.dropout;
  opt.bias = false;
  opt.attention_bias = cfg.attention_bias;
  opt.mlp_bias = cfg.mlp_bias;
  opt.init_std = cfg.init_std;
  opt.scale_residual_init = false;
  opt.eps = cfg.rms_eps;
  opt.rms_norm = true;
  opt.gated_mlp = true;
  opt.mlp_hidden = cfg.mlp_hidden;
  opt.kv_heads = cfg.kv_heads;
  opt.rotary = rotary_;
  blocks_ = register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < cfg.layers; ++i)
    h.push_back(blocks_->add(std::make_shared<TransformerBlock>(cfg.width, cfg.heads, gen, opt)));
  ln_f = register_module("ln_f", std::make_shared<RMSNorm>(Shape{cfg.width}, cfg.rms_eps, true));
  if (!cfg.tied) {
    lm_head = register_module("lm_head", std::make_shared<Linear>(cfg.width, cfg.vocab, gen, false));
    NoGradGuard no_grad;
    const double s = std::sqrt(2.0 / static_cast<double>(cfg.width + cfg.vocab));  // Linear's own draw
    lm_head->weight.copy_(scale(lm_head->weight, cfg.init_std / s));
  }
  embed_group_ = LayerGroup("embeddings", {wte->weight});
  for (int64_t i = 0; i < cfg.layers; ++i)
    block_groups_.emplace_back("h." + std::to_string(i), h[static_cast<size_t>(i)]->parameters());
  std::vector<Tensor> head = ln_f->parameters();
  head.push_back(head_weight());
  head_group_ = LayerGroup("head", head);
}

std::vector<LayerGroup*> Llama::layer_groups() {
  std::vector<LayerGroup*> out{&embed_group_};
  for (LayerGroup& g : block_groups_) out.push_back(&g);
  out.push_back(&head_group_);
  return out;
}

void Llama::check_tokens(const Tensor& tokens, int64_t start, const char* what) const {
  TANDEM_CHECK(tokens.defined() && tokens.dim() == 2 && (tokens.dtype() == DType::i32 || tokens.dtype() == DType::i64),
               what, ": tokens must be i32 or i64 [B, T], got ",
               tokens.defined() ? tokens.str() : std::string("an undefined tensor"));
  const int64_t t = tokens.size(1);
  TANDEM_CHECK(t >= 1, what, ": no tokens in ", tokens.str());
  TANDEM_CHECK(start + t <= cfg_.context, what, ": ", start > 0 ? detail::cat(t, " tokens after ", start) : detail::cat(t, " tokens"),
               " exceed the context of ", cfg_.context);
  if (!tokens.device().is_cpu()) return;  // checked on the device by the embedding
  const Tensor c = tokens.contiguous();
  for (int64_t k = 0; k < c.numel(); ++k) {
    const int64_t v = c.dtype() == DType::i32 ? c.data<int32_t>()[k] : c.data<int64_t>()[k];
    TANDEM_CHECK(v >= 0 && v < cfg_.vocab, what, ": token ", v, " at [", k / t, ", ", k % t,
                 "] is outside the vocabulary [0, ", cfg_.vocab, ")");
  }
}

Tensor Llama::hidden(const Tensor& tokens, GptCache* cache) {
  if (!cache) documents_for(tokens, h, "Llama");  // the blocks' attention and rotation read them
  Tensor x = embed_group_.run(tokens, [&](const Tensor& in) {
    Tensor e = embedding(wte->weight, in);
    // The residual stream in the activation type of the precision mode, as GPT keeps it.
    if (e.device().is_cuda()) {
      const DType act = activation_dtype(current_precision());
      if (e.dtype() != act) e = cast(e, act);
    }
    return e;
  });
  if (cache) {
    if (cache->layers.size() != h.size()) {
      TANDEM_CHECK(cache->length == 0, "Llama.forward_cached: the cache has ", cache->layers.size(),
                   " layers, the model ", h.size());
      cache->layers.assign(h.size(), KVCache());
    }
    const int64_t start = cache->length;
    for (size_t i = 0; i < h.size(); ++i)
      x = block_groups_[i].run(x, [&](const Tensor& in) { return h[i]->forward_cached(in, cache->layers[i], cfg_.context); });
    cache->length = start + tokens.size(1);
  } else {
    for (size_t i = 0; i < h.size(); ++i)
      x = block_groups_[i].run(x, [&](const Tensor& in) {
        if (!is_training()) return h[i]->forward(in);
        return run_block(*h[i], in);
      });
  }
  return x;
}

Tensor Llama::forward(const Tensor& tokens) {
  check_tokens(tokens, 0, "Llama");
  return head_group_.run(hidden(tokens, nullptr),
                         [&](const Tensor& x) { return linear(ln_f->forward(x), head_weight(), Tensor()); });
}

Tensor Llama::loss(const Tensor& tokens, const Tensor& targets, int64_t ignore_index) {
  check_tokens(tokens, 0, "Llama");
  return head_group_.run(hidden(tokens, nullptr), [&](const Tensor& x) {
    return linear_cross_entropy(ln_f->forward(x), head_weight(), targets, Reduction::Mean, ignore_index);
  });
}

Tensor Llama::forward_cached(const Tensor& tokens, GptCache& cache) {
  check_tokens(tokens, cache.length, "Llama.forward_cached");
  NoGradGuard no_grad;
  return head_group_.run(hidden(tokens, &cache),
                         [&](const Tensor& x) { return linear(ln_f->forward(x), head_weight(), Tensor()); });
}

std::vector<int64_t> Llama::generate(const std::vector<int64_t>& prompt, int64_t n, const SampleOptions& opt,
                                     const std::function<void(int64_t)>& on_token) {
  return generate_tokens(
      *this, [this](const Tensor& t, GptCache& c) { return forward_cached(t, c); }, cfg_.context, cfg_.vocab,
      wte->weight.device(), prompt, n, opt, on_token, "Llama");
}

std::string Llama::describe() const {
  return detail::cat("Llama(", cfg_.layers, " layers, ", cfg_.heads, " heads, ", cfg_.kv_heads, " key-value heads, width ",
                     cfg_.width, ", MLP ", cfg_.mlp_hidden, ", context ", cfg_.context, ", vocabulary ", cfg_.vocab,
                     cfg_.tied ? ", tied" : ", untied", ")\n") +
         Module::describe();
}

}  // namespace tandem::nn
