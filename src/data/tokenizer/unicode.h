#pragma once
// Internal: the Unicode facts the tokenizer's stages need: UTF-8 decoding (invalid input replaced the
// way the `tokenizers` library's callers see it) and the character classes of the split patterns.
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::data::tok {

/// What the split patterns ask of a code point: \p{L}, \p{N}, \s (Oniguruma's, for Unicode) or none.
enum class CharClass : uint8_t { other = 0, letter = 1, number = 2, space = 3 };

/// The Unicode version of the tables (unicode_tables.cpp, written by make_unicode_tables.py).
extern const char* const kUnicodeVersion;

/// The class of any code point, from the generated tables.
CharClass char_class_slow(uint32_t cp);

/// The class of a code point, ASCII without a table look-up.
inline CharClass char_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::space;
    return CharClass::other;
  }
  return char_class_slow(cp);
}

/// Decodes the code point at s[i] of valid UTF-8 and returns it; `len` receives its byte count.
inline uint32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    len = 2;
    return ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
  }
  if (b0 < 0xF0) {
    len = 3;
    return ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
  }
  len = 4;
  return ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
         ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
}

/// Where the code point that ends at s[i] (exclusive) starts, in valid UTF-8 (i > 0).
inline size_t previous_utf8(std::string_view s, size_t i) {
  do --i;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

/// Appends the UTF-8 of code point cp to out.
void append_utf8(std::string& out, uint32_t cp);

/// The length of the longest prefix of s that is valid UTF-8.
size_t valid_utf8_prefix(std::string_view s);

/// s with each ill-formed sequence replaced by U+FFFD, one per maximal subpart (Unicode's recommended
/// practice, which Python's bytes.decode(errors="replace") and Rust's String::from_utf8_lossy follow).
std::string to_valid_utf8(std::string_view s);

}  // namespace tandem::data::tok
