#pragma once
// Internal: a one-line progress bar on stderr with the rate and the time left, redrawn at most ten
// times a second. Under `tandem launch` rank 0 draws it when the launcher's own stderr is a terminal
// (the launcher says so in TANDEM_PROGRESS_TTY and passes the redraws through as they come).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tandem::cli {

/// Whether to draw the bar for --progress mode ("auto", "on", "off") on a process that reports.
inline bool progress_enabled(const std::string& mode, bool reporting_rank) {
  if (!reporting_rank || mode == "off") return false;
  if (mode == "on") return true;
  const char* relayed = std::getenv("TANDEM_PROGRESS_TTY");
  return isatty(STDERR_FILENO) || (relayed && std::strcmp(relayed, "1") == 0);
}

/// "1:05" or "1:02:05" for a number of seconds.
inline std::string format_duration(double seconds) {
  long long s = seconds > 0 ? static_cast<long long>(seconds + 0.5) : 0;
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t total, std::string label)
      : enabled_(enabled), total_(total), label_(std::move(label)), start_(std::chrono::steady_clock::now()) {}
  ~ProgressBar() { finish(); }

  /// Records that `done` of `total` steps are complete, `samples` samples processed so far.
  void update(int64_t done, int64_t samples) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    std::string line = render(done, samples, secs);
    // One write per redraw, starting at the line's beginning, so a relay can pass it on whole.
    std::fputs(("\r\033[K" + line).c_str(), stderr);
    std::fflush(stderr);
    drawn_ = true;
  }

  /// The bar's text after `secs` seconds: label, bar, count, rate and the time left.
  std::string render(int64_t done, int64_t samples, double secs) const {
    constexpr int width = 30;
    int filled = total_ > 0 ? static_cast<int>(width * std::min(done, total_) / total_) : width;
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
    std::string eta = done > 0 && done < total_ ? "  eta " + format_duration(secs / done * (total_ - done)) : "";
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s [%s] %lld/%lld  %.0f samples/s%s ", label_.c_str(), bar.c_str(),
                  static_cast<long long>(done), static_cast<long long>(total_), secs > 0 ? samples / secs : 0.0,
                  eta.c_str());
    return buf;
  }

  /// Clears the line so the next output starts clean.
  void finish() {
    if (enabled_ && drawn_) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
    }
    drawn_ = false;
  }

 private:
  bool enabled_;
  int64_t total_;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_{};
  bool drawn_ = false;
};

}  // namespace tandem::cli
