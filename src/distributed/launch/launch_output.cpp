#include "distributed/launch/launch_output.h"

#include <errno.h>
#include <unistd.h>

#include "distributed/rendezvous/net.h"

namespace tandem::dist::detail {

namespace {
// A partial line longer than this is written out as a line of its own rather than held forever.
constexpr size_t kMaxPending = 1 << 16;
}  // namespace

LineRelay::LineRelay(int rank, int in_fd, int out_fd)
    : rank_(rank), in_fd_(in_fd), out_fd_(out_fd),
      prefix_(rank == 0 ? std::string() : "[rank " + std::to_string(rank) + "] ") {}

LineRelay::LineRelay(LineRelay&& o) noexcept
    : rank_(o.rank_), in_fd_(o.in_fd_), out_fd_(o.out_fd_), prefix_(std::move(o.prefix_)),
      pending_(std::move(o.pending_)) {
  o.in_fd_ = -1;
}

LineRelay::~LineRelay() {
  if (in_fd_ >= 0) close(in_fd_);
}

void LineRelay::emit(const char* p, size_t n, bool add_newline) {
  // One write per line: nothing else writes to out_fd between the prefix and the newline.
  std::string line;
  line.reserve(prefix_.size() + n + 1);
  line += prefix_;
  line.append(p, n);
  if (add_newline) line += '\n';
  net::write_all(out_fd_, line.data(), line.size());  // an unwritable terminal must not stop the job
}

void LineRelay::pump() {
  if (in_fd_ < 0) return;
  char buf[65536];
  bool eof = false;
  for (;;) {
    ssize_t r = read(in_fd_, buf, sizeof buf);
    if (r > 0) {
      pending_.append(buf, static_cast<size_t>(r));
      if (static_cast<size_t>(r) < sizeof buf) break;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    eof = true;  // end of stream, or an error that ends it
    break;
  }
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1)
    emit(pending_.data() + start, nl + 1 - start, false);
  pending_.erase(0, start);
  // Rank 0's progress bar redraws its line from a carriage return: passed on at once, not held.
  if (rank_ == 0 && !pending_.empty() && pending_[0] == '\r') {
    emit(pending_.data(), pending_.size(), false);
    pending_.clear();
  }
  if (pending_.size() > kMaxPending) {
    emit(pending_.data(), pending_.size(), true);
    pending_.clear();
  }
  if (eof) finish();
}

void LineRelay::finish() {
  if (!pending_.empty()) emit(pending_.data(), pending_.size(), rank_ != 0);
  pending_.clear();
  if (in_fd_ >= 0) close(in_fd_);
  in_fd_ = -1;
}

}  // namespace tandem::dist::detail
