#pragma once
// Internal: the store's wire format. Every message is a frame: a 4-byte big-endian body length, then
// the body: a one-byte code (a request's operation or a reply's status), a 4-byte field count, and
// that many fields, each a 4-byte length and its bytes.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tandem::dist::proto {

enum Op : uint8_t { kSet = 1, kGet = 2, kTryGet = 3, kAdd = 4, kCheck = 5, kErase = 6 };
enum Status : uint8_t { kOk = 0, kNotFound = 1, kError = 2 };

/// Frames larger than this are treated as corrupt (no legitimate rendezvous value comes near it).
constexpr uint32_t kMaxFrame = 1u << 30;

inline void put_u32(std::string& s, uint32_t v) {
  char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
               static_cast<char>(v)};
  s.append(b, 4);
}

inline uint32_t get_u32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

/// A complete frame (length prefix included).
inline std::string encode(uint8_t code, const std::vector<std::string>& fields) {
  size_t body = 1 + 4;
  for (const auto& f : fields) body += 4 + f.size();
  std::string s;
  s.reserve(4 + body);
  put_u32(s, static_cast<uint32_t>(body));
  s.push_back(static_cast<char>(code));
  put_u32(s, static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) {
    put_u32(s, static_cast<uint32_t>(f.size()));
    s += f;
  }
  return s;
}

/// Parses a frame body; false when it is malformed.
inline bool decode(const char* p, size_t n, uint8_t& code, std::vector<std::string>& fields) {
  if (n < 5) return false;
  code = static_cast<uint8_t>(p[0]);
  uint32_t count = get_u32(p + 1);
  size_t off = 5;
  fields.clear();
  for (uint32_t i = 0; i < count; ++i) {
    if (n - off < 4) return false;
    uint32_t len = get_u32(p + off);
    off += 4;
    if (n - off < len) return false;
    fields.emplace_back(p + off, len);
    off += len;
  }
  return off == n;
}

}  // namespace tandem::dist::proto
