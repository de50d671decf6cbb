#pragma once
// Internal: whether bytes are text. `tandem data text` refuses a binary file (an executable, random
// bytes) unless told otherwise, and a token shard whose bytes read as text is a text file given where
// shards were wanted.
#include <cstddef>
#include <string>
#include <string_view>

namespace tandem::data {

/// What a look at some bytes found.
struct TextLook {
  bool text = true;
  std::string why;  // when not text: "a NUL byte at offset 17", "40% of its bytes are control ..."
};

/// Text: no NUL byte, and at most `max_odd` of the bytes are control characters (other than tab,
/// line feed, vertical tab, form feed, carriage return, backspace and escape) or bytes that are not
/// UTF-8 (a Latin-1 text, with an accented letter here and there, passes). `prefix`: the bytes are the
/// start of a longer file, so a UTF-8 sequence cut off at their end is not held against them.
TextLook look_at_text(std::string_view bytes, bool prefix = false, double max_odd = 0.1);

}  // namespace tandem::data
