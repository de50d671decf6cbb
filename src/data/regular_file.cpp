#include "data/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tandem/error.h"

namespace tandem::io {

std::FILE* open_regular_file(const std::string& path, const char* what, uint64_t& size) {
  // O_NONBLOCK: opening a FIFO without a writer would otherwise wait for one. The type is checked on
  // the opened descriptor, so a file swapped between a check and the open cannot slip through.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    TANDEM_CHECK(err != ENOENT, what, " '", path, "' does not exist");
    TANDEM_CHECK(false, "cannot open ", what, " '", path, "': ", std::strerror(err));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    bool stat_failed = st.st_mode == 0;
    ::close(fd);
    TANDEM_CHECK(!stat_failed, "cannot inspect ", what, " '", path, "': ", std::strerror(err));
    TANDEM_CHECK(!S_ISDIR(st.st_mode), what, " '", path, "' is a directory, not a file");
    TANDEM_CHECK(false, what, " '", path, "' is not a regular file (",
                 S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a device",
                 "); give the path of a file");
  }
  // Regular files never block; clearing the flag keeps later reads plain.
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::FILE* f = fdopen(fd, "rb");
  if (!f) {
    int err = errno;
    ::close(fd);
    TANDEM_RUNTIME_CHECK(false, "cannot open ", what, " '", path, "': ", std::strerror(err));
  }
  size = static_cast<uint64_t>(st.st_size);
  return f;
}

}  // namespace tandem::io
