// UTF-8: encoding a code point, and replacing ill-formed input the way Python and Rust read it.
#include "data/tokenizer/unicode.h"

namespace tandem::data::tok {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// The length of the well-formed sequence at s[i] (Unicode's table 3-7), or 0 with `bad` set to the
// length of its maximal subpart (at least 1): the bytes one U+FFFD replaces.
size_t well_formed(std::string_view s, size_t i, size_t& bad) {
  const auto at = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0x100u; };
  const unsigned b0 = at(i);
  if (b0 < 0x80) return 1;
  unsigned lo = 0x80, hi = 0xBF;
  size_t n;
  if (b0 >= 0xC2 && b0 <= 0xDF) n = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    bad = 1;
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    const unsigned b = at(i + k);
    const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      bad = k;
      return 0;
    }
  }
  return n;
}

}  // namespace

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = well_formed(s, i, bad);
    if (n == 0) break;
    i += n;
  }
  return i;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    const size_t good = valid_utf8_prefix(s.substr(i));
    out.append(s.substr(i, good));
    i += good;
    if (i == s.size()) break;
    size_t bad = 1;
    well_formed(s, i, bad);
    out += "\xEF\xBF\xBD";
    i += bad;
  }
  return out;
}

}  // namespace tandem::data::tok
