// GPT: the model, its configuration as JSON, its size and cost, and sampling with a key-value cache.
#include "tandem/nn/gpt.h"
#include "tandem/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "tandem/autograd.h"

namespace tandem::nn {

RecomputePolicy parse_recompute(const std::string& name) {
  if (name == "none") return RecomputePolicy::none;
  if (name == "selective") return RecomputePolicy::selective;
  if (name == "full") return RecomputePolicy::full;
  throw Error(Error::Kind::Input, "activation recompute: '" + name + "' is not a policy (none, selective or full)");
}

const char* recompute_name(RecomputePolicy p) {
  switch (p) {
    case RecomputePolicy::selective: return "selective";
    case RecomputePolicy::full: return "full";
    default: return "none";
  }
}

Tensor CausalLm::documents_for(const Tensor& tokens, const std::vector<std::shared_ptr<TransformerBlock>>& blocks,
                               const char* what) {
  if (doc_pos_.defined()) {
    TANDEM_CHECK(doc_pos_.dtype() == DType::i32 && doc_pos_.dim() == 2 && doc_pos_.size(0) == tokens.size(0) &&
                     doc_pos_.size(1) == tokens.size(1) && doc_pos_.device() == tokens.device(),
                 what, ": the document positions ", doc_pos_.str(), " do not match the tokens ", tokens.str(),
                 " (i32, one per token, on their device); set them for this batch or clear them");
  }
  for (const auto& b : blocks) b->attn->set_document_positions(doc_pos_);
  return doc_pos_;
}

Tensor CausalLm::run_block(TransformerBlock& block, const Tensor& in) {
  switch (recompute_) {
    case RecomputePolicy::full: {
      std::vector<Generator*> gens;
      for (auto& [name, g] : block.named_generators()) gens.push_back(g);
      TransformerBlock* b = &block;
      return tandem::recompute([b](const Tensor& t) { return b->forward(t); }, in, block.parameters(), gens);
    }
    case RecomputePolicy::selective: {
      RecomputeRegion region;  // the block marks what it can make again (its norms', its activation's outputs)
      return region.close(block.forward(in));
    }
    default: return block.forward(in);
  }
}


namespace {
using Json = nlohmann::json;

constexpr const char* kKeys[] = {"layers", "heads", "width", "context", "vocab", "dropout", "bias", "logical_vocab"};

[[noreturn]] void input_error(const std::string& msg) { throw Error(Error::Kind::Input, msg); }
}  // namespace

// ---- configuration

void check_gpt_config(const GptConfig& c) {
  auto positive = [](int64_t v, const char* name) {
    if (v <= 0) input_error(detail::cat("GPT configuration: ", name, " ", v, " must be positive"));
  };
  positive(c.layers, "layers");
  positive(c.heads, "heads");
  positive(c.width, "width");
  positive(c.context, "context");
  positive(c.vocab, "vocab");
  if (c.width % c.heads != 0)
    input_error(detail::cat("GPT configuration: width ", c.width, " must be a multiple of heads ", c.heads));
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    input_error(detail::cat("GPT configuration: dropout ", c.dropout, " outside [0, 1)"));
  if (c.logical_vocab < 0 || c.logical_vocab > c.vocab)
    input_error(detail::cat("GPT configuration: logical_vocab ", c.logical_vocab, " must be in [1, vocab ", c.vocab,
                            "] (0: all of vocab)"));
}

std::string gpt_config_to_json(const GptConfig& c) {
  Json j = {{"layers", c.layers},   {"heads", c.heads},     {"width", c.width}, {"context", c.context},
            {"vocab", c.vocab},     {"dropout", c.dropout}, {"bias", c.bias}};
  if (c.used_vocab() < c.vocab) j["logical_vocab"] = c.logical_vocab;
  return j.dump();
}

namespace {
GptConfig config_from(const Json& j, const std::string& what) {
  if (!j.is_object()) input_error(what + ": the GPT configuration must be a JSON object, got " + j.dump());
  for (const auto& [key, value] : j.items())
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      input_error(what + ": unknown key '" + key +
                  "' in the GPT configuration (it takes layers, heads, width, context, vocab, dropout, bias and "
                  "optionally logical_vocab)");
  auto need = [&](const char* key) -> const Json& {
    if (!j.contains(key)) input_error(detail::cat(what, ": the GPT configuration has no '", key, "'"));
    return j[key];
  };
  auto integer = [&](const char* key) {
    const Json& v = need(key);
    if (!v.is_number_integer()) input_error(detail::cat(what, ": the GPT configuration's '", key, "' is ", v.dump(),
                                                        ", not an integer"));
    return v.get<int64_t>();
  };
  GptConfig c;
  c.layers = integer("layers");
  c.heads = integer("heads");
  c.width = integer("width");
  c.context = integer("context");
  c.vocab = integer("vocab");
  const Json& d = need("dropout");
  if (!d.is_number()) input_error(what + ": the GPT configuration's 'dropout' is " + d.dump() + ", not a number");
  c.dropout = d.get<double>();
  const Json& b = need("bias");
  if (!b.is_boolean()) input_error(what + ": the GPT configuration's 'bias' is " + b.dump() + ", not true or false");
  c.bias = b.get<bool>();
  if (j.contains("logical_vocab")) c.logical_vocab = integer("logical_vocab");
  try {
    check_gpt_config(c);
  } catch (const Error& e) {
    input_error(what + ": " + e.what());
  }
  return c;
}

Json parse(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    input_error(what + ": not valid JSON (" + e.what() + ")");
  }
}
}  // namespace

GptConfig gpt_config_from_json(const std::string& json) { return config_from(parse(json, "GPT configuration"), "GPT configuration"); }

std::string gpt_checkpoint_meta(const GptConfig& c) {
  Json j = {{"model", "gpt"}, {"gpt", Json::parse(gpt_config_to_json(c))}};
  return j.dump();
}

GptConfig gpt_config_from_meta(const std::string& meta_json, const std::string& what) {
  const Json meta = parse(meta_json, what + "'s meta data");
  if (!meta.is_object() || !meta.contains("model"))
    input_error(what + " is not a GPT checkpoint: its meta data names no model (a GPT's says \"model\": \"gpt\")");
  if (!meta["model"].is_string() || meta["model"].get<std::string>() != "gpt")
    input_error(what + " is not a GPT checkpoint: it holds the model " + meta["model"].dump() +
                " (a GPT's meta data says \"model\": \"gpt\")");
  if (!meta.contains("gpt")) input_error(what + ": its meta data says model gpt but has no \"gpt\" configuration");
  return config_from(meta["gpt"], what);
}

int64_t gpt_num_parameters(const GptConfig& c, bool include_position_table) {
  check_gpt_config(c);
  const int64_t w = c.width, b = c.bias ? 1 : 0;
  // Per block: two LayerNorms (w weights, w biases), c_attn (3 w^2 + 3 w), attn.c_proj (w^2 + w),
  // mlp.c_fc (4 w^2 + 4 w), mlp.c_proj (4 w^2 + w).
  const int64_t block = 2 * w * (1 + b) + 12 * w * w + b * (3 * w + w + 4 * w + w);
  return c.vocab * w + (include_position_table ? c.context * w : 0) + c.layers * block + w * (1 + b);
}

double gpt_flops_per_token(const GptConfig& c, int64_t seq_len) {
  const int64_t t = seq_len > 0 ? seq_len : c.context;
  return 6.0 * static_cast<double>(gpt_num_parameters(c, false)) +
         12.0 * static_cast<double>(c.layers) * static_cast<double>(c.width) * static_cast<double>(t);
}

// ---- the model

GPT::GPT(const GptConfig& cfg, uint64_t seed) : cfg_(cfg) {
  check_gpt_config(cfg);
  Generator gen(seed);
  auto table = [&](const char* name, int64_t rows) {
    auto e = register_module(name, std::make_shared<Embedding>(rows, cfg.width, gen));
    NoGradGuard no_grad;
    e->weight.copy_(scale(e->weight, 0.02));  // drawn from N(0, 1)
    return e;
  };
  wte = table("wte", cfg.vocab);
  wpe = table("wpe", cfg.context);
  TransformerBlockOptions opt;
  opt.causal = true;
  opt.dropout = cfg.dropout;
  opt.bias = cfg.bias;
  opt.init_std = 0.02;
  opt.residual_layers = cfg.layers;
  blocks_ = register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < cfg.layers; ++i)
    h.push_back(blocks_->add(std::make_shared<TransformerBlock>(cfg.width, cfg.heads, gen, opt)));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(Shape{cfg.width}, 1e-5, true, cfg.bias));
  gen_ = Generator(gen.next_below(uint64_t(1) << 62));
  embed_group_ = LayerGroup("embeddings", {wte->weight, wpe->weight});
  for (int64_t i = 0; i < cfg.layers; ++i) block_groups_.emplace_back("h." + std::to_string(i), h[static_cast<size_t>(i)]->parameters());
  std::vector<Tensor> head = ln_f->parameters();
  head.push_back(wte->weight);
  head_group_ = LayerGroup("head", head);
}

std::vector<LayerGroup*> GPT::layer_groups() {
  std::vector<LayerGroup*> out{&embed_group_};
  for (LayerGroup& g : block_groups_) out.push_back(&g);
  out.push_back(&head_group_);
  return out;
}

void GPT::check_tokens(const Tensor& tokens, int64_t start, const char* what) const {
  TANDEM_CHECK(tokens.defined() && tokens.dim() == 2 && (tokens.dtype() == DType::i32 || tokens.dtype() == DType::i64),
               what, ": tokens must be i32 or i64 [B, T], got ",
               tokens.defined() ? tokens.str() : std::string("an undefined tensor"));
  const int64_t t = tokens.size(1);
  TANDEM_CHECK(t >= 1, what, ": no tokens in ", tokens.str());
  TANDEM_CHECK(start + t <= cfg_.context, what, ": ", start > 0 ? detail::cat(t, " tokens after ", start) : detail::cat(t, " tokens"),
               " exceed the context of ", cfg_.context, " (the position table's rows)");
  if (!tokens.device().is_cpu()) return;  // checked on the device by the embedding (see the class notes)
  const Tensor c = tokens.contiguous();
  const int64_t n = c.numel();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = c.dtype() == DType::i32 ? c.data<int32_t>()[k] : c.data<int64_t>()[k];
    TANDEM_CHECK(v >= 0 && v < cfg_.used_vocab(), what, ": token ", v, " at [", k / t, ", ", k % t,
                 "] is outside the vocabulary [0, ", cfg_.used_vocab(), ")");
  }
}

// Each part runs as its layer group (whole parameters for it alone under --shard parameters).
Tensor GPT::hidden(const Tensor& tokens, GptCache* cache) {
  const int64_t start = cache ? cache->length : 0, t = tokens.size(1);
  const Tensor docs = cache ? Tensor() : documents_for(tokens, h, "GPT");
  Tensor x = embed_group_.run(tokens, [&](const Tensor& in) {
    // Packed documents: each token's row of the position table is its position in its document.
    Tensor e = add(embedding(wte->weight, in), docs.defined() ? embedding(wpe->weight, docs) : slice(wpe->weight, 0, start, t));
    // The residual stream in the activation type of the precision mode (bf16 or f16 on a GPU under those
    // modes): the blocks' 16-bit products then add to it without conversions.
    if (e.device().is_cuda()) {
      const DType act = activation_dtype(current_precision());
      if (e.dtype() != act) e = cast(e, act);
    }
    if (!cache && is_training() && cfg_.dropout > 0.0) e = dropout(e, cfg_.dropout, true, gen_);
    return e;
  });
  if (cache) {
    if (cache->layers.size() != h.size()) {
      TANDEM_CHECK(cache->length == 0, "GPT.forward_cached: the cache has ", cache->layers.size(),
                   " layers, the model ", h.size());
      cache->layers.assign(h.size(), KVCache());
    }
    for (size_t i = 0; i < h.size(); ++i)
      x = block_groups_[i].run(x, [&](const Tensor& in) { return h[i]->forward_cached(in, cache->layers[i], cfg_.context); });
    cache->length = start + t;
  } else {
    for (size_t i = 0; i < h.size(); ++i)
      x = block_groups_[i].run(x, [&](const Tensor& in) {
        if (!is_training()) return h[i]->forward(in);
        return run_block(*h[i], in);
      });
  }
  return x;
}

// The logits of the used vocabulary: the product with the table's first rows (a view), the padding's columns
// never formed; their rows' gradient is zero.
Tensor GPT::logits(const Tensor& x) {
  return linear(ln_f->forward(x), slice(wte->weight, 0, 0, cfg_.used_vocab()), Tensor());
}

Tensor GPT::forward(const Tensor& tokens) {
  check_tokens(tokens, 0, "GPT");
  return head_group_.run(hidden(tokens, nullptr), [&](const Tensor& x) { return logits(x); });
}

Tensor GPT::loss(const Tensor& tokens, const Tensor& targets, int64_t ignore_index) {
  check_tokens(tokens, 0, "GPT");
  // The whole table (its padded rows' product is the fast one), the padding's columns masked in the loss.
  const int64_t classes = cfg_.used_vocab() < cfg_.vocab ? cfg_.used_vocab() : 0;
  return head_group_.run(hidden(tokens, nullptr), [&](const Tensor& x) {
    return linear_cross_entropy(ln_f->forward(x), wte->weight, targets, Reduction::Mean, ignore_index, 0, classes);
  });
}

Tensor GPT::forward_cached(const Tensor& tokens, GptCache& cache) {
  check_tokens(tokens, cache.length, "GPT.forward_cached");
  NoGradGuard no_grad;
  return head_group_.run(hidden(tokens, &cache), [&](const Tensor& x) { return logits(x); });
}

int64_t sample_logits(const std::vector<float>& logits, const SampleOptions& opt, Generator& gen) {
  TANDEM_CHECK(!logits.empty(), "sample_logits: no logits");
  TANDEM_CHECK(std::isfinite(opt.temperature) && opt.temperature >= 0.0, "sample_logits: temperature ",
               opt.temperature, " must be a finite non-negative number");
  TANDEM_CHECK(opt.top_k >= 0, "sample_logits: top_k ", opt.top_k, " must be non-negative");
  const int64_t v = static_cast<int64_t>(logits.size());
  for (int64_t i = 0; i < v; ++i)
    TANDEM_CHECK(!std::isnan(logits[i]), "sample_logits: the logit of token ", i, " is NaN (a diverged model?)");
  if (opt.temperature == 0.0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  std::vector<double> l(logits.begin(), logits.end());
  for (double& x : l) x /= opt.temperature;
  if (opt.top_k > 0 && opt.top_k < v) {
    std::vector<double> sorted = l;
    std::nth_element(sorted.begin(), sorted.begin() + (opt.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[opt.top_k - 1];
    for (double& x : l)
      if (x < kth) x = -std::numeric_limits<double>::infinity();
  }
  const double top = *std::max_element(l.begin(), l.end());
  TANDEM_CHECK(std::isfinite(top), "sample_logits: the largest logit is ", top);
  TANDEM_CHECK(opt.top_p > 0.0 && opt.top_p <= 1.0, "sample_logits: top_p ", opt.top_p, " must be in (0, 1]");
  double total = 0.0;
  for (double& x : l) total += (x = std::exp(x - top));
  if (opt.top_p < 1.0) {
    // The smallest set of the most likely tokens whose probabilities reach top_p (ties at its edge kept).
    std::vector<double> sorted = l;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    double acc = 0.0, edge = sorted.front();
    for (double p : sorted) {
      edge = p;
      acc += p;
      if (acc >= opt.top_p * total) break;
    }
    total = 0.0;
    for (double& x : l) total += (x = x >= edge ? x : 0.0);
  }
  const double u = gen.next_double() * total;
  double acc = 0.0;
  int64_t last = 0;
  for (int64_t i = 0; i < v; ++i) {
    if (l[i] <= 0.0) continue;
    acc += l[i];
    last = i;
    if (u < acc) return i;
  }
  return last;  // u within rounding of the total
}

namespace {
// The model's training mode, restored on leaving the scope.
class EvalScope {
 public:
  explicit EvalScope(Module& m) : m_(m), was_(m.is_training()) { m.eval(); }
  ~EvalScope() { m_.train(was_); }

 private:
  Module& m_;
  bool was_;
};
}  // namespace

std::vector<int64_t> generate_tokens(Module& model, const std::function<Tensor(const Tensor&, GptCache&)>& step,
                                     int64_t context, int64_t vocab, Device device, const std::vector<int64_t>& prompt,
                                     int64_t n, const SampleOptions& opt, const std::function<void(int64_t)>& on_token,
                                     const char* who) {
  const int64_t t0 = static_cast<int64_t>(prompt.size());
  TANDEM_CHECK(t0 >= 1, who, ".generate: the prompt must hold at least one token");
  TANDEM_CHECK(t0 <= context, who, ".generate: the prompt's ", t0, " tokens exceed the context of ", context);
  TANDEM_CHECK(n >= 0, who, ".generate: n ", n, " must be non-negative");
  TANDEM_CHECK(std::isfinite(opt.temperature) && opt.temperature >= 0.0, who, ".generate: temperature ",
               opt.temperature, " must be a finite non-negative number");
  TANDEM_CHECK(opt.top_k >= 0, who, ".generate: top_k ", opt.top_k, " must be non-negative");
  TANDEM_CHECK(opt.top_p > 0.0 && opt.top_p <= 1.0, who, ".generate: top_p ", opt.top_p, " must be in (0, 1]");
  for (int64_t i = 0; i < t0; ++i)
    TANDEM_CHECK(prompt[i] >= 0 && prompt[i] < vocab, who, ".generate: prompt token ", prompt[i], " at ", i,
                 " is outside the vocabulary [0, ", vocab, ")");
  std::vector<int64_t> out;
  if (n == 0) return out;
  EvalScope eval(model);
  NoGradGuard no_grad;
  auto tokens = [&](std::vector<int64_t>::const_iterator first, std::vector<int64_t>::const_iterator last) {
    std::vector<int32_t> v(first, last);
    return Tensor::from_vector(v, {1, static_cast<int64_t>(v.size())}, device);
  };
  // The last position's logits, on the host.
  auto last_row = [](const Tensor& logits) { return logits.narrow(1, logits.size(1) - 1, 1).to_vector<float>(); };
  std::vector<int64_t> seq = prompt;
  Generator gen(opt.seed);
  GptCache cache;
  std::vector<float> logits = last_row(step(tokens(seq.begin(), seq.end()), cache));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t next = sample_logits(logits, opt, gen);
    seq.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == n || (opt.stop_token >= 0 && next == opt.stop_token)) break;
    if (cache.length < context) {
      logits = last_row(step(tokens(seq.end() - 1, seq.end()), cache));
    } else {  // cropped to the last `context` tokens, which now sit at other positions
      cache.clear();
      logits = last_row(step(tokens(seq.end() - context, seq.end()), cache));
    }
  }
  return out;
}

std::vector<int64_t> GPT::generate(const std::vector<int64_t>& prompt, int64_t n, const SampleOptions& opt,
                                   const std::function<void(int64_t)>& on_token) {
  return generate_tokens(
      *this, [this](const Tensor& t, GptCache& c) { return forward_cached(t, c); }, cfg_.context, cfg_.used_vocab(),
      wte->weight.device(), prompt, n, opt, on_token, "GPT");
}

std::string GPT::describe() const {
  return detail::cat("GPT(", cfg_.layers, " layers, ", cfg_.heads, " heads, width ", cfg_.width, ", context ",
                     cfg_.context, ", vocabulary ", cfg_.used_vocab(),
                     cfg_.used_vocab() < cfg_.vocab ? detail::cat(" (a table of ", cfg_.vocab, " rows)") : std::string(),
                     cfg_.bias ? "" : ", no bias",
                     cfg_.dropout > 0 ? detail::cat(", dropout ", cfg_.dropout) : std::string(), ")\n") +
         Module::describe();
}

}  // namespace tandem::nn
