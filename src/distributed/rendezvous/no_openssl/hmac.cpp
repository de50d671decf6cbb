// Built without OpenSSL: a store can still run without a secret, but nobody can prove one.
#include "distributed/rendezvous/secret.h"
#include "tandem/error.h"

namespace tandem::dist::secret {

bool available() { return false; }

std::string hmac_sha256(const std::string&, const std::string&) {
  TANDEM_CHECK(false, "this job has a secret (TANDEM_SECRET or TANDEM_SECRET_FILE) but tandem was built without "
               "OpenSSL, which authenticates it: install libssl-dev and rebuild, or unset the secret");
}

}  // namespace tandem::dist::secret
