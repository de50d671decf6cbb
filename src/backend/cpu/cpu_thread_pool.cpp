// CPU backend: the fork-join thread pool behind parallel_tasks.
//
// Why not OpenMP's: on a machine with as many threads as cores, any other busy process (a data
// loader, a build) deschedules one of the team now and then. OpenMP then keeps the whole team at
// the barrier, and its idle threads spin for milliseconds, taking the very core the late thread
// needs: a training step was seen to slow down five to ten times. Here the caller hands tasks out
// one at a time and takes part itself, so a job finishes as soon as its tasks are done, whether or
// not every worker woke up; idle workers spin briefly, then yield, then sleep.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_parallel.h"
#include "core/init_once.h"

namespace tandem::backend::cpu {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

using Clock = std::chrono::steady_clock;

// Idle workers poll for this long before sleeping: longer than the gap between two kernels of a
// training step, so back-to-back kernels find them awake.
constexpr auto kIdleSpin = std::chrono::microseconds(200);
// Pure spinning (no yield) at the start of a wait, for jobs that follow each other closely.
constexpr auto kTightSpin = std::chrono::microseconds(3);

// The job being run. The pool keeps one and reuses it, so a worker that looks at it late never
// touches freed memory; the job id tells it whether what it sees is still the job it woke up for.
struct Job {
  TaskFn fn = nullptr;
  void* ctx = nullptr;
  int64_t count = 0;
  int max_workers = 0;             // workers allowed to join (the caller is slot 0)
  alignas(64) std::atomic<int64_t> next{0};  // next task to hand out
  alignas(64) std::atomic<int64_t> done{0};  // tasks finished (on its own cache line: both threads bump it)
  std::atomic<bool> failed{false};
  std::exception_ptr error;        // the first task failure, rethrown by the caller
};

thread_local bool t_in_task = false;

void run_tasks(Job& job, int slot) {
  const bool prev = t_in_task;
  t_in_task = true;
  for (;;) {
    const int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.count) break;
    if (!job.failed.load(std::memory_order_relaxed)) {
      try {
        job.fn(job.ctx, i, slot);
      } catch (...) {
        if (!job.failed.exchange(true)) job.error = std::current_exception();
      }
    }
    job.done.fetch_add(1, std::memory_order_release);
  }
  t_in_task = prev;
}

// Spins, then yields, until cond holds.
template <typename Cond>
void wait_until(Cond cond) {
  const auto start = Clock::now();
  for (int i = 0; !cond(); ++i) {
    if (i < 64 || Clock::now() - start < kTightSpin)
      cpu_relax();
    else
      sched_yield();
  }
}

class Pool {
 public:
  void run(int64_t count, int threads, TaskFn fn, void* ctx) {
    std::unique_lock<std::mutex> lock(submit_, std::try_to_lock);
    if (!lock.owns_lock()) {  // another host thread is using the pool: run on this one
      run_inline(count, fn, ctx);
      return;
    }
    grow(threads - 1);
    wait_until([&] { return refs_.load(std::memory_order_seq_cst) == 0; });  // stragglers of the last job
    job_.fn = fn;
    job_.ctx = ctx;
    job_.count = count;
    job_.max_workers = threads - 1;
    job_.next.store(0, std::memory_order_relaxed);
    job_.done.store(0, std::memory_order_relaxed);
    job_.failed.store(false, std::memory_order_relaxed);
    job_.error = nullptr;
    const uint64_t id = ++last_id_;
    active_.store(id, std::memory_order_seq_cst);
    gen_.store(id, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) gen_.notify_all();
    run_tasks(job_, 0);
    wait_until([&] { return job_.done.load(std::memory_order_acquire) == count; });
    active_.store(0, std::memory_order_seq_cst);
    // A worker that joined may still be leaving run_tasks: the job must not change under it.
    wait_until([&] { return refs_.load(std::memory_order_seq_cst) == 0; });
    if (job_.error) {
      std::exception_ptr e = job_.error;
      job_.error = nullptr;
      std::rethrow_exception(e);
    }
  }

  static void run_inline(int64_t count, TaskFn fn, void* ctx) {
    const bool prev = t_in_task;
    t_in_task = true;
    try {
      for (int64_t i = 0; i < count; ++i) fn(ctx, i, 0);
    } catch (...) {
      t_in_task = prev;
      throw;
    }
    t_in_task = prev;
  }

 private:
  void grow(int workers) {
    while (static_cast<int>(workers_.size()) < workers) {
      const int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { worker_loop(index); });
      workers_.back().detach();  // the pool lives as long as the process
    }
  }

  void worker_loop(int index) {
    // Ids start at 1: a new worker looks at whatever job is current, the one that started it included.
    uint64_t seen = 0;
    for (;;) {
      seen = wait_for_job(seen);
      refs_.fetch_add(1, std::memory_order_seq_cst);
      if (active_.load(std::memory_order_seq_cst) == seen && index < job_.max_workers) run_tasks(job_, index + 1);
      refs_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // Returns the job id once it differs from seen: a short spin, yields, then a futex sleep.
  uint64_t wait_for_job(uint64_t seen) {
    auto start = Clock::now();
    for (int i = 0;; ++i) {
      const uint64_t g = gen_.load(std::memory_order_acquire);
      if (g != seen) return g;
      if ((i & 63) != 63) {
        cpu_relax();
        continue;
      }
      const auto waited = Clock::now() - start;
      if (waited < kTightSpin) continue;
      if (waited < kIdleSpin) {
        sched_yield();
        continue;
      }
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      gen_.wait(seen, std::memory_order_seq_cst);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      start = Clock::now();
    }
  }

  std::mutex submit_;
  std::vector<std::thread> workers_;
  Job job_;
  uint64_t last_id_ = 0;
  std::atomic<uint64_t> gen_{0};     // wakes the workers: the id of the latest job
  std::atomic<uint64_t> active_{0};  // the id of the job running now, 0 between jobs
  std::atomic<int> refs_{0};         // workers looking at job_
  std::atomic<int> sleepers_{0};
};

// The pool is never destroyed: its workers may be asleep in it when the process exits. A forked
// child has none of the parent's workers, so it starts a pool of its own.
Pool* g_pool = nullptr;
InitOnce g_pool_once;

void reset_pool_in_child() { g_pool = new Pool(); }

Pool& pool() {
  g_pool_once([] {
    g_pool = new Pool();
    pthread_atfork(nullptr, nullptr, reset_pool_in_child);
  });
  return *g_pool;
}

}  // namespace

void parallel_tasks(int64_t count, int threads, TaskFn fn, void* ctx) {
  if (count <= 0) return;
  threads = static_cast<int>(std::min<int64_t>({threads, count, max_threads()}));
  if (threads <= 1 || t_in_task) {
    Pool::run_inline(count, fn, ctx);
    return;
  }
  pool().run(count, threads, fn, ctx);
}

}  // namespace tandem::backend::cpu
