// HMAC-SHA256 from OpenSSL's libcrypto.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "core/init_once.h"
#include "distributed/rendezvous/secret.h"
#include "tandem/error.h"

namespace tandem::dist::secret {

bool available() { return true; }

std::string hmac_sha256(const std::string& key, const std::string& message) {
  // OpenSSL frees its state from an exit handler by default; the thread that publishes this rank's
  // progress may still authenticate a connection then, so the state is left to the end of the process.
  static InitOnce init;
  init([] { OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr); });
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const unsigned char* r = HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                                reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  TANDEM_RUNTIME_CHECK(r != nullptr && len == 32, "HMAC-SHA256 (OpenSSL) failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}

}  // namespace tandem::dist::secret
