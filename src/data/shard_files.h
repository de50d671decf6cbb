#pragma once
// Internal: writing token shards in llm.c's format (`tandem data text`, `tandem data jsonl`).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <regex>
#include <set>
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

/// What meta.json says of the shards' format: llm.c's header and 16- or 32-bit tokens.
inline const char* shard_format_description(int token_bytes) {
  return token_bytes == 4
             ? "llm.c token shards: a header of 256 int32 (magic 20240801, version 7, token count), then uint32 tokens"
             : "llm.c token shards: a header of 256 int32 (magic 20240520, version 1, token count), then uint16 tokens";
}

/// Removes the files of dir whose names match `pattern` but that this run did not write (`written`): shards of
/// an earlier run would join a glob of train_*.bin. Each removal is told to `say` and listed in `removed`.
inline void remove_stale_shards(const std::filesystem::path& dir, const std::set<std::string>& written,
                                const std::regex& pattern, const std::function<void(const std::string&)>& say,
                                std::vector<std::string>& removed) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, pattern) || written.count(name) || e.is_directory()) continue;
    std::error_code rm;
    if (std::filesystem::remove(e.path(), rm)) {
      removed.push_back(e.path().string());
      say("removed " + e.path().string() + " (a file of an earlier run)");
    }
  }
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
