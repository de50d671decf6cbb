// What the codecs share: traffic counters, timed waits, pending collectives per bucket.
#include "distributed/engine/grad_codec.h"

#include <chrono>

namespace tandem::dist::detail {

void count_all_reduce(CommStats& stats, int64_t bytes, int world) {
  int64_t wire = bytes * 2 * (world - 1) / world;
  stats.bytes_sent += wire;
  stats.bytes_received += wire;
  stats.collectives++;
}

namespace {
void count_half_exchange(CommStats& stats, int64_t bytes, int world) {
  int64_t wire = bytes * (world - 1) / world;
  stats.bytes_sent += wire;
  stats.bytes_received += wire;
  stats.collectives++;
}
}  // namespace

void count_reduce_scatter(CommStats& stats, int64_t bytes, int world) { count_half_exchange(stats, bytes, world); }
void count_all_gather(CommStats& stats, int64_t bytes, int world) { count_half_exchange(stats, bytes, world); }

void timed_wait(WorkPtr& w, CommStats& stats) {
  if (!w) return;
  auto t0 = std::chrono::steady_clock::now();
  w->wait();
  stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  w.reset();
}

BucketWork::~BucketWork() { reset(0); }

void BucketWork::reset(size_t buckets) {
  for (WorkPtr& w : work_)
    if (w) try {
        w->wait();
      } catch (const std::exception&) {
        // Already failing: the error that matters was (or will be) reported where it happened.
      }
  work_.assign(buckets, nullptr);
}

}  // namespace tandem::dist::detail
