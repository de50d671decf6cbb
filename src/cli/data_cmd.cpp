// `tandem data`: token shards for language models. `data text` makes shards from text files, byte-level
// or with a tokenizer.json; `data jsonl` makes shards with a loss mask from instruction data (prompt /
// response pairs, chats); `data info` loads shards (tandem's, llm.c's or nanoGPT's) and describes them.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tandem/data/jsonl_corpus.h"
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

struct DataJsonlConfig {
  std::vector<std::string> files;
  std::string out_dir, tokenizer;
  double val = 0.1;
  int64_t context = 1024;
  bool pack = false, skip_long = false;
  std::string chat_template, template_file, bos, eos;
  int64_t shard_tokens = 100'000'000;
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

// --template's text with \n, \t and \\ read as a line break, a tab and a backslash (a shell passes them
// as two characters).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == 'n' || s[i + 1] == 't' || s[i + 1] == '\\')) {
      out += s[i + 1] == 'n' ? '\n' : s[i + 1] == 't' ? '\t' : '\\';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

int run_jsonl(const DataJsonlConfig& cfg) {
  data::JsonlCorpusOptions opt;
  opt.files = cfg.files;
  opt.out_dir = cfg.out_dir;
  opt.tokenizer = cfg.tokenizer;
  opt.val_fraction = cfg.val;
  opt.context = cfg.context;
  opt.pack = cfg.pack;
  opt.skip_long = cfg.skip_long;
  opt.bos_token = cfg.bos;
  opt.eos_token = cfg.eos;
  opt.shard_tokens = cfg.shard_tokens;
  opt.threads = cfg.threads;
  if (!cfg.template_file.empty()) {
    std::ifstream in(cfg.template_file, std::ios::binary);
    TANDEM_CHECK(in.good(), "cannot read --template-file '", cfg.template_file, "'");
    std::ostringstream text;
    text << in.rdbuf();
    opt.chat_template = text.str();
    TANDEM_CHECK(!opt.chat_template.empty(), "--template-file '", cfg.template_file, "' is empty");
    opt.template_from = "--template-file '" + cfg.template_file + "'";
  } else if (!cfg.chat_template.empty()) {
    opt.chat_template = unescape(cfg.chat_template);
    opt.template_from = "--template";
  }
  opt.progress = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  const data::JsonlCorpusReport r = data::write_jsonl_corpus(opt);
  std::printf("read %lld example%s (%lld prompt/response, %lld chat); vocabulary %lld, %d-bit tokens; %s%s before "
              "each example, %s after each response (and as padding)\n",
              static_cast<long long>(r.examples), r.examples == 1 ? "" : "s", static_cast<long long>(r.prompt_response),
              static_cast<long long>(r.chat), static_cast<long long>(r.vocab_size), 8 * r.token_bytes,
              r.bos_id >= 0 ? r.bos_token.c_str() : "no token",
              r.bos_id >= 0 ? (" (id " + std::to_string(r.bos_id) + ")").c_str() : "", r.eos_token.c_str());
  if (r.chat > 0) std::printf("chats rendered with %s\n", r.template_from.c_str());
  if (r.skipped_long > 0)
    std::printf("left out %lld example%s longer than a window of %lld tokens (--skip-long)\n",
                static_cast<long long>(r.skipped_long), r.skipped_long == 1 ? "" : "s",
                static_cast<long long>(r.window));
  auto split = [&](const char* name, const data::JsonlSplitReport& s) {
    std::printf("%s: %lld example%s in %lld window%s of %lld tokens (%s), %lld of %lld tokens trained on (%.1f%%)\n",
                name, static_cast<long long>(s.examples), s.examples == 1 ? "" : "s",
                static_cast<long long>(s.windows), s.windows == 1 ? "" : "s", static_cast<long long>(r.window),
                cfg.pack ? "packed" : "one example each, padded", static_cast<long long>(s.trained),
                static_cast<long long>(s.tokens), s.tokens > 0 ? 100.0 * static_cast<double>(s.trained) /
                                                                     static_cast<double>(s.tokens) : 0.0);
  };
  split("train", r.train);
  if (r.val.examples > 0) split("val", r.val);
  else std::printf("val: none (--val 0)\n");
  std::printf("longest example: %lld tokens; train with --context %lld (the default for this directory)\n",
              static_cast<long long>(r.longest), static_cast<long long>(r.context));
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

  auto jsonl_cfg = std::make_shared<DataJsonlConfig>();
  CLI::App* jsonl = sub->add_subcommand(
      "jsonl", "Tokenize instruction data (JSONL prompt/response pairs or chats) into token shards with a loss mask, "
               "for fine-tuning");
  jsonl->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  jsonl->add_option("files", jsonl_cfg->files, "JSONL files, one example per line (taken in the order given)")
      ->required();
  jsonl->add_option("-o,--output", jsonl_cfg->out_dir,
                    "Directory to write the shards, masks and meta.json into (created when missing)")
      ->required();
  jsonl->add_option("--tokenizer", jsonl_cfg->tokenizer,
                    "A Hugging Face tokenizer.json (byte-level BPE: GPT-2's or Llama 3's kind); a "
                    "tokenizer_config.json beside it gives the bos and eos tokens and the chat template")
      ->required();
  jsonl->add_option("--val", jsonl_cfg->val,
                    "Fraction of the examples held out for validation: the last ones, in the order of the files and "
                    "lines (at least one each way; 0: no validation split)")
      ->check(finite_in(0.0, 0.999999))
      ->capture_default_str();
  jsonl->add_option("--context", jsonl_cfg->context,
                    "T: every window holds T + 1 tokens, and `tandem train --data DIR` trains with this context")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  jsonl->add_flag("--pack,!--no-pack", jsonl_cfg->pack,
                  "Pack several whole examples into each window: fewer padding tokens, each example still attending to "
                  "itself only; default --no-pack: one example per window, padded");
  jsonl->add_flag("--skip-long", jsonl_cfg->skip_long,
                  "Leave out examples longer than T + 1 tokens (counted and reported) instead of refusing them");
  auto* tmpl = jsonl->add_option(
      "--template", jsonl_cfg->chat_template,
      "Chat lines: the text of one message, {role} and {content} in it, \\n a line break (default: the "
      "tokenizer_config.json's chat_template when it is plain, else '<|{role}|>\\n{content}\\n')");
  jsonl->add_option("--template-file", jsonl_cfg->template_file, "Chat lines: --template's text read from a file "
                    "(as it is, no escapes)")
      ->excludes(tmpl);
  jsonl->add_option("--bos", jsonl_cfg->bos,
                    "The token put before each example, or none (default: tokenizer_config.json's bos_token, else "
                    "<|begin_of_text|> when the tokenizer has it, else none)");
  jsonl->add_option("--eos", jsonl_cfg->eos,
                    "The token after each response, trained on, and the padding (default: tokenizer_config.json's "
                    "eos_token, else <|eot_id|>, <|end_of_text|> or <|endoftext|>)");
  jsonl->add_option("--shard-tokens", jsonl_cfg->shard_tokens, "Most tokens per shard file (whole windows)")
      ->check(CLI::Range(int64_t{1}, int64_t{2147483647}))
      ->capture_default_str();
  jsonl->add_option("--threads", jsonl_cfg->threads, "Threads that encode (0: every core)")->check(CLI::Range(0, 4096));
  jsonl->footer(
      "Lines (blank lines are skipped; other keys, such as \"id\", are ignored):\n"
      "  {\"prompt\": \"What is 2 + 2?\", \"response\": \" 4\"}\n"
      "      tokens: [bos] prompt response eos; trained on: the response and the eos\n"
      "  {\"messages\": [{\"role\": \"system\", \"content\": \"...\"}, {\"role\": \"user\", \"content\": \"...\"},\n"
      "                {\"role\": \"assistant\", \"content\": \"...\"}, ...]}\n"
      "      tokens: [bos], then each message rendered with the template (its text before {content}, the\n"
      "      content, its text after {content}), with the eos right after each assistant content; trained\n"
      "      on: the contents of assistant messages and their eos, never the template text or other roles.\n"
      "      A template whose text after {content} starts with the eos (<|eot_id|>) has no second one.\n"
      "Pieces are encoded one by one (prompt, response, template text), so the tokens at their seams are\n"
      "those of each piece alone. An example's first token is never trained on (nothing precedes it).\n"
      "\n"
      "Chat template: --template, else the chat_template of tokenizer_config.json beside the tokenizer,\n"
      "read only when it is a plain Jinja loop ({% for message in messages %} text, message['role'],\n"
      "message['content'] {% endfor %}, an optional {{ bos_token }} before it and an optional\n"
      "{% if add_generation_prompt %} after it); tandem does not run Jinja, and any other template\n"
      "(conditions, filters, tool calls: Llama 3's, most others) is refused: give --template then. With\n"
      "no chat_template, the default '<|{role}|>\\n{content}\\n'.\n"
      "\n"
      "Windows: each window holds T + 1 = --context + 1 tokens and no example is cut in two. By default\n"
      "each window holds one example, padded with the eos (not trained on): exact, each example sees only\n"
      "itself. --pack puts as many whole examples as fit into each window, in order: fewer padding tokens,\n"
      "and the same result: `tandem train` reads the examples' bounds from NAME.examples, and each example\n"
      "attends only to itself, its positions counted from its own first token, as if it had a window of\n"
      "its own. An example longer than T + 1 tokens is refused (naming its file and line) unless\n"
      "--skip-long leaves it out; it is never truncated.\n"
      "\n"
      "Writes DIR/train_000000.bin ... and DIR/val_000000.bin ... (llm.c's format, as `tandem data text`:\n"
      "uint16 tokens, or uint32 for a vocabulary above 65,536), beside each NAME.mask (one byte per token:\n"
      "1 trained on, 0 not) and NAME.examples (per example two little-endian int64: its first token's\n"
      "position in the shard and its length), and DIR/meta.json (\"loss_mask\": true, the packing, the\n"
      "context). `tandem train --data DIR` then draws whole windows and takes the loss on the tokens marked\n"
      "1 only (the others' targets are -100), in training and validation.\n"
      "Example: tandem data jsonl chats.jsonl --tokenizer llama/tokenizer.json -o data/chats --context 2048\n"
      "         tandem train --model llama --init llama --data data/chats --steps 1000 --lr 2e-5");

  auto info_cfg = std::make_shared<DataInfoConfig>();
  CLI::App* info = sub->add_subcommand("info", "Load token shards and print their format and token counts");
  info->add_option("shards", info_cfg->specs, "Shard files, directories of *.bin files or glob patterns")->required();
  info->add_option("--vocab", info_cfg->vocab, "Check that every token is below this vocabulary size (0: no check)")
      ->check(CLI::Range(int64_t{0}, int64_t{2147483647}));
  info->footer("Reads llm.c's shards (magic 20240520, uint16; 20240801, uint32) and nanoGPT's bare uint16 .bin files "
               "alike. A file that is\nno token shard (a text file among them) is refused, naming it: `tandem data "
               "text` makes text into shards.");

  return [text, jsonl, info, text_cfg, jsonl_cfg, info_cfg] {
    if (text->parsed()) return run_text(*text_cfg);
    if (jsonl->parsed()) return run_jsonl(*jsonl_cfg);
    if (info->parsed()) return run_info(*info_cfg);
    return 2;
  };
}

}  // namespace tandem::cli
