#pragma once
// Internal: creating the files tandem writes. None of these opens a path through a symbolic link or
// reuses a file it did not create: a link planted where an output or its temporary file will appear
// (in /tmp, in a shared directory) must never let a run overwrite the file the link points to.
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace tandem::io {

/// An owned file descriptor, closed when it goes out of scope.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  /// Gives up ownership without closing.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes the descriptor held (if any).
  void reset();
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// Writes all n bytes at p to fd, retrying short writes; throws tandem::Error (Runtime) naming the
/// `what` ("checkpoint", "metrics file") at path when the system refuses.
void write_all(int fd, const void* p, size_t n, const std::string& path, const char* what);

/// Replaces path with a file whose content `write` puts through the descriptor it is given. The
/// content goes to a new file created exclusively in path's directory (".NAME.XXXXXXXX.partial", a
/// random name, never an existing file or link), is flushed to disk and renamed over path, so
/// readers see the old file or the whole new one, and a link at path is replaced, not followed.
/// On any failure (including an exception from `write`) the new file is removed and path is left
/// as it was. Throws tandem::Error naming `what` and path: Input when the directory is missing or
/// not writable or path is a directory, Runtime when writing fails.
void write_file_atomically(const std::string& path, const char* what, const std::function<void(int fd)>& write);

/// write_file_atomically with `bytes` as the whole content.
void write_file_atomically(const std::string& path, const char* what, std::string_view bytes);

/// Checks that write_file_atomically(path) could create its file: the directory exists and a file
/// can be created in it (read-only mounts, permissions and quotas included). The probe file is
/// created exclusively and removed. Throws tandem::Error (Input) saying what to fix.
void check_can_write(const std::string& path, const char* what);

/// Opens path for appending, creating it (mode 0666 less the umask) when missing. Refuses, with a
/// tandem::Error (Input) that names path, a symbolic link, anything but a regular file and a file
/// with other hard links; the checks are made on the opened descriptor, and opening never blocks.
UniqueFd open_for_append(const std::string& path, const char* what);

/// Creates path as a new, empty file; refuses (tandem::Error, Input) when anything, a file or a
/// link, is already there.
UniqueFd create_new_file(const std::string& path, const char* what);

}  // namespace tandem::io
