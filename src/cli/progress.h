#pragma once
// Internal: a one-line progress bar on stderr, redrawn at most ten times a second.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem::cli {

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
    constexpr int width = 30;
    int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld  %.0f samples/s ", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), secs > 0 ? samples / secs : 0.0);
    std::fflush(stderr);
    drawn_ = true;
  }

  /// Clears the line so the next output starts clean.
  void finish() {
    if (enabled_ && drawn_) {
      std::fprintf(stderr, "\r\033[K");
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
