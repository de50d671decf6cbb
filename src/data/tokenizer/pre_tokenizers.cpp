// The pre-tokenizer stages: ByteLevel (GPT-2's split, then each byte as a printable character),
// Split (a split pattern, each match and each gap a word) and Sequence (stages one after another).
#include <array>

#include <nlohmann/json.hpp>

#include "data/tokenizer/stages.h"
#include "data/tokenizer/unicode.h"
#include "tandem/error.h"

namespace tandem::data::tok {

namespace {

// GPT-2's byte-to-character map (openai/gpt-2 encoder.py, bytes_to_unicode): the printable bytes stand
// for themselves, the others for U+0100 onwards in byte order.
struct ByteMap {
  std::array<std::string, 256> chars;
  std::array<int16_t, 0x200> bytes;  // code point -> byte, -1 when it stands for none
  ByteMap() {
    bytes.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      append_utf8(chars[static_cast<size_t>(b)], cp);
      bytes[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Splits the words with a pattern, each match and each gap between matches a word (tokenizers'
// "Isolated" behaviour: nothing is removed).
void split_words(SplitPattern p, Words& w) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(w.spans.size() * 2);
  const std::string_view text(w.text);
  for (const auto& [b, e] : w.spans) {
    const std::string_view word = text.substr(0, e);
    size_t i = b, gap = b;
    while (i < e) {
      const size_t n = match_at(p, word, i);
      if (n == 0) {
        size_t len;
        decode_utf8(word, i, len);
        i += len;
        continue;
      }
      if (gap < i) out.emplace_back(gap, i);
      out.emplace_back(i, i + n);
      i += n;
      gap = i;
    }
    if (gap < e) out.emplace_back(gap, e);
  }
  w.spans = std::move(out);
  w.continues = false;
}

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(const nlohmann::json& j, const Where& w)
      : add_prefix_space_(bool_field(j, "add_prefix_space", true, w)), use_regex_(bool_field(j, "use_regex", true, w)) {
    bool_field(j, "trim_offsets", true, w);  // offsets only: no effect on ids
  }

  void apply(Words& w) const override {
    if (add_prefix_space_) add_prefix_spaces(w);
    if (use_regex_) split_words(SplitPattern::gpt2, w);
    // Each byte becomes the character that stands for it.
    const ByteMap& m = byte_map();
    std::string mapped;
    mapped.reserve(w.text.size() * 2);
    for (auto& [b, e] : w.spans) {
      const size_t nb = mapped.size();
      for (size_t i = b; i < e; ++i) mapped += m.chars[static_cast<unsigned char>(w.text[i])];
      b = nb;
      e = mapped.size();
    }
    w.text = std::move(mapped);
  }

  bool can_cut(std::string_view text, size_t p) const override {
    return use_regex_ && pattern_can_cut(SplitPattern::gpt2, text, p);
  }
  bool splits() const override { return use_regex_; }

 private:
  // A space before each word that does not start with one, as tokenizers does (the first word of a
  // chunk that continues a text is not the start of a word of that text and gets none).
  void add_prefix_spaces(Words& w) const {
    bool any = false;
    for (size_t i = 0; i < w.spans.size() && !any; ++i)
      any = !(i == 0 && w.continues) && w.text[w.spans[i].first] != ' ';
    if (!any) return;
    std::string text;
    text.reserve(w.text.size() + w.spans.size());
    for (size_t i = 0; i < w.spans.size(); ++i) {
      auto& [b, e] = w.spans[i];
      const size_t nb = text.size();
      if (!(i == 0 && w.continues) && w.text[b] != ' ') text += ' ';
      text.append(w.text, b, e - b);
      b = nb;
      e = text.size();
    }
    w.text = std::move(text);
  }

  bool add_prefix_space_, use_regex_;
};

class Split final : public PreTokenizer {
 public:
  Split(const nlohmann::json& j, const Where& w) {
    const nlohmann::json& pattern = field(j, "pattern", w);
    const Where pw = w.at("pattern");
    TANDEM_CHECK(pattern.is_object() && pattern.size() == 1 && (pattern.contains("Regex") || pattern.contains("String")),
                 pw.str(), "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}, got ", pattern.dump());
    TANDEM_CHECK(pattern.contains("Regex"), pw.str(), "a String pattern (", pattern.dump(),
                 ") is not supported; tandem implements the Regex patterns of GPT-2 and Llama 3");
    pattern_ = split_pattern(string_field(pattern, "Regex", pw), pw);
    const std::string behavior = string_field(j, "behavior", w);
    TANDEM_CHECK(behavior == "Isolated", w.at("behavior").str(), "the Split behaviour '", behavior,
                 "' is not supported; tandem implements \"Isolated\" (each match a word of its own)");
    TANDEM_CHECK(!bool_field(j, "invert", false, w), w.at("invert").str(),
                 "an inverted Split is not supported; tandem implements \"invert\": false");
  }
  void apply(Words& w) const override { split_words(pattern_, w); }
  bool can_cut(std::string_view text, size_t p) const override { return pattern_can_cut(pattern_, text, p); }
  bool splits() const override { return true; }

 private:
  SplitPattern pattern_ = SplitPattern::gpt2;
};

class Sequence final : public PreTokenizer {
 public:
  Sequence(const nlohmann::json& j, const Where& w) {
    const nlohmann::json& list = field(j, "pretokenizers", w);
    const Where lw = w.at("pretokenizers");
    TANDEM_CHECK(list.is_array(), lw.str(), "expected a list of pre-tokenizers, got ", list.type_name());
    for (size_t i = 0; i < list.size(); ++i) stages_.push_back(make_pre_tokenizer(list[i], lw.index(i)));
  }
  void apply(Words& w) const override {
    for (const auto& s : stages_) s->apply(w);
  }
  // A cut is safe where the first stage that splits says so, unless a stage before it rewrote the text
  // that stage sees.
  bool can_cut(std::string_view text, size_t p) const override {
    for (const auto& s : stages_)
      if (s->splits()) return s->can_cut(text, p);
      else return false;
    return false;
  }
  bool splits() const override {
    for (const auto& s : stages_)
      if (s->splits()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

// No pre-tokenizer: the whole text is one word.
class NoPreTokenizer final : public PreTokenizer {
 public:
  void apply(Words&) const override {}
  bool can_cut(std::string_view, size_t) const override { return false; }
  bool splits() const override { return false; }
};

}  // namespace

const std::string& byte_char(uint8_t b) { return byte_map().chars[b]; }

int char_byte(uint32_t cp) { return cp < 0x200 ? byte_map().bytes[cp] : -1; }

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const Where& w) {
  if (j.is_null()) return std::make_unique<NoPreTokenizer>();
  const std::string type = type_of(j, w);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j, w);
  if (type == "Split") return std::make_unique<Split>(j, w);
  if (type == "Sequence") return std::make_unique<Sequence>(j, w);
  TANDEM_CHECK(false, w.str(), "the pre-tokenizer '", type,
               "' is not supported; tandem implements ByteLevel, Split (GPT-2's and Llama 3's patterns) and a "
               "Sequence of them");
  return nullptr;
}

}  // namespace tandem::data::tok
