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

#include "cli/commands.h"
#include "tandem/checkpoint.h"
#include "tandem/data/tokenizer.h"
#include "tandem/nn/gpt.h"

namespace tandem::cli {

namespace {

struct GenerateConfig {
  std::string checkpoint, prompt = "\n", prompt_file, device = "cpu", tokenizer;
  int64_t tokens = 300;
  double temperature = 0.8;
  int64_t top_k = 200;
  uint64_t seed = 1;
  bool no_prompt = false;
  int threads = 0;
};

[[noreturn]] void input_error(const std::string& msg) { throw Error(Error::Kind::Input, msg); }

// The tokenizer to read the prompt and write the text with: --tokenizer, or a tokenizer.json beside the
// checkpoint; none (byte-level) when neither is there.
std::optional<data::Tokenizer> find_tokenizer(const GenerateConfig& cfg) {
  std::string path = cfg.tokenizer;
  if (path.empty()) {
    const std::filesystem::path beside = std::filesystem::path(cfg.checkpoint).parent_path() / "tokenizer.json";
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
  const nn::GptConfig gc = nn::gpt_config_from_meta(checkpoint_meta(cfg.checkpoint), what);
  const std::optional<data::Tokenizer> tok = find_tokenizer(cfg);
  if (!tok && gc.vocab != 256)
    input_error(detail::cat(what, " is a GPT of ", gc.vocab, " tokens; without a tokenizer tandem generate reads the ",
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

  nn::GPT model(gc);
  load_checkpoint(cfg.checkpoint, model, nullptr);
  model.to(device);
  model.eval();

  if (!cfg.no_prompt) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  nn::SampleOptions opt;
  opt.temperature = cfg.temperature;
  opt.top_k = cfg.top_k;
  opt.seed = cfg.seed;
  model.generate(tokens, cfg.tokens, opt, [&](int64_t t) {
    if (!tok) {
      std::fputc(static_cast<int>(t), stdout);
    } else if (tok->id_to_token(static_cast<uint32_t>(t))) {
      // A token's bytes as they come; a character split between tokens is whole once both are written.
      // Rows of the model beyond the tokenizer's vocabulary (padding) stand for no text.
      const std::string b = tok->decode_bytes({static_cast<uint32_t>(t)});
      std::fwrite(b.data(), 1, b.size(), stdout);
    }
    std::fflush(stdout);
  });
  return 0;
}

}  // namespace

Runner add_generate_command(CLI::App& app) {
  auto cfg = std::make_shared<GenerateConfig>();
  CLI::App* sub = app.add_subcommand("generate", "Write text sampled from a GPT checkpoint");
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("--checkpoint", cfg->checkpoint, "A GPT checkpoint (its meta data says \"model\": \"gpt\")")
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
