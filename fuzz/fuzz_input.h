#pragma once
// A fuzz input as a file: the readers under test open paths, so each input is written to an
// in-memory file (memfd) and handed over as /proc/self/fd/N. Nothing touches the disk.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace tandem::fuzz {

class MemFile {
 public:
  MemFile() : fd_(memfd_create("tandem-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();  // the harness cannot run at all: nothing to report
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  /// Replaces the file's content with data and returns its path.
  const std::string& hold(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || (size && pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size))) std::abort();
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace tandem::fuzz
