// Instruction data (JSONL prompt/response pairs and chats) made into token shards with a loss mask
// beside each, one example per window (padded) or several whole ones (packed).
#include "tandem/data/jsonl_corpus.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/safe_file.h"
#include "data/regular_file.h"
#include "data/shard_files.h"
#include "tandem/data/tokenizer.h"
#include "tandem/data/tokens.h"
#include "tandem/error.h"

namespace tandem::data {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kIgnored = -1;  // a Piece that is text, not a token id

std::string read_whole_file(const std::string& path, const char* what) {
  uint64_t size = 0;
  std::FILE* f = io::open_regular_file(path, what, size);
  std::string text(static_cast<size_t>(size), '\0');
  const size_t got = size ? std::fread(text.data(), 1, text.size(), f) : 0;
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  TANDEM_CHECK(!failed, "cannot read ", what, " '", path, "': ", std::strerror(err));
  text.resize(got);
  return text;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// ---- the plain form of a Jinja chat_template ----

struct JinjaPart {
  enum Kind { text, expr, stmt } kind;
  std::string body;  // the text, or the tag's inside without its delimiters and whitespace markers
};

bool is_blank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// Cuts a template into text and tags, applying the whitespace rules Hugging Face renders with
// (trim_blocks: the newline after a {% %} tag goes; lstrip_blocks: blanks before one at the start of
// its line go) and the '-' markers. Comments {# #} are dropped. False (with why) for an unclosed tag.
bool split_jinja(std::string_view src, std::vector<JinjaPart>& parts, std::string* why) {
  constexpr size_t npos = std::string_view::npos;
  auto opens_tag = [&](size_t at) {
    return at + 1 < src.size() && (src[at + 1] == '{' || src[at + 1] == '%' || src[at + 1] == '#');
  };
  size_t pos = 0;
  bool strip_lead = false;   // the last tag ended with '-': the text after it loses its leading blanks
  bool after_block = false;  // the last tag was {% %}: one newline right after it goes
  while (true) {
    size_t at = src.find('{', pos);
    while (at != npos && !opens_tag(at)) at = src.find('{', at + 1);
    std::string text(src.substr(pos, at == npos ? npos : at - pos));
    if (strip_lead) text.erase(0, text.find_first_not_of(" \t\r\n"));
    else if (after_block && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (at == npos) {
      if (!text.empty()) parts.push_back({JinjaPart::text, text});
      return true;
    }
    const char kind = src[at + 1];
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = src.find(close, at + 2);
    if (end == npos) {
      if (why) *why = std::string("a tag opened with '{") + kind + "' is never closed";
      return false;
    }
    std::string inside(src.substr(at + 2, end - at - 2));
    const bool minus_before = !inside.empty() && inside.front() == '-';
    const bool minus_after = !inside.empty() && inside.back() == '-';
    if (minus_before) inside.erase(0, 1);
    if (minus_after) inside.pop_back();
    if (minus_before) {
      const size_t last = text.find_last_not_of(" \t\r\n");
      text.erase(last == std::string::npos ? 0 : last + 1);
    } else if (kind == '%') {
      const size_t nl = text.find_last_of('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool line_start = nl != std::string::npos || pos == 0;
      if (line_start && text.find_first_not_of(" \t", from) == std::string::npos) text.erase(from);
    }
    if (!text.empty()) parts.push_back({JinjaPart::text, text});
    if (kind != '#') parts.push_back({kind == '{' ? JinjaPart::expr : JinjaPart::stmt, trim(inside)});
    strip_lead = minus_after;
    after_block = kind == '%';
    pos = end + 2;
  }
}

// What an expression's term is: a string literal's value, or the message's role or content.
enum class TermKind { literal, role, content };

bool parse_term(const std::string& term, TermKind& kind, std::string& value) {
  static const std::regex field(R"(message\s*(?:\[\s*(['"])(role|content)\1\s*\]|\.(role|content)))");
  std::smatch m;
  if (std::regex_match(term, m, field)) {
    const std::string name = m[2].matched ? m[2].str() : m[3].str();
    kind = name == "role" ? TermKind::role : TermKind::content;
    return true;
  }
  if (term.size() >= 2 && (term.front() == '\'' || term.front() == '"') && term.back() == term.front()) {
    value.clear();
    for (size_t i = 1; i + 1 < term.size(); ++i) {
      char c = term[i];
      if (c == term.front()) return false;  // two literals without a +
      if (c == '\\' && i + 2 < term.size()) {
        const char e = term[++i];
        c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
      }
      value += c;
    }
    kind = TermKind::literal;
    return true;
  }
  return false;
}

// The terms of an expression joined by + (outside string literals).
std::vector<std::string> split_plus(const std::string& expr) {
  std::vector<std::string> terms;
  std::string cur;
  char quote = 0;
  for (size_t i = 0; i < expr.size(); ++i) {
    const char c = expr[i];
    if (quote) {
      cur += c;
      if (c == '\\' && i + 1 < expr.size()) cur += expr[++i];
      else if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
      cur += c;
    } else if (c == '+') {
      terms.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  terms.push_back(trim(cur));
  return terms;
}

std::string squeeze(const std::string& s) { return std::regex_replace(trim(s), std::regex(R"(\s+)"), " "); }

}  // namespace

ChatTemplate parse_chat_template(std::string_view text, const std::string& what) {
  // Shown on one line, its line breaks as \n (as --template takes them).
  const std::string shown = replace_all(std::string(text), "\n", "\\n");
  const size_t at = text.find("{content}");
  TANDEM_CHECK(at != std::string_view::npos, what, " '", shown, "' has no {content}: a chat template ",
               "is the text of one message with {content} where the message's text goes and {role} where its role ",
               "goes, such as '", replace_all(kDefaultChatTemplate, "\n", "\\n"), "' (\\n: a line break)");
  TANDEM_CHECK(text.find("{content}", at + 1) == std::string_view::npos, what, " '", shown,
               "' has {content} more than once; a message's text goes in one place");
  return {std::string(text.substr(0, at)), std::string(text.substr(at + 9))};
}

std::optional<ChatTemplate> plain_chat_template(std::string_view jinja, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<ChatTemplate> {
    if (why) *why = w;
    return std::nullopt;
  };
  std::vector<JinjaPart> parts;
  std::string split_why;
  if (!split_jinja(jinja, parts, &split_why)) return fail(split_why);
  static const std::regex for_loop(R"(for\s+message\s+in\s+messages)");
  size_t i = 0;
  auto skip_blank = [&] {
    while (i < parts.size() && parts[i].kind == JinjaPart::text && is_blank(parts[i].body)) ++i;
  };
  skip_blank();
  if (i < parts.size() && parts[i].kind == JinjaPart::expr && squeeze(parts[i].body) == "bos_token") ++i;
  skip_blank();
  if (i >= parts.size() || parts[i].kind != JinjaPart::stmt || !std::regex_match(squeeze(parts[i].body), for_loop))
    return fail(i < parts.size() && parts[i].kind == JinjaPart::stmt
                    ? "it starts with {% " + squeeze(parts[i].body) + " %}, not {% for message in messages %}"
                    : std::string("it does not start with {% for message in messages %}"));
  ++i;
  ChatTemplate t;
  bool have_content = false;
  for (; i < parts.size(); ++i) {
    const JinjaPart& p = parts[i];
    if (p.kind == JinjaPart::stmt) {
      if (squeeze(p.body) == "endfor") break;
      return fail("its loop holds {% " + squeeze(p.body) + " %}");
    }
    std::string& out = have_content ? t.after : t.before;
    if (p.kind == JinjaPart::text) {
      out += p.body;
      continue;
    }
    for (const std::string& term : split_plus(p.body)) {
      TermKind kind;
      std::string value;
      if (!parse_term(term, kind, value)) return fail("its loop holds {{ " + squeeze(p.body) + " }}");
      if (kind == TermKind::content) {
        if (have_content) return fail("it puts message['content'] in twice");
        have_content = true;
      } else {
        (have_content ? t.after : t.before) += kind == TermKind::role ? std::string("{role}") : value;
      }
    }
  }
  if (i >= parts.size()) return fail("its {% for %} loop has no {% endfor %}");
  if (!have_content) return fail("its loop never puts in message['content']");
  ++i;
  skip_blank();
  if (i < parts.size() && parts[i].kind == JinjaPart::stmt && squeeze(parts[i].body) == "if add_generation_prompt") {
    for (++i; i < parts.size(); ++i) {
      if (parts[i].kind == JinjaPart::stmt && squeeze(parts[i].body) == "endif") break;
      if (parts[i].kind == JinjaPart::stmt) return fail("its generation prompt holds {% " + squeeze(parts[i].body) + " %}");
    }
    if (i >= parts.size()) return fail("its {% if add_generation_prompt %} has no {% endif %}");
    ++i;
  }
  skip_blank();
  if (i < parts.size())
    return fail(parts[i].kind == JinjaPart::text ? "text follows its loop"
                                                 : "its loop is followed by " +
                                                       std::string(parts[i].kind == JinjaPart::stmt ? "{% " : "{{ ") +
                                                       squeeze(parts[i].body) +
                                                       (parts[i].kind == JinjaPart::stmt ? " %}" : " }}"));
  return t;
}

namespace {

// One line of a JSONL file, read and checked.
struct Line {
  size_t file = 0;
  int64_t number = 0;  // 1-based
  bool chat = false;
  std::string prompt, response;                              // prompt/response
  std::vector<std::pair<std::string, std::string>> messages;  // chat: role, content
};

std::string where(const std::string& file, int64_t line) { return "'" + file + "' line " + std::to_string(line); }

// A line's JSON, checked for the fields an example needs.
Line read_line(std::string_view text, const std::string& file, size_t file_index, int64_t number) {
  Line l;
  l.file = file_index;
  l.number = number;
  const std::string at = where(file, number);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    const size_t cut = msg.find("] ");  // "[json.exception.parse_error.101] parse error at ..."
    if (cut != std::string::npos) msg = msg.substr(cut + 2);
    TANDEM_CHECK(false, at, " is not JSON (", msg, "); each line of a JSONL file is one JSON object");
  }
  TANDEM_CHECK(j.is_object(), at, " is ", j.type_name(), ", not a JSON object such as {\"prompt\": \"...\", ",
               "\"response\": \"...\"} or {\"messages\": [...]}");
  const bool pair = j.contains("prompt") || j.contains("response");
  const bool chat = j.contains("messages");
  TANDEM_CHECK(!(pair && chat), at, " has both \"messages\" and \"prompt\"/\"response\": give one or the other");
  if (!pair && !chat) {
    std::string keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + ("\"" + it.key() + "\"");
    TANDEM_CHECK(false, at, " has neither \"prompt\" and \"response\" nor \"messages\" (it has ",
                 keys.empty() ? std::string("no fields") : keys, ")");
  }
  if (pair) {
    for (const char* key : {"prompt", "response"}) {
      TANDEM_CHECK(j.contains(key), at, " has no \"", key, "\" field (a prompt/response line has both)");
      TANDEM_CHECK(j[key].is_string(), at, ": \"", key, "\" is ", j[key].type_name(), ", not a string");
    }
    l.prompt = j["prompt"].get<std::string>();
    l.response = j["response"].get<std::string>();
    TANDEM_CHECK(!l.response.empty(), at, ": \"response\" is empty: there is nothing to train on");
    return l;
  }
  l.chat = true;
  const nlohmann::json& ms = j["messages"];
  TANDEM_CHECK(ms.is_array() && !ms.empty(), at, ": \"messages\" must be a non-empty array of ",
               "{\"role\": ..., \"content\": ...} objects");
  bool assistant = false;
  for (size_t k = 0; k < ms.size(); ++k) {
    const nlohmann::json& m = ms[k];
    const std::string which = at + ", message " + std::to_string(k + 1);
    TANDEM_CHECK(m.is_object(), which, " is ", m.type_name(), ", not a {\"role\": ..., \"content\": ...} object");
    for (const char* key : {"role", "content"}) {
      TANDEM_CHECK(m.contains(key), which, " has no \"", key, "\"");
      TANDEM_CHECK(m[key].is_string(), which, ": \"", key, "\" is ", m[key].type_name(), ", not a string");
    }
    std::string role = m["role"].get<std::string>(), content = m["content"].get<std::string>();
    TANDEM_CHECK(!role.empty(), which, " has an empty \"role\"");
    if (role == "assistant") {
      TANDEM_CHECK(!content.empty(), which, " is an assistant message with empty \"content\": there is nothing to ",
                   "train on");
      assistant = true;
    }
    l.messages.emplace_back(std::move(role), std::move(content));
  }
  TANDEM_CHECK(assistant, at, " has no message of role \"assistant\": only assistant messages are trained on, so ",
               "the example would teach nothing");
  return l;
}

// A token string as tokenizer_config.json gives it: a string, {"content": "..."} or null.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

uint32_t token_id(const Tokenizer& tok, const std::string& token, const std::string& from, const std::string& file) {
  const std::optional<uint32_t> id = tok.token_to_id(token);
  TANDEM_CHECK(id.has_value(), from, " names the token '", token, "', which '", file, "' does not have");
  return *id;
}

// A piece of an example: text to encode, or one token; trained or not.
struct Piece {
  std::string text;
  int64_t token = kIgnored;
  bool trained = false;
};

// An example's tokens and their mask, and where it came from.
struct Example {
  size_t line = 0;  // index into the lines
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
};

}  // namespace

JsonlCorpusReport write_jsonl_corpus(const JsonlCorpusOptions& opt) {
  auto say = [&](const std::string& line) {
    if (opt.progress) opt.progress(line);
  };
  TANDEM_CHECK(!opt.files.empty(), "tandem data jsonl: no input files were given");
  TANDEM_CHECK(!opt.out_dir.empty(), "tandem data jsonl: no output directory was given (-o DIR)");
  TANDEM_CHECK(!opt.tokenizer.empty(), "tandem data jsonl: a tokenizer.json is needed (--tokenizer FILE)");
  TANDEM_CHECK(std::isfinite(opt.val_fraction) && opt.val_fraction >= 0.0 && opt.val_fraction < 1.0,
               "--val must be in [0, 1), got ", opt.val_fraction);
  TANDEM_CHECK(opt.context >= 1 && opt.context < std::numeric_limits<int32_t>::max(), "--context must be in [1, 2^31 - 1), got ",
               opt.context);
  TANDEM_CHECK(opt.shard_tokens >= 1 && opt.shard_tokens <= std::numeric_limits<int32_t>::max(),
               "--shard-tokens must be in [1, 2^31 - 1], got ", opt.shard_tokens);
  for (size_t i = 0; i < opt.files.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      TANDEM_CHECK(opt.files[i] != opt.files[k], "JSONL file '", opt.files[i], "' is given twice");

  JsonlCorpusReport report;
  report.context = opt.context;
  report.window = opt.context + 1;
  const int64_t W = report.window;

  // The tokenizer and its tokenizer_config.json (when beside it) first: a file tandem cannot read stops
  // the run before any data is read.
  const Tokenizer tok = Tokenizer::from_file(opt.tokenizer);
  report.vocab_size = tok.vocab_size();
  report.token_bytes = report.vocab_size > 65536 ? 4 : 2;
  const std::string config_path = (fs::path(opt.tokenizer).parent_path() / "tokenizer_config.json").string();
  nlohmann::json config;
  std::error_code ec;
  if (fs::is_regular_file(config_path, ec)) {
    config = nlohmann::json::parse(read_whole_file(config_path, "tokenizer config"), nullptr, false);
    TANDEM_CHECK(!config.is_discarded() && config.is_object(), "'", config_path, "' (beside --tokenizer) is not a ",
                 "JSON object: mend or move it");
  }
  if (opt.bos_token == "none") {
  } else if (!opt.bos_token.empty()) {
    report.bos_id = token_id(tok, opt.bos_token, "--bos", opt.tokenizer);
  } else if (const auto b = config_token(config, "bos_token")) {
    report.bos_id = token_id(tok, *b, "'" + config_path + "' (bos_token)", opt.tokenizer);
  } else if (const auto b2 = tok.token_to_id("<|begin_of_text|>")) {
    report.bos_id = *b2;
  }
  if (!opt.eos_token.empty()) {
    report.eos_id = token_id(tok, opt.eos_token, "--eos", opt.tokenizer);
  } else if (const auto e = config_token(config, "eos_token")) {
    report.eos_id = token_id(tok, *e, "'" + config_path + "' (eos_token)", opt.tokenizer);
  } else {
    for (const char* name : {"<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"})
      if (const auto e2 = tok.token_to_id(name)) {
        report.eos_id = *e2;
        break;
      }
    TANDEM_CHECK(report.eos_id >= 0, "tokenizer '", opt.tokenizer, "' has none of <|eot_id|>, <|end_of_text|>, ",
                 "<|endoftext|> and no tokenizer_config.json beside it names an eos_token: name the token that ends ",
                 "a response with --eos");
  }
  if (report.bos_id >= 0) report.bos_token = *tok.id_to_token(static_cast<uint32_t>(report.bos_id));
  report.eos_token = *tok.id_to_token(static_cast<uint32_t>(report.eos_id));

  // Every line of every file, read and checked.
  std::vector<Line> lines;
  for (size_t f = 0; f < opt.files.size(); ++f) {
    const std::string text = read_whole_file(opt.files[f], "JSONL file");
    size_t pos = 0;
    int64_t number = 0;
    int64_t in_file = 0;
    while (pos < text.size()) {
      const size_t nl = text.find('\n', pos);
      const size_t end = nl == std::string::npos ? text.size() : nl;
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      ++number;
      if (number == 1 && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (is_blank(line)) continue;
      lines.push_back(read_line(line, opt.files[f], f, number));
      ++in_file;
      (lines.back().chat ? report.chat : report.prompt_response) += 1;
    }
    TANDEM_CHECK(in_file > 0, "JSONL file '", opt.files[f], "' holds no examples (no line that is not blank)");
  }
  report.examples = static_cast<int64_t>(lines.size());

  // The chat template, when a line needs one (one given is checked all the same).
  if (!opt.chat_template.empty()) parse_chat_template(opt.chat_template, opt.template_from);
  if (report.chat > 0) {
    if (!opt.chat_template.empty()) {
      report.chat_template = parse_chat_template(opt.chat_template, opt.template_from);
      report.template_from = opt.template_from;
    } else if (config.is_object() && config.contains("chat_template")) {
      const nlohmann::json& ct = config["chat_template"];
      std::string jinja;
      if (ct.is_string()) jinja = ct.get<std::string>();
      if (ct.is_array())
        for (const auto& named : ct)
          if (named.is_object() && named.value("name", std::string()) == "default" && named.contains("template") &&
              named["template"].is_string())
            jinja = named["template"].get<std::string>();
      std::string why = "it is neither a string nor a list with a template named \"default\"";
      std::optional<ChatTemplate> plain = jinja.empty() ? std::nullopt : plain_chat_template(jinja, &why);
      TANDEM_CHECK(plain.has_value(), "the chat_template of '", config_path, "' is a Jinja program tandem cannot run (",
                   why, "); tandem reads only a loop of text, message['role'] and message['content']. Give the ",
                   "template of one message with --template, such as --template ",
                   "'<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>' for Llama 3 or ",
                   "'<|im_start|>{role}\\n{content}<|im_end|>\\n' for ChatML");
      report.chat_template = *plain;
      report.template_from = "the chat_template of " + config_path;
    } else {
      report.chat_template = parse_chat_template(kDefaultChatTemplate, "the default chat template");
      report.template_from = "the default template";
    }
  }

  // The pieces of every example, then every text piece encoded at once, on every core.
  std::vector<std::vector<Piece>> pieces(lines.size());
  const ChatTemplate& t = report.chat_template;
  for (size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    std::vector<Piece>& p = pieces[i];
    if (report.bos_id >= 0) p.push_back({{}, report.bos_id, false});
    if (!l.chat) {
      p.push_back({l.prompt, kIgnored, false});
      p.push_back({l.response, kIgnored, true});
      p.push_back({{}, report.eos_id, true});
      continue;
    }
    for (const auto& [role, content] : l.messages) {
      const bool assistant = role == "assistant";
      p.push_back({replace_all(t.before, "{role}", role), kIgnored, false});
      p.push_back({content, kIgnored, assistant});
      std::string after = replace_all(t.after, "{role}", role);
      if (assistant) {
        // The end token follows the response; a template whose text after {content} starts with it
        // (<|eot_id|>, <|im_end|>) has it there already.
        p.push_back({{}, report.eos_id, true});
        if (after.rfind(report.eos_token, 0) == 0) after.erase(0, report.eos_token.size());
      }
      p.push_back({after, kIgnored, false});
    }
  }
  std::vector<std::string_view> texts;
  for (const auto& p : pieces)
    for (const Piece& piece : p)
      if (piece.token == kIgnored && !piece.text.empty()) texts.push_back(piece.text);
  say("encoding " + with_commas(report.examples) + " examples with " + opt.tokenizer);
  std::vector<std::vector<uint32_t>> ids = tok.encode_batch(texts, opt.threads);
  std::vector<Example> examples;
  size_t next = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    Example e;
    e.line = i;
    for (const Piece& piece : pieces[i]) {
      if (piece.token != kIgnored) {
        e.tokens.push_back(static_cast<uint32_t>(piece.token));
        e.mask.push_back(piece.trained ? 1 : 0);
      } else if (!piece.text.empty()) {
        const std::vector<uint32_t>& got = ids[next++];
        e.tokens.insert(e.tokens.end(), got.begin(), got.end());
        e.mask.insert(e.mask.end(), got.size(), piece.trained ? 1 : 0);
      }
    }
    std::vector<Piece>().swap(pieces[i]);
    // The first token of an example is nobody's target: nothing of the example comes before it.
    e.mask[0] = 0;
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    if (n > W) {
      const Line& l = lines[i];
      TANDEM_CHECK(opt.skip_long, where(opt.files[l.file], l.number), " is ", n, " tokens long, more than a window ",
                   "of --context ", opt.context, " + 1 = ", W, " tokens holds: raise --context (the model must take ",
                   "that context too), shorten the example, or give --skip-long to leave such examples out");
      ++report.skipped_long;
      continue;
    }
    report.longest = std::max(report.longest, n);
    examples.push_back(std::move(e));
  }
  ids.clear();
  TANDEM_CHECK(!examples.empty(), "tandem data jsonl: every one of the ", report.examples, " examples is longer than ",
               "a window of ", W, " tokens: raise --context");

  // The split: the last fraction of the examples validates.
  const int64_t kept = static_cast<int64_t>(examples.size());
  int64_t n_val = 0;
  if (opt.val_fraction > 0.0) {
    TANDEM_CHECK(kept >= 2, "tandem data jsonl: ", kept, " example cannot be split into training and validation; ",
                 "give more examples, or --val 0");
    n_val = std::clamp<int64_t>(std::llround(static_cast<double>(kept) * opt.val_fraction), 1, kept - 1);
  }
  const int64_t n_train = kept - n_val;

  // The output directory: created when missing, checked for writing before any shard is made.
  TANDEM_CHECK(!fs::exists(opt.out_dir, ec) || fs::is_directory(opt.out_dir, ec), "output directory '", opt.out_dir,
               "' exists and is not a directory");
  fs::create_directories(opt.out_dir, ec);
  TANDEM_CHECK(!ec, "cannot create output directory '", opt.out_dir, "': ", ec.message());
  report.meta_path = (fs::path(opt.out_dir) / "meta.json").string();
  io::check_can_write(report.meta_path, "token shard directory");
  fs::remove(report.meta_path, ec);  // written last: a run that fails midway leaves none

  // Windows of W tokens, each one example padded (or whole examples packed), cut into shards of whole
  // windows; the pad token is the end token, masked 0.
  const int64_t per_shard = std::max<int64_t>(1, opt.shard_tokens / W);
  std::set<std::string> written;
  auto write_split = [&](bool is_val, int64_t first, int64_t count, JsonlSplitReport& r, auto token_type) {
    using Token = decltype(token_type);
    const char* split = is_val ? "val" : "train";
    std::vector<Token> toks;
    std::vector<uint8_t> mask;
    std::vector<int64_t> bounds;  // per example: its start and length in the shard
    int64_t windows_in_shard = 0;
    auto flush = [&] {
      const size_t k = r.shards.size();
      const std::string bin = (fs::path(opt.out_dir) / shard_name(split, k)).string();
      write_token_shard(bin, toks);
      io::write_file_atomically(mask_path(bin), "loss mask", std::string_view(reinterpret_cast<const char*>(mask.data()),
                                                                              mask.size()));
      const std::string idx = (fs::path(opt.out_dir) / shard_name(split, k, ".examples")).string();
      io::write_file_atomically(idx, "example index", std::string_view(reinterpret_cast<const char*>(bounds.data()),
                                                                       bounds.size() * sizeof(int64_t)));
      for (const char* ext : {".bin", ".mask", ".examples"}) written.insert(shard_name(split, k, ext));
      say("wrote " + bin + " (" + with_commas(windows_in_shard) + (windows_in_shard == 1 ? " window, " : " windows, ") +
          with_commas(static_cast<int64_t>(toks.size())) + " tokens) and its .mask and .examples");
      r.shards.push_back(bin);
      toks.clear();
      mask.clear();
      bounds.clear();
      windows_in_shard = 0;
    };
    int64_t fill = 0;  // tokens in the open window
    auto close_window = [&] {
      toks.insert(toks.end(), static_cast<size_t>(W - fill), static_cast<Token>(report.eos_id));
      mask.insert(mask.end(), static_cast<size_t>(W - fill), 0);
      fill = 0;
      ++r.windows;
      if (++windows_in_shard == per_shard) flush();
    };
    for (int64_t i = first; i < first + count; ++i) {
      const Example& e = examples[static_cast<size_t>(i)];
      const int64_t n = static_cast<int64_t>(e.tokens.size());
      if (fill > 0 && (!opt.pack || fill + n > W)) close_window();
      bounds.push_back(static_cast<int64_t>(toks.size()));
      bounds.push_back(n);
      for (uint32_t id : e.tokens) toks.push_back(static_cast<Token>(id));
      mask.insert(mask.end(), e.mask.begin(), e.mask.end());
      for (uint8_t m : e.mask) r.trained += m;
      fill += n;
      ++r.examples;
    }
    if (fill > 0) close_window();
    if (!toks.empty()) flush();
    r.tokens = r.windows * W;
  };
  for (const bool is_val : {false, true}) {
    const int64_t first = is_val ? n_train : 0, count = is_val ? n_val : n_train;
    if (count == 0) continue;
    JsonlSplitReport& r = is_val ? report.val : report.train;
    if (report.token_bytes == 4) write_split(is_val, first, count, r, uint32_t{});
    else write_split(is_val, first, count, r, uint16_t{});
  }

  static const std::regex kShard(R"((train|val)_[0-9]{6}\.(bin|mask|examples))");
  remove_stale_shards(opt.out_dir, written, kShard, say, report.removed);

  nlohmann::json meta;
  meta["format"] = shard_format_description(report.token_bytes);
  meta["token_bytes"] = report.token_bytes;
  meta["vocab_size"] = report.vocab_size;
  std::error_code abs_ec;
  const fs::path abs = fs::absolute(opt.tokenizer, abs_ec);
  meta["tokenizer"] = {{"file", abs_ec ? opt.tokenizer : abs.lexically_normal().string()},
                       {"sha256", sha256_file(opt.tokenizer)},
                       {"kind", tok.describe()},
                       {"vocab_size", report.vocab_size},
                       {"bos_token", report.bos_id >= 0 ? nlohmann::json(report.bos_token) : nlohmann::json()},
                       {"bos_token_id", report.bos_id >= 0 ? nlohmann::json(report.bos_id) : nlohmann::json()},
                       {"eos_token", report.eos_token},
                       {"eos_token_id", report.eos_id}};
  meta["loss_mask"] = true;
  meta["mask_format"] = "NAME.mask beside each NAME.bin: one byte per token, 1 where the token is a target the loss "
                        "is taken on (a response and the end token after it), 0 elsewhere (prompt, template, padding)";
  meta["examples_format"] = "NAME.examples beside each NAME.bin: per example, two little-endian int64: the position "
                            "of its first token in the shard and its token count";
  meta["packing"] = opt.pack ? "pack" : "pad";
  meta["context"] = report.context;
  meta["window"] = report.window;
  meta["pad_token_id"] = report.eos_id;
  if (report.chat > 0)
    meta["chat_template"] = {{"from", report.template_from},
                             {"before_content", report.chat_template.before},
                             {"after_content", report.chat_template.after}};
  meta["val_fraction"] = opt.val_fraction;
  meta["shard_tokens"] = opt.shard_tokens;
  auto names = [](const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const std::string& p : paths) out.push_back(fs::path(p).filename().string());
    return out;
  };
  auto split_json = [&](const JsonlSplitReport& r) {
    return nlohmann::json{{"examples", r.examples}, {"windows", r.windows}, {"tokens", r.tokens},
                          {"trained_tokens", r.trained}, {"shards", names(r.shards)}};
  };
  meta["train"] = split_json(report.train);
  meta["val"] = split_json(report.val);
  meta["examples"] = {{"read", report.examples}, {"prompt_response", report.prompt_response}, {"chat", report.chat},
                      {"skipped_long", report.skipped_long}, {"longest_tokens", report.longest}};
  meta["files"] = opt.files;
  io::write_file_atomically(report.meta_path, "metadata file", meta.dump(2) + "\n");
  return report;
}

}  // namespace tandem::data
