// The split patterns of GPT-2 and Llama 3, matched by hand. Each follows its regex alternative by
// alternative, in order, as a backtracking engine (Oniguruma, in the `tokenizers` library) tries them
// at a position: the first alternative that matches there gives the match.
#include <nlohmann/json.hpp>

#include "data/tokenizer/stages.h"
#include "data/tokenizer/unicode.h"
#include "tandem/error.h"

namespace tandem::data::tok {

namespace {

// GPT-2's pattern (openai/gpt-2 encoder.py), as the ByteLevel pre-tokenizer and GPT-2's files give it.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's pattern (meta-llama/llama3 tokenizer.py), as its tokenizer.json's Split gives it.
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Cursor {
  std::string_view s;
  // The code point at i and its length; i < s.size().
  uint32_t at(size_t i, size_t& len) const { return decode_utf8(s, i, len); }
  CharClass cls(size_t i) const {
    size_t len;
    return char_class(at(i, len));
  }
  // The end of the run of characters of class c that starts at i (i itself when none).
  size_t run(size_t i, CharClass c) const {
    while (i < s.size()) {
      size_t len;
      if (char_class(at(i, len)) != c) break;
      i += len;
    }
    return i;
  }
  // As run(), at most `most` characters.
  size_t run_at_most(size_t i, CharClass c, int most) const {
    for (int k = 0; k < most && i < s.size(); ++k) {
      size_t len;
      if (char_class(at(i, len)) != c) break;
      i += len;
    }
    return i;
  }
};

// 's 't 're 've 'm 'll 'd at i (s[i] == '\''); `fold`: Llama 3's case-insensitive form, where onig
// also takes U+017F (long s) for s. Returns the match's length or 0.
size_t contraction(std::string_view s, size_t i, bool fold) {
  auto is = [&](size_t k, char lower) -> size_t {  // length of the character at k when it is `lower`
    if (k >= s.size()) return 0;
    const char c = s[k];
    if (c == lower || (fold && c == lower - 'a' + 'A')) return 1;
    if (fold && lower == 's' && s.compare(k, 2, "\xC5\xBF") == 0) return 2;  // U+017F
    return 0;
  };
  const size_t j = i + 1;
  size_t n;
  if ((n = is(j, 's'))) return 1 + n;
  if ((n = is(j, 't'))) return 1 + n;
  if (is(j, 'r') && is(j + 1, 'e')) return 3;
  if (is(j, 'v') && is(j + 1, 'e')) return 3;
  if ((n = is(j, 'm'))) return 1 + n;
  if (is(j, 'l') && is(j + 1, 'l')) return 3;
  if ((n = is(j, 'd'))) return 1 + n;
  return 0;
}

// \s+(?!\S) then \s+ at i (a space character): the run, less its last character when a non-space
// follows it and the run is longer than one character.
size_t spaces(const Cursor& c, size_t i) {
  const size_t e = c.run(i, CharClass::space);
  if (e == c.s.size()) return e - i;
  const size_t last = previous_utf8(c.s, e);
  return last > i ? last - i : e - i;
}

size_t match_gpt2(const Cursor& c, size_t i) {
  const std::string_view s = c.s;
  if (s[i] == '\'') {
    if (const size_t n = contraction(s, i, false)) return n;
  }
  // ` ?X+` for X = letters, numbers, others: the optional space, then at least one X.
  const size_t k = s[i] == ' ' ? i + 1 : i;
  if (k < s.size()) {
    const CharClass x = c.cls(k);
    if (x != CharClass::space) return c.run(k, x) - i;
  }
  // Only space characters are left (a lone ' ' at the end, or ' ' before a space).
  return spaces(c, i);
}

size_t match_llama3(const Cursor& c, size_t i) {
  const std::string_view s = c.s;
  if (s[i] == '\'') {
    if (const size_t n = contraction(s, i, true)) return n;
  }
  size_t len0;
  const uint32_t c0 = c.at(i, len0);
  const CharClass x0 = char_class(c0);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (x0 == CharClass::letter) return c.run(i, CharClass::letter) - i;
  if (x0 != CharClass::number && c0 != '\r' && c0 != '\n' && i + len0 < s.size() &&
      c.cls(i + len0) == CharClass::letter)
    return c.run(i + len0, CharClass::letter) - i;
  // \p{N}{1,3}
  if (x0 == CharClass::number) return c.run_at_most(i, CharClass::number, 3) - i;
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t k = s[i] == ' ' ? i + 1 : i;
  if (k < s.size() && c.cls(k) == CharClass::other) {
    size_t e = c.run(k, CharClass::other);
    while (e < s.size() && (s[e] == '\r' || s[e] == '\n')) ++e;
    return e - i;
  }
  // x0 is a space character. \s*[\r\n]+: up to the last \r or \n of the run of spaces.
  const size_t e = c.run(i, CharClass::space);
  for (size_t q = e; q > i; --q)
    if (s[q - 1] == '\r' || s[q - 1] == '\n') return q - i;
  return spaces(c, i);
}

}  // namespace

SplitPattern split_pattern(const std::string& regex, const Where& w) {
  if (regex == kGpt2) return SplitPattern::gpt2;
  if (regex == kLlama3) return SplitPattern::llama3;
  TANDEM_CHECK(false, w.str(), "the split pattern ", nlohmann::json(regex).dump(),
               " is not one tandem implements; it implements GPT-2's ", nlohmann::json(kGpt2).dump(),
               " and Llama 3's ", nlohmann::json(kLlama3).dump());
  return SplitPattern::gpt2;
}

size_t match_at(SplitPattern p, std::string_view text, size_t i) {
  const Cursor c{text};
  return p == SplitPattern::gpt2 ? match_gpt2(c, i) : match_llama3(c, i);
}

bool pattern_can_cut(SplitPattern, std::string_view text, size_t p) {
  // A letter before p and none at p: the match holding the letter ends at p whatever follows (every
  // alternative that takes a letter takes a run of letters, or a fixed contraction whose next letter
  // would be at p), no alternative that was tried before it looked past p, and matching from p sees
  // the same text. Both patterns.
  if (p == 0 || p >= text.size()) return false;
  size_t len;
  if (char_class(decode_utf8(text, p, len)) == CharClass::letter) return false;
  return char_class(decode_utf8(text, previous_utf8(text, p), len)) == CharClass::letter;
}

}  // namespace tandem::data::tok
