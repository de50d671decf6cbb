#pragma once
// Internal: relays the output of the launcher's children line by line, so that lines of different
// ranks never mix, prefixing every rank but rank 0 with "[rank N] ".
#include <string>

namespace tandem::dist::detail {

class LineRelay {
 public:
  /// Lines read from the child go to out_fd (the launcher's stdout or stderr).
  LineRelay(int rank, int in_fd, int out_fd);
  ~LineRelay();
  LineRelay(const LineRelay&) = delete;
  LineRelay& operator=(const LineRelay&) = delete;
  LineRelay(LineRelay&& o) noexcept;

  /// The pipe to read from, or -1 once it reached its end.
  int fd() const { return in_fd_; }
  /// Reads what is available and writes out every complete line; at the end of the stream, the last
  /// partial line too, and the pipe is closed.
  void pump();
  /// Writes out a pending partial line and closes the pipe (when its writer lingers).
  void finish();

 private:
  void emit(const char* p, size_t n, bool add_newline);
  int rank_;
  int in_fd_;
  int out_fd_;
  std::string prefix_;
  std::string pending_;
};

}  // namespace tandem::dist::detail
