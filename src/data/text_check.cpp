// Whether bytes are text: no NUL, and few control characters or bytes outside UTF-8.
#include "data/text_check.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace tandem::data {

namespace {

bool allowed_control(unsigned char c) {
  return c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == '\b' || c == 0x1b;
}

// Bytes of the UTF-8 sequence that starts at p (1 to 4), or 0 when no valid sequence starts there;
// `cut` is set when the bytes end inside what would otherwise be a valid sequence.
size_t utf8_length(const unsigned char* p, size_t left, bool& cut) {
  cut = false;
  const unsigned char c = p[0];
  size_t n = 0;
  uint32_t min = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, min = 0x10000;
  else return 0;
  uint32_t cp = c & (0xFF >> (n + 1));
  for (size_t i = 1; i < n; ++i) {
    if (i >= left) {
      cut = true;
      return 0;
    }
    if ((p[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

TextLook look_at_text(std::string_view bytes, bool prefix, double max_odd) {
  TextLook look;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t odd = 0;
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c == 0) {
      look.text = false;
      look.why = "a NUL byte at offset " + std::to_string(i);
      return look;
    }
    if (c < 0x20 || c == 0x7F) {
      odd += allowed_control(c) ? 0 : 1;
      ++i;
      continue;
    }
    bool cut = false;
    const size_t len = utf8_length(p + i, n - i, cut);
    if (cut && prefix) break;
    if (len == 0) {
      ++odd;
      ++i;
    } else {
      i += len;
    }
  }
  if (n > 0 && static_cast<double>(odd) > max_odd * static_cast<double>(n)) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * static_cast<double>(odd) / static_cast<double>(n));
    look.text = false;
    look.why = std::string(pct) + " of its bytes are control characters or not UTF-8";
  }
  return look;
}

}  // namespace tandem::data
