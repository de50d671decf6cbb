#pragma once
// Internal: one-time initialisation guarded by a mutex instead of std::call_once. The initialisers
// here call into libraries (cuDNN, cuBLAS, the CUDA runtime, OpenSSL) that run one-time
// initialisations of their own; libstdc++ passes the function of a std::call_once to pthread_once
// through a per-thread slot, which a library's own once, nested inside ours, can read instead of its
// own function (cudnnCreate then called our initialiser again and waited for itself forever). A
// mutex has no such slot. An initialiser that throws leaves the flag unset: the next call retries.
#include <atomic>
#include <mutex>

namespace tandem {

class InitOnce {
 public:
  template <typename F>
  void operator()(F&& init) {
    if (done_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    init();
    done_.store(true, std::memory_order_release);
  }

 private:
  std::mutex mu_;
  std::atomic<bool> done_{false};
};

}  // namespace tandem
