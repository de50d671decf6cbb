// Byte-level token shards from text files, split into training and validation by whole files (one
// file within itself).
#include "tandem/data/text_corpus.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/safe_file.h"
#include "data/regular_file.h"
#include "data/shard_files.h"
#include "tandem/data/tokenizer.h"
#include "data/text_check.h"
#include "tandem/data/tokens.h"
#include "tandem/error.h"

namespace tandem::data {

namespace fs = std::filesystem;

namespace {

std::string upper(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

// A line without its leading byte-order mark and blanks and its trailing blanks and carriage return.
std::string_view trimmed(std::string_view line) {
  if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
  return line;
}

// "*** START OF ..." / "***END OF ...": the words after the leading asterisks, upper-cased; empty
// when the line does not start with three asterisks.
std::string after_stars(std::string_view line) {
  if (line.substr(0, 3) != "***") return {};
  while (!line.empty() && (line.front() == '*' || line.front() == ' ')) line.remove_prefix(1);
  return upper(line);
}

bool is_header_end(std::string_view line) {
  const std::string u = upper(line);
  return after_stars(line).rfind("START OF", 0) == 0 || u.find("*END*THE SMALL PRINT") != std::string::npos ||
         u.find("*END THE SMALL PRINT") != std::string::npos;
}

bool is_footer_start(std::string_view line) {
  if (after_stars(line).rfind("END OF", 0) == 0) return true;
  const std::string u = upper(line);
  for (const char* p : {"END OF THE PROJECT GUTENBERG", "END OF PROJECT GUTENBERG", "END OF THIS PROJECT GUTENBERG",
                        "END OF THE ETEXT", "END OF THIS ETEXT"})
    if (u.rfind(p, 0) == 0) return true;
  return false;
}

std::string read_text_file(const std::string& path) {
  uint64_t size = 0;
  std::FILE* f = io::open_regular_file(path, "text file", size);
  std::string text(static_cast<size_t>(size), '\0');
  const size_t got = size ? std::fread(text.data(), 1, text.size(), f) : 0;
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  TANDEM_CHECK(!failed, "cannot read text file '", path, "': ", std::strerror(err));
  text.resize(got);  // a file that shrank while being read gives what it still had
  return text;
}

}  // namespace

TextSpan gutenberg_body(std::string_view text) {
  TextSpan span{0, text.size(), false, false};
  // Lines as [start, next) of text; the header's end is looked for first, the footer after it.
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    const std::string_view line = trimmed(text.substr(pos, next - pos));
    if (!span.header && is_header_end(line)) {
      span.header = true;
      span.begin = next;
    } else if (is_footer_start(line)) {
      span.footer = true;
      span.end = pos;
      break;
    }
    pos = next;
  }
  return span;
}

std::vector<bool> choose_validation_files(const std::vector<uint64_t>& bytes, double fraction) {
  TANDEM_CHECK(std::isfinite(fraction) && fraction >= 0.0 && fraction < 1.0, "--val must be in [0, 1), got ",
               fraction);
  const size_t n = bytes.size();
  std::vector<bool> val(n, false);
  if (fraction == 0.0 || n < 2) return val;
  long double total = 0;
  for (uint64_t b : bytes) total += static_cast<long double>(b);
  const long double target = total * static_cast<long double>(fraction);
  size_t best = 1;
  long double sum = 0, best_gap = std::numeric_limits<long double>::infinity();
  for (size_t k = 1; k < n; ++k) {  // the last k files
    sum += static_cast<long double>(bytes[n - k]);
    const long double gap = std::fabs(sum - target);
    if (gap < best_gap) {
      best_gap = gap;
      best = k;
    }
  }
  for (size_t k = 1; k <= best; ++k) val[n - k] = true;
  return val;
}

TextCut validation_cut(std::string_view text, size_t begin, size_t end, double fraction) {
  TANDEM_CHECK(std::isfinite(fraction) && fraction > 0.0 && fraction < 1.0, "--val must be in (0, 1) to split a "
               "file, got ", fraction);
  TANDEM_CHECK(end <= text.size() && begin + 2 <= end, "a text of ", end > begin ? end - begin : 0,
               " byte(s) is too short to split into training and validation: give more text, or --val 0");
  const size_t len = end - begin;
  const size_t want = std::clamp<size_t>(static_cast<size_t>(std::llround(static_cast<double>(len) * fraction)), 1,
                                         len - 1);
  const size_t target = end - want;
  const size_t slack = std::max<size_t>(want / 2, 1);
  const size_t lo = std::max(begin + 1, target > slack ? target - slack : 0);
  const size_t hi = std::min(end - 1, target + slack);
  // The nearest candidate of each kind: validation would start at p.
  size_t best[3] = {std::string_view::npos, std::string_view::npos, std::string_view::npos};
  auto dist = [&](size_t p) { return p > target ? p - target : target - p; };
  auto offer = [&](int kind, size_t p) {
    if (best[kind] == std::string_view::npos || dist(p) < dist(best[kind])) best[kind] = p;
  };
  for (size_t p = lo; p <= hi; ++p) {
    const char before = text[p - 1];
    if (before == '\n') {
      // After a blank line ("\n\n", or "\r\n\r\n" with Windows line ends): a new paragraph or document.
      const bool blank = (p >= begin + 2 && text[p - 2] == '\n') ||
                         (p >= begin + 3 && text[p - 2] == '\r' && text[p - 3] == '\n');
      offer(blank ? 0 : 1, p);
      if (blank) offer(1, p);
    } else if (before == ' ') {
      offer(2, p);
    }
  }
  static const char* kNames[3] = {"a blank line", "a line end", "a space"};
  for (int kind = 0; kind < 3; ++kind)
    if (best[kind] != std::string_view::npos) return {best[kind], kNames[kind]};
  // No boundary near: the nearest start of a UTF-8 character.
  size_t p = target;
  while (p < end - 1 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) ++p;
  return {p, "a character"};
}

TextCorpusReport write_text_corpus(const TextCorpusOptions& opt) {
  auto say = [&](const std::string& line) {
    if (opt.progress) opt.progress(line);
  };
  TANDEM_CHECK(!opt.files.empty(), "tandem data text: no input files were given");
  TANDEM_CHECK(!opt.out_dir.empty(), "tandem data text: no output directory was given (-o DIR)");
  TANDEM_CHECK(opt.shard_tokens >= 1 && opt.shard_tokens <= std::numeric_limits<int32_t>::max(),
               "--shard-tokens must be in [1, 2^31 - 1] (llm.c's header counts tokens in an int32), got ",
               opt.shard_tokens);
  TANDEM_CHECK(std::isfinite(opt.val_fraction) && opt.val_fraction >= 0.0 && opt.val_fraction < 1.0,
               "--val must be in [0, 1), got ", opt.val_fraction);

  TextCorpusReport report;
  std::vector<std::string> files = opt.files;
  std::sort(files.begin(), files.end());
  for (size_t i = 1; i < files.size(); ++i)
    TANDEM_CHECK(files[i] != files[i - 1], "text file '", files[i], "' is given twice");

  // A tokenizer is read before any text, so that a file it cannot read stops the run at once.
  std::optional<Tokenizer> tok;
  if (!opt.tokenizer.empty()) {
    tok.emplace(Tokenizer::from_file(opt.tokenizer));
    report.vocab_size = tok->vocab_size();
    report.token_bytes = report.vocab_size > 65536 ? 4 : 2;
    if (opt.document_token.empty()) {
      const std::optional<uint32_t> d = tok->document_token();
      TANDEM_CHECK(d.has_value(), "tokenizer '", opt.tokenizer, "' has neither <|endoftext|> nor <|begin_of_text|> ",
                   "among its added tokens: name the token to put between documents with --document-token");
      report.document_token_id = *d;
    } else {
      const std::optional<uint32_t> d = tok->token_to_id(opt.document_token);
      TANDEM_CHECK(d.has_value(), "--document-token '", opt.document_token, "' is no token of '", opt.tokenizer, "'");
      report.document_token_id = *d;
    }
    report.document_token = *tok->id_to_token(static_cast<uint32_t>(report.document_token_id));
  }

  // Pass 1: every file is read and measured before anything is written (and, with a tokenizer, kept
  // for encoding).
  std::vector<TextSpan> spans;
  std::vector<uint64_t> kept;
  std::vector<std::string> texts;
  int64_t total = 0;
  for (const std::string& path : files) {
    std::string text = read_text_file(path);
    if (!opt.binary_ok) {
      const TextLook look = look_at_text(text);
      TANDEM_CHECK(look.text, "'", path, "' is not text: ", look.why, " (an executable, an archive or other binary "
                   "data?); give text files, or --binary-ok to make tokens of its bytes anyway");
    }
    TextSpan span = opt.strip_gutenberg ? gutenberg_body(text) : TextSpan{0, text.size(), false, false};
    TextFileReport r;
    r.path = path;
    r.bytes = text.size();
    r.tokens = static_cast<int64_t>(span.end - span.begin);
    r.header_stripped = span.header;
    r.footer_stripped = span.footer;
    report.files.push_back(r);
    spans.push_back(span);
    kept.push_back(static_cast<uint64_t>(r.tokens));
    total += r.tokens;
    if (tok) texts.push_back(std::move(text));
  }
  TANDEM_CHECK(total > 0, "tandem data text: the ", files.size(), " input file", files.size() == 1 ? "" : "s",
               " hold no text", opt.strip_gutenberg ? " once Project Gutenberg's header and footer are left out" : "",
               "; there is nothing to write");
  const std::vector<bool> val = choose_validation_files(kept, opt.val_fraction);
  // One file: its last part validates, cut at a boundary of the text.
  const bool split_one = files.size() == 1 && opt.val_fraction > 0.0;
  if (split_one) {
    TextFileReport& r = report.files[0];
    const std::string text = tok ? texts[0] : read_text_file(files[0]);
    TANDEM_CHECK(text.size() == r.bytes, "text file '", files[0], "' changed while being read (", r.bytes,
                 " bytes, now ", text.size(), ")");
    TANDEM_CHECK(r.tokens >= 2, "text file '", files[0], "' holds ", r.tokens, " token",
                 r.tokens == 1 ? "" : "s", opt.strip_gutenberg ? " once Project Gutenberg's header and footer are left out" : "",
                 ": too little to split into training and validation; give more text, or --val 0");
    const TextCut cut = validation_cut(text, spans[0].begin, spans[0].end, opt.val_fraction);
    r.val_from = static_cast<int64_t>(cut.at);
    r.val_tokens = static_cast<int64_t>(spans[0].end - cut.at);
    r.cut_at = cut.boundary;
  }
  // With a tokenizer, every file is encoded now, on every core; a file's tokens are its ids after the
  // document token (a file split within itself: each part's, after a document token of its own).
  std::vector<std::vector<uint32_t>> ids;
  std::vector<uint32_t> val_ids;  // the split file's validation part
  if (tok) {
    std::vector<std::string_view> bodies;
    for (size_t i = 0; i < texts.size(); ++i) {
      const TextFileReport& r = report.files[i];
      const size_t end = r.val_from >= 0 ? static_cast<size_t>(r.val_from) : spans[i].end;
      bodies.push_back(std::string_view(texts[i]).substr(spans[i].begin, end - spans[i].begin));
      report.encoded_bytes += spans[i].end - spans[i].begin;
    }
    if (split_one) bodies.push_back(std::string_view(texts[0]).substr(static_cast<size_t>(report.files[0].val_from),
                                                                      spans[0].end - static_cast<size_t>(report.files[0].val_from)));
    const auto t0 = std::chrono::steady_clock::now();
    ids = tok->encode_batch(bodies, opt.threads);
    report.encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    texts.clear();
    if (split_one) {
      val_ids = std::move(ids.back());
      ids.pop_back();
      report.files[0].val_tokens = 1 + static_cast<int64_t>(val_ids.size());
    }
    for (size_t i = 0; i < files.size(); ++i)
      report.files[i].tokens = report.files[i].tokens == 0
                                   ? 0
                                   : 1 + static_cast<int64_t>(ids[i].size()) + (split_one && i == 0 ? report.files[0].val_tokens : 0);
  }
  for (size_t i = 0; i < files.size(); ++i) {
    const TextFileReport& r = report.files[i];
    report.files[i].val = val[i];
    if (r.val_from >= 0) {
      report.train_tokens += r.tokens - r.val_tokens;
      report.val_tokens += r.val_tokens;
    } else {
      (val[i] ? report.val_tokens : report.train_tokens) += r.tokens;
    }
  }
  TANDEM_CHECK(report.train_tokens > 0, "tandem data text: the training files hold no text");
  TANDEM_CHECK(opt.val_fraction == 0.0 || report.val_tokens > 0,
               "tandem data text: the validation files hold no text; give files with text or --val 0");

  // The output directory: created when missing, checked for writing before any shard is made.
  std::error_code ec;
  TANDEM_CHECK(!fs::exists(opt.out_dir, ec) || fs::is_directory(opt.out_dir, ec), "output directory '", opt.out_dir,
               "' exists and is not a directory");
  fs::create_directories(opt.out_dir, ec);
  TANDEM_CHECK(!ec, "cannot create output directory '", opt.out_dir, "': ", ec.message());
  report.meta_path = (fs::path(opt.out_dir) / "meta.json").string();
  io::check_can_write(report.meta_path, "token shard directory");
  // meta.json is written last: a run that fails midway leaves none, not an earlier run's.
  fs::remove(report.meta_path, ec);

  // Files of one directory are listed by name under it.
  const fs::path common = fs::path(files.front()).parent_path();
  const bool one_dir = std::all_of(files.begin(), files.end(),
                                   [&](const std::string& f) { return fs::path(f).parent_path() == common; });
  if (one_dir && !common.empty()) say("in " + common.string() + ":");
  size_t unmarked = 0;  // --strip-gutenberg: files without a header or footer, said once for all
  for (size_t i = 0; i < files.size(); ++i) {
    const TextFileReport& r = report.files[i];
    const std::string shown = one_dir ? fs::path(r.path).filename().string() : r.path;
    std::string note;
    if (opt.strip_gutenberg) {
      note = r.header_stripped && r.footer_stripped ? ", Gutenberg header and footer left out"
             : r.header_stripped                    ? ", Gutenberg header left out (no footer found)"
             : r.footer_stripped                    ? ", Gutenberg footer left out (no header found)"
                                                    : "";
      unmarked += r.header_stripped || r.footer_stripped ? 0 : 1;
    }
    if (r.val_from >= 0) {
      say("  train  " + shown + ": its first " + with_commas(r.tokens - r.val_tokens) + " tokens" + note);
      say("  val    " + shown + ": its last " + with_commas(r.val_tokens) + " tokens, from byte " +
          with_commas(r.val_from) + " (cut at " + r.cut_at + ")");
    } else {
      say("  " + std::string(r.val ? "val  " : "train") + "  " + shown + ": " + with_commas(r.tokens) + " tokens" +
          note);
    }
  }
  if (unmarked > 0)
    say("--strip-gutenberg: no Gutenberg header or footer found in " +
        (unmarked == files.size() ? std::string(files.size() == 1 ? "the file" : "any of the " +
                                                    std::to_string(files.size()) + " files")
                                  : std::to_string(unmarked) + " of the " + std::to_string(files.size()) + " files") +
        " (kept whole)");

  // Pass 2: the split's files, in order, cut into shards of at most shard_tokens.
  std::set<std::string> written;
  // Token: uint16_t, or uint32_t for a vocabulary beyond 65,536 tokens.
  auto write_split = [&](bool is_val, std::vector<std::string>& out, auto token_type) {
    using Token = decltype(token_type);
    const char* split = is_val ? "val" : "train";
    std::vector<Token> buf;
    buf.reserve(static_cast<size_t>(std::min<int64_t>(opt.shard_tokens, is_val ? report.val_tokens : report.train_tokens)));
    auto flush = [&] {
      const std::string name = shard_name(split, out.size());
      const std::string path = (fs::path(opt.out_dir) / name).string();
      write_token_shard(path, buf);
      say("wrote " + path + " (" + with_commas(static_cast<int64_t>(buf.size())) + " tokens)");
      out.push_back(path);
      written.insert(name);
      buf.clear();
    };
    auto put = [&](uint32_t t) {
      buf.push_back(static_cast<Token>(t));
      if (static_cast<int64_t>(buf.size()) == opt.shard_tokens) flush();
    };
    for (size_t i = 0; i < files.size(); ++i) {
      const TextFileReport& r = report.files[i];
      const bool within = r.val_from >= 0;  // the file split within itself: its part of this split
      if ((!within && val[i] != is_val) || r.tokens == 0) continue;
      if (tok) {  // each part after a document token
        put(static_cast<uint32_t>(report.document_token_id));
        std::vector<uint32_t>& part = within && is_val ? val_ids : ids[i];
        for (uint32_t t : part) put(t);
        std::vector<uint32_t>().swap(part);
        continue;
      }
      const std::string text = read_text_file(files[i]);
      TextSpan s = spans[i];
      if (within) (is_val ? s.begin : s.end) = static_cast<size_t>(r.val_from);
      TANDEM_CHECK(text.size() == r.bytes, "text file '", files[i], "' changed while being read (", r.bytes,
                   " bytes, now ", text.size(), ")");
      for (size_t p = s.begin; p < s.end; ++p) put(static_cast<unsigned char>(text[p]));
    }
    if (!buf.empty()) flush();
  };
  for (const bool is_val : {false, true}) {
    if (is_val && report.val_tokens == 0) break;
    std::vector<std::string>& out = is_val ? report.val_shards : report.train_shards;
    if (report.token_bytes == 4) write_split(is_val, out, uint32_t{});
    else write_split(is_val, out, uint16_t{});
  }

  static const std::regex kShard(R"((train|val)_[0-9]{6}\.bin)");
  remove_stale_shards(opt.out_dir, written, kShard, say, report.removed);

  nlohmann::json meta;
  meta["format"] = shard_format_description(report.token_bytes);
  meta["token_bytes"] = report.token_bytes;
  meta["vocab_size"] = report.vocab_size;
  if (tok) {
    std::error_code abs_ec;
    const fs::path abs = fs::absolute(opt.tokenizer, abs_ec);
    meta["tokenizer"] = {{"file", abs_ec ? opt.tokenizer : abs.lexically_normal().string()},
                         {"sha256", sha256_file(opt.tokenizer)},
                         {"kind", tok->describe()},
                         {"vocab_size", report.vocab_size},
                         {"document_token", report.document_token},
                         {"document_token_id", report.document_token_id},
                         {"document_token_placement", "before each file"}};
  } else {
    meta["tokenizer"] = "byte";
  }
  meta["strip_gutenberg"] = opt.strip_gutenberg;
  meta["val_fraction"] = opt.val_fraction;
  meta["shard_tokens"] = opt.shard_tokens;
  auto names = [](const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const std::string& p : paths) out.push_back(fs::path(p).filename().string());
    return out;
  };
  auto split_files = [&](bool is_val) {
    std::vector<std::string> out;
    for (const TextFileReport& r : report.files)
      if (r.val == is_val || r.val_from >= 0) out.push_back(r.path);
    return out;
  };
  meta["train"] = {{"tokens", report.train_tokens}, {"shards", names(report.train_shards)}, {"files", split_files(false)}};
  meta["val"] = {{"tokens", report.val_tokens}, {"shards", names(report.val_shards)}, {"files", split_files(true)}};
  nlohmann::json per_file = nlohmann::json::array();
  for (const TextFileReport& r : report.files) {
    nlohmann::json f{{"path", r.path},
                     {"bytes", r.bytes},
                     {"tokens", r.tokens},
                     {"split", r.val_from >= 0 ? "train, then val" : r.val ? "val" : "train"},
                     {"gutenberg_header_stripped", r.header_stripped},
                     {"gutenberg_footer_stripped", r.footer_stripped}};
    if (r.val_from >= 0) {
      f["val_from_byte"] = r.val_from;
      f["val_tokens"] = r.val_tokens;
      f["cut_at"] = r.cut_at;
    }
    per_file.push_back(f);
  }
  meta["files"] = per_file;
  io::write_file_atomically(report.meta_path, "metadata file", meta.dump(2) + "\n");
  return report;
}

}  // namespace tandem::data
