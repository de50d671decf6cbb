#include "core/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "tandem/error.h"

namespace tandem::io {

namespace {

namespace fs = std::filesystem;

// A path split into the directory the file goes in and the file's own name.
struct Place {
  std::string dir, name;
};

Place place_of(const std::string& path, const char* what) {
  TANDEM_CHECK(!path.empty(), "the ", what, " needs a file name");
  fs::path p(path);
  std::string name = p.filename().string();
  TANDEM_CHECK(!name.empty() && name != "." && name != "..", "the ", what, " '", path,
               "' names a directory, not a file; give a file name");
  std::string dir = p.parent_path().string();
  return {dir.empty() ? "." : dir, name};
}

UniqueFd open_directory(const Place& at, const std::string& path, const char* what) {
  UniqueFd dir(::open(at.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) {
    const int err = errno;
    TANDEM_CHECK(err != ENOENT, "the directory of the ", what, " '", path, "' (", at.dir,
                 ") does not exist; create it first");
    TANDEM_CHECK(err != ENOTDIR, "the directory of the ", what, " '", path, "' (", at.dir, ") is not a directory");
    TANDEM_CHECK(false, "cannot write the ", what, " '", path, "': its directory ", at.dir, ": ", std::strerror(err));
  }
  return dir;
}

// 8 random letters and digits: a name nobody can plant a link at ahead of time.
std::string random_suffix() {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  uint64_t bits = (uint64_t{rd()} << 32) ^ rd();
  std::string s;
  for (int i = 0; i < 8; ++i, bits /= 62) s.push_back(kChars[bits % 62]);
  return s;
}

// A file of ours, new and empty, in the directory of path.
struct TempFile {
  UniqueFd dir, fd;
  std::string name;
};

TempFile create_temp_beside(const std::string& path, const char* what) {
  const Place at = place_of(path, what);
  TempFile t;
  t.dir = open_directory(at, path, what);
  // The name is cut short so that the prefix and suffix still fit into a file name (255 bytes).
  std::string stem(1, '.');
  stem.append(at.name, 0, 200).push_back('.');
  int err = EEXIST;
  for (int attempt = 0; attempt < 100 && err == EEXIST; ++attempt) {
    t.name = stem + random_suffix() + ".partial";
    // O_EXCL fails on anything already there, a dangling link included; O_NOFOLLOW says so twice.
    constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY;
    const int fd = ::openat(t.dir.get(), t.name.c_str(), kFlags, 0666);
    if (fd >= 0) {
      t.fd = UniqueFd(fd);
      return t;
    }
    err = errno;
  }
  TANDEM_CHECK(false, "cannot write the ", what, " '", path, "': creating a file in ", at.dir,
               " failed: ", std::strerror(err), " (is the directory writable?)");
  return t;
}

const char* file_type(mode_t mode) {
  return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISSOCK(mode) ? "a socket" : "a device";
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void write_all(int fd, const void* p, size_t n, const std::string& path, const char* what) {
  const char* at = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, at, n);
    if (w < 0 && errno == EINTR) continue;
    TANDEM_RUNTIME_CHECK(w > 0, "writing the ", what, " '", path, "' failed: ",
                         w < 0 ? std::strerror(errno) : "nothing written", " (disk full?)");
    at += w;
    n -= static_cast<size_t>(w);
  }
}

void write_file_atomically(const std::string& path, const char* what, const std::function<void(int fd)>& write) {
  TempFile t = create_temp_beside(path, what);
  try {
    write(t.fd.get());
    // The rename must not publish a file whose bytes are still only in the page cache.
    TANDEM_RUNTIME_CHECK(::fsync(t.fd.get()) == 0, "writing the ", what, " '", path, "' failed: ",
                         std::strerror(errno), " (disk full?)");
    // Network file systems may report a failed write only here.
    TANDEM_RUNTIME_CHECK(::close(t.fd.release()) == 0, "writing the ", what, " '", path, "' failed: ",
                         std::strerror(errno));
    if (::renameat(t.dir.get(), t.name.c_str(), t.dir.get(), place_of(path, what).name.c_str()) != 0) {
      const int err = errno;
      TANDEM_CHECK(err != EISDIR && err != ENOTEMPTY && err != EEXIST, "cannot write the ", what, " '", path,
                   "': it is a directory; give a file name");
      TANDEM_RUNTIME_CHECK(false, "cannot replace the ", what, " '", path, "' with the new file: ", std::strerror(err));
    }
  } catch (...) {
    t.fd.reset();
    ::unlinkat(t.dir.get(), t.name.c_str(), 0);  // a full disk must not stay full because of a half-written file
    throw;
  }
  // The new name lasts through a crash once the directory is on disk; some file systems cannot say.
  ::fsync(t.dir.get());
}

void write_file_atomically(const std::string& path, const char* what, std::string_view bytes) {
  write_file_atomically(path, what, [&](int fd) { write_all(fd, bytes.data(), bytes.size(), path, what); });
}

void check_can_write(const std::string& path, const char* what) {
  TempFile t = create_temp_beside(path, what);
  t.fd.reset();
  ::unlinkat(t.dir.get(), t.name.c_str(), 0);
}

UniqueFd open_for_append(const std::string& path, const char* what) {
  TANDEM_CHECK(!path.empty(), "the ", what, " needs a file name");
  // O_NOFOLLOW: a link at path (planted, or /dev/stdout) is refused rather than written through.
  // O_NONBLOCK: a FIFO without a reader fails at once instead of waiting for one.
  constexpr int kFlags = O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  UniqueFd fd(::open(path.c_str(), kFlags, 0666));
  if (!fd) {
    const int err = errno;
    TANDEM_CHECK(err != ELOOP, "the ", what, " '", path,
                 "' is a symbolic link; tandem does not write through links: give the path of a regular file");
    TANDEM_CHECK(err != ENXIO, "the ", what, " '", path, "' is not a regular file (a FIFO); give the path of a file");
    TANDEM_CHECK(err != EISDIR, "the ", what, " '", path, "' is a directory; give a file name");
    TANDEM_CHECK(err != ENOENT, "the directory of the ", what, " '", path, "' does not exist; create it first");
    TANDEM_CHECK(false, "cannot open the ", what, " '", path, "' for writing: ", std::strerror(err));
  }
  // Checked on the opened descriptor: a file swapped in between a check and the open cannot slip through.
  struct stat st {};
  TANDEM_RUNTIME_CHECK(::fstat(fd.get(), &st) == 0, "cannot inspect the ", what, " '", path, "': ",
                       std::strerror(errno));
  TANDEM_CHECK(S_ISREG(st.st_mode), "the ", what, " '", path, "' is not a regular file (", file_type(st.st_mode),
               "); give the path of a file");
  // Another name of the file could be a link planted to make tandem append to a file of someone else's.
  TANDEM_CHECK(st.st_nlink == 1, "the ", what, " '", path, "' has ", st.st_nlink,
               " names (hard links); tandem appends only to a file of one name: give another path");
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

UniqueFd create_new_file(const std::string& path, const char* what) {
  TANDEM_CHECK(!path.empty(), "the ", what, " needs a file name");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0666));
  if (!fd) {
    const int err = errno;
    TANDEM_CHECK(err != EEXIST, "cannot create the ", what, " '", path,
                 "': something (a file or a link) is already there, and tandem writes only a file it creates");
    TANDEM_CHECK(false, "cannot create the ", what, " '", path, "': ", std::strerror(err));
  }
  return fd;
}

}  // namespace tandem::io
