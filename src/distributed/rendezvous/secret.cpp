#include "distributed/rendezvous/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "distributed/rendezvous/net.h"
#include "tandem/error.h"

namespace tandem::dist::secret {

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    TANDEM_RUNTIME_CHECK(r > 0, "getrandom failed: ", net::errno_str(errno));
    got += static_cast<size_t>(r);
  }
  return out;
}

bool equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string to_hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2) return "";
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return "";
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

std::string read_file(const std::string& path) {
  // O_NONBLOCK: a FIFO in its place must not block the start-up; it is refused below.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  TANDEM_CHECK(fd >= 0, "cannot open the secret file '", path, "' (TANDEM_SECRET_FILE): ", net::errno_str(errno));
  struct stat st {};
  int rc = fstat(fd, &st);
  auto fail = [&](const std::string& why) {
    close(fd);
    TANDEM_CHECK(false, "the secret file '", path, "' (TANDEM_SECRET_FILE) ", why);
  };
  if (rc != 0) fail("cannot be read: " + net::errno_str(errno));
  if (!S_ISREG(st.st_mode)) fail("is not a regular file");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    fail("may be read by other users; make it private: chmod 600 '" + path + "'");
  if (st.st_size > 4096) fail("is larger than 4 KiB; a secret of 32 random bytes is enough");
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("could not be read: " + net::errno_str(r < 0 ? errno : EIO));
    got += static_cast<size_t>(r);
  }
  close(fd);
  if (!bytes.empty() && bytes.back() == '\n') bytes.pop_back();
  TANDEM_CHECK(bytes.size() >= kMinBytes, "the secret file '", path, "' (TANDEM_SECRET_FILE) holds ", bytes.size(),
               " bytes; a secret needs at least ", kMinBytes, " (make one with: head -c 32 /dev/urandom > FILE)");
  return bytes;
}

}  // namespace tandem::dist::secret
