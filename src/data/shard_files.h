#pragma once
// Internal: writing token shards in llm.c's format (`tandem data text`, `tandem data jsonl`).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/safe_file.h"
#include "tandem/data/tokens.h"

namespace tandem::data {

/// "train_000003.bin": a split's shard i, with the given extension.
inline std::string shard_name(const char* split, size_t i, const char* ext = ".bin") {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s_%06zu%s", split, i, ext);
  return buf;
}

/// Writes tokens as one llm.c shard at path (atomically): uint16 tokens under the 16-bit header, or
/// uint32 tokens under the 32-bit one.
template <typename Token>
void write_token_shard(const std::string& path, const std::vector<Token>& tokens) {
  constexpr bool wide = sizeof(Token) == 4;
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = wide ? kLlmc32Magic : kLlmcMagic;
  header[1] = wide ? kLlmc32Version : kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  io::write_file_atomically(path, "token shard", [&](int fd) {
    io::write_all(fd, header, sizeof header, path, "token shard");
    io::write_all(fd, tokens.data(), tokens.size() * sizeof(Token), path, "token shard");
  });
}

/// 1234567 as "1,234,567" (counts are never negative).
inline std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace tandem::data
