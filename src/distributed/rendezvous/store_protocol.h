#pragma once
// Internal: the store's wire format. Every message is a frame: a 4-byte big-endian body length, then
// the body: a one-byte code (a request's operation or a reply's status), a 4-byte field count, and
// that many fields, each a 4-byte length and its bytes.
//
// A connection starts with a handshake before any other request is served:
//   client: kHello {kVersion, job id, client nonce}
//   server: kOk {server nonce, "open" | "secret", server proof}   or kError {why} and it hangs up
//   client (when "secret"): kAuth {client proof}
//   server: kOk {}                                                 or kError {why} and it hangs up
// Proofs are HMAC-SHA256 under the job's secret of the role, the job id and both nonces, so that
// each side shows the other that it knows the secret without sending it, and a proof recorded from
// one connection is worth nothing on another.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tandem::dist::proto {

enum Op : uint8_t { kSet = 1, kGet = 2, kTryGet = 3, kAdd = 4, kCheck = 5, kErase = 6, kHello = 7, kAuth = 8 };
enum Status : uint8_t { kOk = 0, kNotFound = 1, kError = 2 };

constexpr const char* kVersion = "tandem-store-1";
constexpr size_t kNonceBytes = 32;
/// Frames before the handshake is done are small: a client that has not proven itself cannot make
/// the server buffer more than this.
constexpr uint32_t kMaxHandshakeFrame = 1024;

/// What each side proves: HMAC(secret, role || 0 || job || 0 || nonce of the other || own nonce).
inline std::string proof_message(const char* role, const std::string& job, const std::string& their_nonce,
                                 const std::string& my_nonce) {
  std::string m = role;
  m.push_back('\0');
  m += job;
  m.push_back('\0');
  m += their_nonce;
  m += my_nonce;
  return m;
}

inline void put_u32(std::string& s, uint32_t v) {
  char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
               static_cast<char>(v)};
  s.append(b, 4);
}

inline uint32_t get_u32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

/// Bytes of the frame encode() makes (length prefix included).
inline size_t frame_size(const std::vector<std::string>& fields) {
  size_t n = 4 + 1 + 4;
  for (const auto& f : fields) n += 4 + f.size();
  return n;
}

/// A complete frame (length prefix included).
inline std::string encode(uint8_t code, const std::vector<std::string>& fields) {
  std::string s;
  s.reserve(frame_size(fields));
  put_u32(s, static_cast<uint32_t>(frame_size(fields) - 4));
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
