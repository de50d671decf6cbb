// InitOnce: one run under concurrent callers, a retry after a throw, and library-style one-time
// initialisations (std::call_once) nested inside it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/init_once.h"

namespace tandem {
namespace {

TEST(InitOnce, RunsOnceUnderConcurrentCallers) {
  InitOnce once;
  std::atomic<int> runs{0}, seen_done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      once([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ++runs;
      });
      seen_done += runs.load() == 1;  // every caller returns after the initialiser finished
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(seen_done.load(), 8);
}

TEST(InitOnce, AnInitialiserThatThrowsIsRetried) {
  InitOnce once;
  int runs = 0;
  EXPECT_THROW(once([&] {
                 ++runs;
                 throw std::runtime_error("no device");
               }),
               std::runtime_error);
  once([&] { ++runs; });
  once([&] { ++runs; });
  EXPECT_EQ(runs, 2);
}

// What a library does inside our initialiser (cudnnCreate's own one-time set-up): its call_once must
// run its own function, once, and ours must not run again.
TEST(InitOnce, NestedCallOnceRunsItsOwnFunction) {
  InitOnce outer;
  std::once_flag library_flag;
  int ours = 0, library = 0;
  auto library_init = [&] { std::call_once(library_flag, [&] { ++library; }); };
  outer([&] {
    ++ours;
    library_init();
    library_init();
  });
  outer([&] { ++ours; });
  library_init();
  EXPECT_EQ(ours, 1);
  EXPECT_EQ(library, 1);
}

}  // namespace
}  // namespace tandem
