// The CPU backend's thread pool: every task once, failures, nesting, concurrent callers and fork.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "backend/cpu/cpu_parallel.h"
#include "cpu_test_util.h"

namespace tandem::testing {
namespace {

using backend::cpu::parallel_for;
using backend::cpu::parallel_tasks;

TEST(CpuThreadPool, RunsEveryTaskOnceWithSlotsInRange) {
  for (int threads : {1, 2, 3}) {
    ThreadScope scope(threads);
    for (int64_t count : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
      std::atomic<bool> bad_slot{false};
      parallel_tasks(count, threads, [&](int64_t i, int slot) {
        hits[static_cast<size_t>(i)]++;
        if (slot < 0 || slot >= threads) bad_slot = true;
      });
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
      EXPECT_FALSE(bad_slot);
    }
  }
}

TEST(CpuThreadPool, SpreadsWorkOverThreads) {
  ThreadScope two(2);
  std::atomic<int> distinct_slots{0};
  std::atomic<bool> seen[2] = {false, false};
  // Each task waits until both threads have taken one (or gives up after seconds): the job can only
  // finish early if a second thread joins it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  parallel_tasks(4, 2, [&](int64_t, int slot) {
    if (!seen[slot].exchange(true)) distinct_slots++;
    while (distinct_slots.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  });
  EXPECT_EQ(distinct_slots.load(), 2);
}

TEST(CpuThreadPool, RethrowsTheFirstFailureAndStaysUsable) {
  ThreadScope two(2);
  std::atomic<int> ran{0};
  try {
    parallel_tasks(100, 2, [&](int64_t i, int) {
      ran++;
      if (i == 37) TANDEM_CHECK(false, "task ", i, " failed");
    });
    FAIL() << "the failure was swallowed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("task 37 failed"), std::string::npos) << e.what();
  }
  // Tasks are handed out in order; with two threads at most one earlier task can still be pending
  // when the failure is seen (and is then skipped, like the later ones).
  EXPECT_GE(ran.load(), 37);
  EXPECT_LE(ran.load(), 100);
  std::atomic<int64_t> sum{0};
  parallel_tasks(10, 2, [&](int64_t i, int) { sum += i; });
  EXPECT_EQ(sum.load(), 45);
}

TEST(CpuThreadPool, NestedCallsRunInline) {
  ThreadScope two(2);
  std::atomic<int64_t> total{0};
  parallel_tasks(8, 2, [&](int64_t, int outer_slot) {
    parallel_tasks(5, 2, [&](int64_t j, int inner_slot) {
      EXPECT_EQ(inner_slot, 0);  // inline on the thread that runs the outer task
      total += j;
    });
    (void)outer_slot;
  });
  EXPECT_EQ(total.load(), 8 * 10);
}

TEST(CpuThreadPool, ConcurrentCallersBothFinish) {
  ThreadScope two(2);
  std::atomic<int64_t> a{0}, b{0};
  auto work = [](std::atomic<int64_t>& acc) {
    for (int rep = 0; rep < 200; ++rep) parallel_tasks(50, 2, [&](int64_t i, int) { acc += i; });
  };
  std::thread other([&] { work(b); });
  work(a);
  other.join();
  EXPECT_EQ(a.load(), 200 * 1225);
  EXPECT_EQ(b.load(), 200 * 1225);
}

TEST(CpuThreadPool, ParallelForCoversTheRangeInGrainSizedPieces) {
  ThreadScope two(2);
  for (int64_t n : {0, 5, 100, 40000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int64_t> smallest{n};
    parallel_for(n, 1000, [&](int64_t begin, int64_t end) {
      int64_t len = end - begin, cur = smallest.load();
      while (len < cur && !smallest.compare_exchange_weak(cur, len)) {
      }
      for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << i;
    if (n >= 2000) {
      EXPECT_GE(smallest.load(), 1000) << n;
    }
  }
}

TEST(CpuThreadPool, AForkedChildGetsAWorkingPool) {
  ThreadScope two(2);
  parallel_tasks(10, 2, [](int64_t, int) {});  // the parent's workers exist before the fork
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atomic<int64_t> sum{0};
    parallel_tasks(1000, 2, [&](int64_t i, int) { sum += i; });
    _exit(sum.load() == 499500 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace tandem::testing
