// `tandem data`: token shards for language models. `data text` makes shards from text files, byte-level
// or with a tokenizer.json; `data info` loads shards (tandem's, llm.c's or nanoGPT's) and describes them.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tandem/data/text_corpus.h"
#include "tandem/data/tokens.h"

namespace tandem::cli {

namespace {

struct DataTextConfig {
  std::vector<std::string> files;
  std::string out_dir;
  double val = 0.1;
  bool strip_gutenberg = false;
  bool binary_ok = false;
  int64_t shard_tokens = 100'000'000;
  std::string tokenizer, document_token;
  int threads = 0;
};

struct DataInfoConfig {
  std::vector<std::string> specs;
  int64_t vocab = 0;
};

int run_text(const DataTextConfig& cfg) {
  data::TextCorpusOptions opt;
  opt.files = cfg.files;
  opt.out_dir = cfg.out_dir;
  opt.val_fraction = cfg.val;
  opt.strip_gutenberg = cfg.strip_gutenberg;
  opt.binary_ok = cfg.binary_ok;
  opt.shard_tokens = cfg.shard_tokens;
  opt.tokenizer = cfg.tokenizer;
  opt.document_token = cfg.document_token;
  opt.threads = cfg.threads;
  opt.progress = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  if (cfg.tokenizer.empty())
    std::printf("tokenizing %zu file%s byte by byte (vocabulary 256) into %s\n", cfg.files.size(),
                cfg.files.size() == 1 ? "" : "s", cfg.out_dir.c_str());
  else
    std::printf("tokenizing %zu file%s with %s into %s\n", cfg.files.size(), cfg.files.size() == 1 ? "" : "s",
                cfg.tokenizer.c_str(), cfg.out_dir.c_str());
  std::fflush(stdout);
  const data::TextCorpusReport r = data::write_text_corpus(opt);
  if (!cfg.tokenizer.empty()) {
    const double mb = static_cast<double>(r.encoded_bytes) / 1e6;
    std::printf("encoded %.1f MB in %.2f s (%.1f MB/s); vocabulary %lld, %d-bit tokens, %s (id %lld) before each file\n",
                mb, r.encode_seconds, r.encode_seconds > 0 ? mb / r.encode_seconds : 0.0,
                static_cast<long long>(r.vocab_size), 8 * r.token_bytes, r.document_token.c_str(),
                static_cast<long long>(r.document_token_id));
  }
  int val_files = 0;
  const data::TextFileReport* within = nullptr;  // the one file split within itself
  for (const auto& f : r.files) {
    val_files += f.val;
    if (f.val_from >= 0) within = &f;
  }
  const int train_files = static_cast<int>(r.files.size()) - val_files;
  const double total = static_cast<double>(r.train_tokens + r.val_tokens);
  const double got = total > 0 ? static_cast<double>(r.val_tokens) / total : 0.0;
  auto shards = [](size_t n) { return std::to_string(n) + (n == 1 ? " shard" : " shards"); };
  auto count = [](int64_t v) { return std::to_string(v); };
  if (within) {
    std::printf("train: the first %.1f%% of %s, %s tokens in %s\n", 100.0 * (1.0 - got), within->path.c_str(),
                count(r.train_tokens).c_str(), shards(r.train_shards.size()).c_str());
    std::printf("val: the last %.1f%% of %s (from byte %lld, cut at %s), %s tokens in %s\n", 100.0 * got,
                within->path.c_str(), static_cast<long long>(within->val_from), within->cut_at.c_str(),
                count(r.val_tokens).c_str(), shards(r.val_shards.size()).c_str());
  } else {
    std::printf("train: %d file%s, %lld tokens in %s\n", train_files, train_files == 1 ? "" : "s",
                static_cast<long long>(r.train_tokens), shards(r.train_shards.size()).c_str());
    std::printf("val: %d file%s, %lld tokens in %s", val_files, val_files == 1 ? "" : "s",
                static_cast<long long>(r.val_tokens), shards(r.val_shards.size()).c_str());
    if (val_files > 0) std::printf(" (%.1f%% of the tokens; --val asked %g%%)", 100.0 * got, 100.0 * cfg.val);
    std::printf("\n");
    // Whole files seldom hit the fraction; far from it, the user should know and know what helps.
    std::fflush(stdout);
    if (val_files > 0 && (got > 2.0 * cfg.val || got < 0.5 * cfg.val))
      std::fprintf(stderr, "tandem: the validation split holds whole files, the last by path: %.1f%% of the tokens "
                   "where --val %g asks for %g%%. For a closer split give more files of similar sizes (or one file, "
                   "which is split within itself), or another --val\n", 100.0 * got, cfg.val, 100.0 * cfg.val);
  }
  std::printf("wrote %s\n", r.meta_path.c_str());
  return 0;
}

int run_info(const DataInfoConfig& cfg) {
  const data::TokenStream stream(cfg.specs, cfg.vocab);
  for (const auto& s : stream.shards())
    std::printf("%s: %s, %lld tokens, largest token %u\n", s->path().c_str(), data::token_format_name(s->format()),
                static_cast<long long>(s->size()), static_cast<unsigned>(s->max_token()));
  std::printf("total: %zu shard%s, %lld tokens\n", stream.shards().size(), stream.shards().size() == 1 ? "" : "s",
              static_cast<long long>(stream.size()));
  return 0;
}

}  // namespace

Runner add_data_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("data", "Make and inspect token shards for language models");
  sub->require_subcommand(1);

  auto text_cfg = std::make_shared<DataTextConfig>();
  CLI::App* text = sub->add_subcommand(
      "text", "Tokenize text files (byte by byte, or with a tokenizer.json) into token shards in llm.c's format");
  text->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  text->add_option("files", text_cfg->files, "Text files (taken in order of their paths)")->required();
  text->add_option("-o,--output", text_cfg->out_dir, "Directory to write the shards and meta.json into (created when missing)")
      ->required();
  text->add_option("--val", text_cfg->val,
                   "Fraction of the bytes held out for validation, as whole files: the last files by path whose bytes "
                   "come closest to it (at least one file each way; the fraction they hold is printed). One file is "
                   "split within itself: its last part, cut at a blank line (else a line end) near the fraction. 0: "
                   "no validation split")
      ->check(finite_in(0.0, 0.999999))
      ->capture_default_str();
  text->add_flag("--strip-gutenberg", text_cfg->strip_gutenberg,
                 "Leave out Project Gutenberg's licence header (up to the '*** START OF' or '*END*THE SMALL PRINT' "
                 "line) and footer (from the '*** END OF' or 'End of the Project Gutenberg' line)");
  text->add_flag("--binary-ok", text_cfg->binary_ok,
                 "Tokenize files that are not text too (a NUL byte, or more than 10% control characters and "
                 "bytes outside UTF-8): without it such a file, an executable or random bytes, is refused");
  text->add_option("--shard-tokens", text_cfg->shard_tokens, "Most tokens per shard file")
      ->check(CLI::Range(int64_t{1}, int64_t{2147483647}))
      ->capture_default_str();
  auto* tokenizer = text->add_option("--tokenizer", text_cfg->tokenizer,
                                     "A Hugging Face tokenizer.json (byte-level BPE: GPT-2's or Llama 3's kind) to encode "
                                     "with, on every core, instead of bytes");
  text->add_option("--document-token", text_cfg->document_token,
                   "The token put before each file (default: <|endoftext|>, or <|begin_of_text|> for Llama 3)")
      ->needs(tokenizer);
  text->add_option("--threads", text_cfg->threads, "Threads that encode (0: every core)")->check(CLI::Range(0, 4096));
  text->footer(
      "Writes DIR/train_000000.bin ... and DIR/val_000000.bin ... (a header of 256 int32: magic 20240520,\n"
      "version 1, token count; then one uint16 token per byte) and DIR/meta.json. With --tokenizer, each\n"
      "file's ids follow one document token, and a vocabulary above 65,536 tokens (Llama 3's) is written\n"
      "as uint32 tokens under magic 20240801, version 7. Each file is written under a temporary name and\n"
      "renamed, so a shard is never seen half written.\n"
      "Example: tandem data text books/*.txt -o data/books --val 0.1 --strip-gutenberg\n"
      "         tandem data text books/*.txt -o data/books-gpt2 --tokenizer gpt2/tokenizer.json");

  auto info_cfg = std::make_shared<DataInfoConfig>();
  CLI::App* info = sub->add_subcommand("info", "Load token shards and print their format and token counts");
  info->add_option("shards", info_cfg->specs, "Shard files, directories of *.bin files or glob patterns")->required();
  info->add_option("--vocab", info_cfg->vocab, "Check that every token is below this vocabulary size (0: no check)")
      ->check(CLI::Range(int64_t{0}, int64_t{2147483647}));
  info->footer("Reads llm.c's shards (magic 20240520, uint16; 20240801, uint32) and nanoGPT's bare uint16 .bin files "
               "alike. A file that is\nno token shard (a text file among them) is refused, naming it: `tandem data "
               "text` makes text into shards.");

  return [text, info, text_cfg, info_cfg] {
    if (text->parsed()) return run_text(*text_cfg);
    if (info->parsed()) return run_info(*info_cfg);
    return 2;
  };
}

}  // namespace tandem::cli
