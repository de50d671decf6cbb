// Hugging Face directories in and out. Each family's adapter lists how every tandem parameter is made of the
// file's tensors (rows stacked, a Conv1D weight transposed, a token table padded with zero rows); loading and
// saving walk that list both ways.
#include "tandem/nn/pretrained.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/safe_file.h"
#include "tandem/autograd.h"
#include "tandem/error.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/ops.h"
#include "tandem/safetensors.h"

namespace tandem::nn {

namespace {

using Json = nlohmann::json;

[[noreturn]] void refuse(const std::string& dir, const std::string& why) {
  throw Error(Error::Kind::Input, "the model in '" + dir + "': " + why);
}

// How one tandem parameter is made of the file's tensors: their rows stacked in order (each [rows, ...]),
// each transposed first when `transpose` (GPT-2's Conv1D weights are [in, out]).
struct Piece {
  std::string param;
  std::vector<std::string> sources;
  std::vector<int64_t> rows;  // each source's rows in the parameter (one source: the whole)
  bool transpose = false;
  int64_t file_rows = 0;      // one source of fewer rows than the parameter: the rest is padding, zero (0: none)
};

// GPT-2's token tables are built with their rows padded to a multiple of this (50257 -> 50304): the products
// with the table then run at full speed on GPUs.
constexpr int64_t kVocabMultiple = 64;

struct Family {
  std::vector<Piece> pieces;
  std::set<std::string> ignored;  // buffers transformers writes that tandem makes itself
  std::vector<std::string> ignored_suffixes;
};

// ---- Llama

Family llama_family(const LlamaConfig& c, const std::string& p) {
  Family f;
  const int64_t d = c.width / c.heads, kv = c.kv_heads * d;
  f.pieces.push_back({"wte.weight", {p + "embed_tokens.weight"}, {}, false});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string l = p + "layers." + std::to_string(i) + ".", h = "h." + std::to_string(i) + ".";
    f.pieces.push_back({h + "ln_1.weight", {l + "input_layernorm.weight"}, {}, false});
    f.pieces.push_back({h + "attn.c_attn.weight",
                        {l + "self_attn.q_proj.weight", l + "self_attn.k_proj.weight", l + "self_attn.v_proj.weight"},
                        {c.width, kv, kv}, false});
    if (c.attention_bias)
      f.pieces.push_back({h + "attn.c_attn.bias",
                          {l + "self_attn.q_proj.bias", l + "self_attn.k_proj.bias", l + "self_attn.v_proj.bias"},
                          {c.width, kv, kv}, false});
    f.pieces.push_back({h + "attn.c_proj.weight", {l + "self_attn.o_proj.weight"}, {}, false});
    if (c.attention_bias) f.pieces.push_back({h + "attn.c_proj.bias", {l + "self_attn.o_proj.bias"}, {}, false});
    f.pieces.push_back({h + "ln_2.weight", {l + "post_attention_layernorm.weight"}, {}, false});
    f.pieces.push_back({h + "mlp.c_fc.weight", {l + "mlp.gate_proj.weight", l + "mlp.up_proj.weight"},
                        {c.mlp_hidden, c.mlp_hidden}, false});
    if (c.mlp_bias)
      f.pieces.push_back({h + "mlp.c_fc.bias", {l + "mlp.gate_proj.bias", l + "mlp.up_proj.bias"},
                          {c.mlp_hidden, c.mlp_hidden}, false});
    f.pieces.push_back({h + "mlp.c_proj.weight", {l + "mlp.down_proj.weight"}, {}, false});
    if (c.mlp_bias) f.pieces.push_back({h + "mlp.c_proj.bias", {l + "mlp.down_proj.bias"}, {}, false});
  }
  f.pieces.push_back({"ln_f.weight", {p + "norm.weight"}, {}, false});
  if (!c.tied) f.pieces.push_back({"lm_head.weight", {"lm_head.weight"}, {}, false});
  if (c.tied) f.ignored.insert("lm_head.weight");  // a tied head: the token table, whatever a file holds beside it
  f.ignored_suffixes.push_back(".rotary_emb.inv_freq");
  return f;
}

double number_or(const Json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

LlamaConfig llama_from_hf(const Json& j, const std::string& dir, int64_t context) {
  auto integer = [&](const char* key) -> int64_t {
    if (!j.contains(key) || !j[key].is_number_integer()) refuse(dir, std::string("config.json has no integer '") + key + "'");
    return j[key].get<int64_t>();
  };
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu")
    refuse(dir, "config.json's hidden_act is '" + act + "'; tandem's Llama takes silu (SwiGLU) only");
  if (j.contains("sliding_window") && !j["sliding_window"].is_null())
    refuse(dir, "config.json sets sliding_window (" + j["sliding_window"].dump() +
                    "): tandem's Llama attends to every earlier position");
  LlamaConfig c;
  c.layers = integer("num_hidden_layers");
  c.width = integer("hidden_size");
  c.heads = integer("num_attention_heads");
  c.kv_heads = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_number_integer()
                   ? j["num_key_value_heads"].get<int64_t>()
                   : c.heads;
  c.mlp_hidden = integer("intermediate_size");
  c.vocab = integer("vocab_size");
  const int64_t max_positions = j.contains("max_position_embeddings") ? integer("max_position_embeddings") : 2048;
  c.context = context > 0 ? context : max_positions;
  if (j.contains("head_dim") && j["head_dim"].is_number_integer() && c.heads > 0 &&
      j["head_dim"].get<int64_t>() != c.width / c.heads)
    refuse(dir, "config.json's head_dim " + j["head_dim"].dump() + " is not hidden_size / num_attention_heads (" +
                    std::to_string(c.width / c.heads) + "), which tandem's Llama takes");
  c.rope_theta = number_or(j, "rope_theta", 10000.0);
  c.rms_eps = number_or(j, "rms_norm_eps", 1e-6);
  c.init_std = number_or(j, "initializer_range", 0.02);
  c.tied = j.value("tie_word_embeddings", false);
  c.attention_bias = j.value("attention_bias", false);
  c.mlp_bias = j.value("mlp_bias", false);
  c.dropout = number_or(j, "attention_dropout", 0.0);
  if (c.dropout != 0.0) refuse(dir, "config.json's attention_dropout " + j["attention_dropout"].dump() +
                                        ": tandem's Llama drops attention and residual branches alike; set it to 0");
  c.rope_scaling = RopeScaling{};
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const Json& r = j["rope_scaling"];
    const std::string type = r.value("rope_type", r.value("type", std::string()));
    if (type == "default" || type.empty()) {
      // no scaling
    } else if (type == "llama3") {
      c.rope_scaling.factor = number_or(r, "factor", 0.0);
      c.rope_scaling.low_freq_factor = number_or(r, "low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = number_or(r, "high_freq_factor", 4.0);
      c.rope_scaling.original_context = static_cast<int64_t>(number_or(r, "original_max_position_embeddings", 8192));
    } else {
      refuse(dir, "config.json's rope_scaling type is '" + type + "'; tandem takes llama3 (or none)");
    }
  }
  try {
    check_llama_config(c);
  } catch (const Error& e) {
    refuse(dir, std::string("config.json describes no model tandem builds: ") + e.what());
  }
  return c;
}

Json llama_to_hf(const LlamaConfig& c, Json j) {
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = c.width;
  j["intermediate_size"] = c.mlp_hidden;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.width / c.heads;
  j["vocab_size"] = c.vocab;
  if (!j.contains("max_position_embeddings") || !j["max_position_embeddings"].is_number_integer() ||
      j["max_position_embeddings"].get<int64_t>() < c.context)
    j["max_position_embeddings"] = c.context;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.factor > 0.0)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_context}};
  else
    j["rope_scaling"] = nullptr;
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tied;
  j["attention_bias"] = c.attention_bias;
  j["mlp_bias"] = c.mlp_bias;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = c.init_std;
  return j;
}

// ---- GPT-2

Family gpt2_family(const GptConfig& c, const std::string& p) {
  Family f;
  f.pieces.push_back({"wte.weight", {p + "wte.weight"}, {}, false, c.used_vocab() < c.vocab ? c.used_vocab() : 0});
  f.pieces.push_back({"wpe.weight", {p + "wpe.weight"}, {}, false});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string l = p + "h." + std::to_string(i) + ".", h = "h." + std::to_string(i) + ".";
    for (const char* ln : {"ln_1", "ln_2"})
      for (const char* w : {".weight", ".bias"}) f.pieces.push_back({h + ln + w, {l + ln + w}, {}, false});
    for (const char* lin : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
      f.pieces.push_back({h + lin + ".weight", {l + lin + ".weight"}, {}, true});
      f.pieces.push_back({h + lin + ".bias", {l + lin + ".bias"}, {}, false});
    }
    f.ignored.insert(l + "attn.bias");  // the causal masks transformers keeps as buffers
    f.ignored.insert(l + "attn.masked_bias");
  }
  f.pieces.push_back({"ln_f.weight", {p + "ln_f.weight"}, {}, false});
  f.pieces.push_back({"ln_f.bias", {p + "ln_f.bias"}, {}, false});
  f.ignored.insert("lm_head.weight");  // tied to wte
  return f;
}

GptConfig gpt2_from_hf(const Json& j, const std::string& dir) {
  auto integer = [&](const char* key, const char* alt) -> int64_t {
    for (const char* k : {key, alt})
      if (k && j.contains(k) && j[k].is_number_integer()) return j[k].get<int64_t>();
    refuse(dir, std::string("config.json has no integer '") + key + "'");
  };
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    refuse(dir, "config.json's activation_function is '" + act + "'; tandem's GPT takes GPT-2's tanh GELU (gelu_new)");
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"].get<int64_t>() != 4 * integer("n_embd", "hidden_size"))
    refuse(dir, "config.json's n_inner " + j["n_inner"].dump() + " is not 4 n_embd, which tandem's GPT takes");
  if (std::abs(number_or(j, "layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12)
    refuse(dir, "config.json's layer_norm_epsilon " + j["layer_norm_epsilon"].dump() + " is not GPT-2's 1e-5");
  if (!j.value("scale_attn_weights", true)) refuse(dir, "config.json sets scale_attn_weights false");
  if (j.value("scale_attn_by_inverse_layer_idx", false)) refuse(dir, "config.json sets scale_attn_by_inverse_layer_idx");
  if (!j.value("tie_word_embeddings", true)) refuse(dir, "config.json unties the head (tie_word_embeddings false)");
  GptConfig c;
  c.layers = integer("n_layer", "num_hidden_layers");
  c.heads = integer("n_head", "num_attention_heads");
  c.width = integer("n_embd", "hidden_size");
  c.context = integer("n_positions", "max_position_embeddings");
  c.vocab = integer("vocab_size", nullptr);
  if (c.vocab > 0 && c.vocab % kVocabMultiple != 0) {  // the table padded; the model keeps the file's vocabulary
    c.logical_vocab = c.vocab;
    c.vocab = (c.vocab + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
  }
  c.dropout = number_or(j, "resid_pdrop", 0.0);
  c.bias = true;
  try {
    check_gpt_config(c);
  } catch (const Error& e) {
    refuse(dir, std::string("config.json describes no model tandem builds: ") + e.what());
  }
  return c;
}

Json gpt2_to_hf(const GptConfig& c, Json j) {
  TANDEM_CHECK(c.bias, "save_pretrained: GPT-2's format has biases everywhere; this GPT has none (bias false)");
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["n_embd"] = c.width;
  j["n_layer"] = c.layers;
  j["n_head"] = c.heads;
  j["n_positions"] = c.context;
  j["n_ctx"] = c.context;
  j["vocab_size"] = c.used_vocab();  // the table's padding cut off (save)
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  j["n_inner"] = nullptr;
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) j[k] = c.dropout;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  return j;
}

// The prefix the file's names carry ("model." / "transformer." for the ...ForCausalLM and LMHead classes,
// nothing for the bare models).
std::string prefix_of(const SafetensorsModel& files, const std::string& with, const std::string& probe) {
  return files.find(with + probe) ? with : "";
}

Json read_config(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "config.json";
  std::ifstream in(p);
  if (!in) refuse(dir, "there is no config.json (a Hugging Face model directory holds config.json and model.safetensors)");
  try {
    Json j = Json::parse(in);
    if (!j.is_object()) refuse(dir, "config.json is not a JSON object");
    return j;
  } catch (const Json::exception& e) {
    refuse(dir, std::string("config.json is not JSON (") + e.what() + ")");
  }
}

void load(Module& model, const Family& f, const SafetensorsModel& files, const std::string& dir, Device device) {
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.named_parameters()) params[name] = t;
  std::set<std::string> used;
  // Every tensor read and checked before any parameter changes.
  std::vector<std::pair<Tensor, Tensor>> assign;
  for (const Piece& pc : f.pieces) {
    auto it = params.find(pc.param);
    TANDEM_ASSERT(it != params.end(), "the adapter names a parameter the model lacks: ", pc.param);
    const Tensor& dst = it->second;
    std::vector<Tensor> parts;
    for (size_t k = 0; k < pc.sources.size(); ++k) {
      const std::string& src = pc.sources[k];
      if (!files.find(src)) refuse(dir, "the files hold no '" + src + "' (a truncated or other model?)");
      Tensor t = files.tensor(src, DType::f32);
      if (pc.transpose) {
        if (t.dim() != 2) refuse(dir, "'" + src + "' is " + shape_str(t.shape()) + ", not a 2-D Conv1D weight");
        t = t.transpose(0, 1).contiguous();
      }
      Shape want = dst.shape();
      if (pc.sources.size() > 1) want[0] = pc.rows[k];
      if (pc.file_rows > 0) want[0] = pc.file_rows;
      if (t.shape() != want)
        refuse(dir, "'" + src + "' is " + shape_str(t.shape()) + " where the configuration makes it " + shape_str(want));
      parts.push_back(t);
      used.insert(src);
    }
    if (pc.file_rows > 0) {  // the padding rows: zero
      Shape pad = dst.shape();
      pad[0] -= pc.file_rows;
      parts.push_back(Tensor::zeros(pad));
    }
    Tensor whole = parts.size() == 1 ? parts[0] : concat(parts, 0);
    assign.emplace_back(dst, whole);
  }
  for (const std::string& name : files.names()) {
    if (used.count(name) || f.ignored.count(name)) continue;
    bool skip = false;
    for (const std::string& s : f.ignored_suffixes) skip = skip || (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0);
    if (!skip) refuse(dir, "the files hold '" + name + "', which the configuration's model has no place for");
  }
  NoGradGuard no_grad;
  for (auto& [dst, src] : assign) Tensor(dst).detach().copy_(src.to(device));
}

void save(Module& model, const Family& f, const std::string& file, DType dtype) {
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.named_parameters()) params[name] = t;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Piece& pc : f.pieces) {
    Tensor t = params.at(pc.param).detach().cpu();
    if (pc.file_rows > 0) t = t.narrow(0, 0, pc.file_rows);  // the padding cut off
    int64_t row = 0;
    for (size_t k = 0; k < pc.sources.size(); ++k) {
      const int64_t n = pc.sources.size() > 1 ? pc.rows[k] : t.size(0);
      Tensor part = t.narrow(0, row, n);
      row += n;
      if (pc.transpose) part = part.transpose(0, 1);
      out.emplace_back(pc.sources[k], part.contiguous().to(dtype));
    }
  }
  write_safetensors(file, out, {{"format", "pt"}});
}

}  // namespace

Pretrained from_pretrained(const std::string& dir, Device device, int64_t context) {
  Json cfg = read_config(dir);
  const std::string type = cfg.value("model_type", std::string());
  SafetensorsModel files(dir);
  Pretrained out;
  out.config_json = cfg.dump();
  if (type == "llama") {
    LlamaConfig c = llama_from_hf(cfg, dir, context);
    auto m = std::make_shared<Llama>(c);
    m->to(device);
    load(*m, llama_family(c, prefix_of(files, "model.", "embed_tokens.weight")), files, dir, device);
    out.family = "llama";
    out.model = m;
  } else if (type == "gpt2") {
    GptConfig c = gpt2_from_hf(cfg, dir);
    auto m = std::make_shared<GPT>(c);
    m->to(device);
    load(*m, gpt2_family(c, prefix_of(files, "transformer.", "wte.weight")), files, dir, device);
    out.family = "gpt2";
    out.model = m;
  } else {
    refuse(dir, "config.json's model_type is '" + type + "'; tandem reads llama and gpt2");
  }
  return out;
}

void save_pretrained(Module& model, const std::string& dir, const std::string& config_json, DType dtype) {
  TANDEM_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, "save_pretrained: dtype ",
               dtype_name(dtype), " (f32, bf16 or f16)");
  Json base = Json::object();
  if (!config_json.empty()) {
    try {
      base = Json::parse(config_json);
    } catch (const Json::exception& e) {
      TANDEM_CHECK(false, "save_pretrained: the configuration given is not JSON (", e.what(), ")");
    }
  }
  Json cfg;
  Family f;
  if (auto* llama = dynamic_cast<Llama*>(&model)) {
    cfg = llama_to_hf(llama->config(), base);
    f = llama_family(llama->config(), "model.");
  } else if (auto* gpt = dynamic_cast<GPT*>(&model)) {
    cfg = gpt2_to_hf(gpt->config(), base);
    f = gpt2_family(gpt->config(), "transformer.");
  } else {
    TANDEM_CHECK(false, "save_pretrained: the model is neither a Llama nor a GPT (", model.describe(), ")");
  }
  cfg["torch_dtype"] = dtype == DType::f32 ? "float32" : dtype == DType::bf16 ? "bfloat16" : "float16";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TANDEM_CHECK(std::filesystem::is_directory(dir), "save_pretrained: cannot create the directory '", dir, "'");
  const std::string st = (std::filesystem::path(dir) / "model.safetensors").string();
  save(model, f, st, dtype);
  // A stale index would send readers to old shards.
  std::filesystem::remove(std::filesystem::path(dir) / "model.safetensors.index.json", ec);
  io::write_file_atomically((std::filesystem::path(dir) / "config.json").string(), "config.json", cfg.dump(2) + "\n");
}

}  // namespace tandem::nn
