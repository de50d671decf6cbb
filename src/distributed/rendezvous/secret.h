#pragma once
// Internal: the job's shared secret and the primitives of the store's challenge-response. The HMAC
// comes from OpenSSL's libcrypto (distributed/rendezvous/openssl) or, in builds without it, from a
// stub that refuses to authenticate (distributed/rendezvous/no_openssl).
#include <cstddef>
#include <string>

namespace tandem::dist::secret {

/// Bytes of a secret the launcher makes, and the least a user-given secret must have.
constexpr size_t kGeneratedBytes = 32;
constexpr size_t kMinBytes = 16;

/// True when this build can authenticate (it has libcrypto).
bool available();
/// HMAC-SHA256 of message under key (32 raw bytes); throws tandem::Error when !available().
std::string hmac_sha256(const std::string& key, const std::string& message);
/// n bytes from the kernel's random generator.
std::string random_bytes(size_t n);
/// Equality that takes the same time wherever the strings differ (they are compared as proofs).
bool equal(const std::string& a, const std::string& b);
/// Lower-case hexadecimal, and back; from_hex returns "" for text that is not hexadecimal.
std::string to_hex(const std::string& bytes);
std::string from_hex(const std::string& hex);

/// The bytes of a secret file: it must be a regular file that only its owner may read, holding at
/// least kMinBytes bytes (one trailing newline is dropped). Throws tandem::Error (Input) naming the
/// problem and its fix.
std::string read_file(const std::string& path);

}  // namespace tandem::dist::secret
