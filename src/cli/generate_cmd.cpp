// `tandem generate`: text from a GPT checkpoint. The prompt is encoded (its bytes, for a byte-level model; its
// ids, with a tokenizer.json) and each token drawn is written to stdout as the bytes it stands for, as soon as it
// is drawn.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tandem/checkpoint.h"
#include "tandem/data/tokenizer.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/pretrained.h"

namespace tandem::cli {

namespace {

struct GenerateConfig {
  std::string checkpoint, prompt = "\n", prompt_file, device = "cpu", tokenizer;
  int64_t tokens = 300;
  double temperature = 0.8;
  int64_t top_k = 200;
  double top_p = 1.0;
  int64_t stop_token = -2;  // -2: the model's end-of-text token (a Hugging Face directory's); -1: none
  uint64_t seed = 1;
  bool no_prompt = false;
  int threads = 0;
};

[[noreturn]] void input_error(const std::string& msg) { throw Error(Error::Kind::Input, msg); }

// A language model to sample from: a GPT or Llama checkpoint of tandem train, or a Hugging Face directory.
struct Decoder {
  std::shared_ptr<nn::Module> model;
  nn::GptConfig gpt;      // when a GPT
  nn::LlamaConfig llama;  // when a Llama
  bool is_llama = false;
  int64_t context = 0, vocab = 0;
  int64_t eos = -1;  // a Hugging Face model's end-of-text token (config.json's eos_token_id)
};

Decoder load_decoder(const std::string& path) {
  Decoder d;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    nn::Pretrained p = nn::from_pretrained(path);
    d.model = p.model;
    const auto cfg = nlohmann::json::parse(p.config_json);
    if (cfg.contains("eos_token_id")) {
      const auto& e = cfg["eos_token_id"];
      if (e.is_number_integer()) d.eos = e.get<int64_t>();
      if (e.is_array() && !e.empty() && e[0].is_number_integer()) d.eos = e[0].get<int64_t>();
    }
  } else {
    const std::string what = "checkpoint '" + path + "'";
    const auto meta = nlohmann::json::parse(checkpoint_meta(path));
    if (meta.value("model", std::string()) == "llama" && meta.contains("llama")) {
      d.model = std::make_shared<nn::Llama>(nn::llama_config_from_json(meta["llama"].dump()));
    } else {
      d.model = std::make_shared<nn::GPT>(nn::gpt_config_from_meta(meta.dump(), what));
    }
    load_checkpoint(path, *d.model, nullptr);
  }
  if (auto* l = dynamic_cast<nn::Llama*>(d.model.get())) {
    d.is_llama = true;
    d.llama = l->config();
    d.context = d.llama.context;
    d.vocab = d.llama.vocab;
  } else {
    d.gpt = dynamic_cast<nn::GPT&>(*d.model).config();
    d.context = d.gpt.context;
    d.vocab = d.gpt.used_vocab();
  }
  return d;
}

// The tokenizer to read the prompt and write the text with: --tokenizer, or a tokenizer.json beside the
// checkpoint (in a Hugging Face directory); none (byte-level) when neither is there.
std::optional<data::Tokenizer> find_tokenizer(const GenerateConfig& cfg) {
  std::string path = cfg.tokenizer;
  if (path.empty()) {
    std::error_code dir_ec;
    const std::filesystem::path where = std::filesystem::is_directory(cfg.checkpoint, dir_ec)
                                            ? std::filesystem::path(cfg.checkpoint)
                                            : std::filesystem::path(cfg.checkpoint).parent_path();
    const std::filesystem::path beside = where / "tokenizer.json";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(beside, ec)) return std::nullopt;
    path = beside.string();
    std::fprintf(stderr, "tandem: reading the prompt and writing the text with %s (beside the checkpoint)\n",
                 path.c_str());
  }
  return data::Tokenizer::from_file(path);
}

int run_generate(const GenerateConfig& cfg) {
  const std::string what = "checkpoint '" + cfg.checkpoint + "'";
  Decoder dec = load_decoder(cfg.checkpoint);
  struct {
    int64_t vocab, context;
  } gc{dec.vocab, dec.context};
  const std::optional<data::Tokenizer> tok = find_tokenizer(cfg);
  if (!tok && gc.vocab != 256)
    input_error(detail::cat(what, " is a model of ", gc.vocab, " tokens; without a tokenizer tandem generate reads the ",
                            "prompt and writes the text byte by byte, which needs the byte vocabulary of 256: give the ",
                            "model's tokenizer.json with --tokenizer (or put it beside the checkpoint)"));
  if (tok && tok->vocab_size() > gc.vocab)
    input_error(detail::cat("tokenizer '", tok->path(), "' has ", tok->vocab_size(), " tokens, more than the ",
                            gc.vocab, " of ", what, ": give the tokenizer the model was trained with"));
  std::string prompt = cfg.prompt;
  if (!cfg.prompt_file.empty()) {
    std::ifstream in(cfg.prompt_file, std::ios::binary);
    if (!in) input_error("cannot read the prompt file '" + cfg.prompt_file + "'");
    prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (prompt.empty()) input_error("the prompt is empty: give at least one byte (--prompt or --prompt-file)");
  std::vector<int64_t> tokens;
  if (tok) {
    for (uint32_t id : tok->encode(prompt)) tokens.push_back(id);
  } else {
    for (unsigned char c : prompt) tokens.push_back(c);
  }
  if (static_cast<int64_t>(tokens.size()) > gc.context)
    input_error(detail::cat("the prompt's ", tokens.size(), tok ? " tokens" : " bytes", " exceed the model's context of ",
                            gc.context, " tokens: give a shorter one"));
  if (cfg.threads > 0) set_num_threads(cfg.threads);
  const Device device = Device::parse(cfg.device);
  check_device(device);

  nn::Module& model = *dec.model;
  model.to(device);
  model.eval();

  if (!cfg.no_prompt) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  nn::SampleOptions opt;
  opt.temperature = cfg.temperature;
  opt.top_k = cfg.top_k;
  opt.top_p = cfg.top_p;
  opt.seed = cfg.seed;
  opt.stop_token = cfg.stop_token >= -1 ? cfg.stop_token : dec.eos;
  auto write = [&](int64_t t) {
    if (!tok) {
      std::fputc(static_cast<int>(t), stdout);
    } else if (tok->id_to_token(static_cast<uint32_t>(t))) {
      // A token's bytes as they come; a character split between tokens is whole once both are written.
      // Rows of the model beyond the tokenizer's vocabulary (padding) stand for no text.
      const std::string b = tok->decode_bytes({static_cast<uint32_t>(t)});
      std::fwrite(b.data(), 1, b.size(), stdout);
    }
    std::fflush(stdout);
  };
  if (dec.is_llama)
    dynamic_cast<nn::Llama&>(model).generate(tokens, cfg.tokens, opt, write);
  else
    dynamic_cast<nn::GPT&>(model).generate(tokens, cfg.tokens, opt, write);
  return 0;
}

}  // namespace

Runner add_generate_command(CLI::App& app) {
  auto cfg = std::make_shared<GenerateConfig>();
  CLI::App* sub = app.add_subcommand("generate", "Write text sampled from a GPT or Llama checkpoint, or a Hugging Face "
                                     "model directory");
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("--checkpoint", cfg->checkpoint,
                  "A GPT or Llama checkpoint of tandem train, or a Hugging Face model directory (config.json and "
                  "model.safetensors: GPT-2, Llama)")
      ->required();
  auto* prompt =
      sub->add_option("--prompt", cfg->prompt, "The text to continue; its bytes are the first tokens (default: a newline)");
  sub->add_option("--prompt-file", cfg->prompt_file, "Read the prompt from this file instead (its bytes as they are)")
      ->excludes(prompt);
  sub->add_option("--tokenizer", cfg->tokenizer,
                  "The model's tokenizer.json: the prompt is encoded and the text decoded with it (default: a "
                  "tokenizer.json beside the checkpoint, else byte by byte)");
  sub->add_option("-n,--tokens", cfg->tokens, "How many tokens (bytes, for a byte-level model) to generate")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  sub->add_option("--temperature", cfg->temperature,
                  "Divides the logits before each draw: below 1 favours likely bytes; 0 always takes the most likely")
      ->check(finite_in(0.0, 1e6))
      ->capture_default_str();
  sub->add_option("--top-k", cfg->top_k, "Draw only from the k most likely bytes (0: from all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  sub->add_option("--top-p", cfg->top_p, "Draw only from the most likely tokens whose probabilities add up to p "
                  "(nucleus sampling; 1: from all)")
      ->check(finite_in(1e-9, 1.0))
      ->capture_default_str();
  sub->add_option("--stop-token", cfg->stop_token,
                  "Stop after drawing this token id (default: a Hugging Face model's eos_token_id; -1: never)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
  sub->add_option("--seed", cfg->seed, "The draws' seed: the same seed, checkpoint and device give the same text")
      ->capture_default_str();
  sub->add_option("--device", cfg->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--threads", cfg->threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096));
  sub->add_flag("--no-prompt", cfg->no_prompt, "Write only the generated bytes, not the prompt before them");
  sub->footer(
      "Writes the prompt, then each generated token as soon as it is drawn, to stdout as raw bytes (no newline\n"
      "is added). The prompt runs through the model once; each further token reuses the cached keys and values.\n"
      "Past the model's context each token is drawn from the last context tokens. A model of more than 256\n"
      "tokens needs its tokenizer.json (--tokenizer, or the file beside the checkpoint).\n"
      "Example: tandem generate --checkpoint gpt.ckpt --prompt \"ROMEO:\" -n 300 --temperature 0.8 --top-k 200");
  return [cfg] { return run_generate(*cfg); };
}

}  // namespace tandem::cli
