#include "distributed/launch/progress.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "distributed/rank_list.h"
#include "tandem/distributed/bootstrap.h"

namespace tandem::dist {

namespace detail {

namespace {

using namespace std::chrono_literals;

// Often enough that a rank which stopped a second before a timeout has said so; rarely enough that a
// large job costs its store little (and nothing at all while no rank moves).
constexpr auto kPublishEvery = 500ms;

struct Progress {
  std::atomic<int64_t> step{-1};
  std::atomic<int64_t> collectives{0};
  std::mutex mu;
  bool started = false;
  std::string host;
  int port = 0;
  StoreAuth auth;
  std::string prefix;
  int rank = 0, world_size = 1;
};

// Never destroyed: the publisher thread outlives every static object.
Progress& progress() {
  static Progress* p = new Progress;
  return *p;
}

std::string encode(int64_t step, int64_t collectives) {
  return std::to_string(step) + " " + std::to_string(collectives);
}

bool decode(const std::string& v, int64_t& step, int64_t& collectives) {
  size_t sp = v.find(' ');
  if (sp == std::string::npos) return false;
  auto a = std::from_chars(v.data(), v.data() + sp, step);
  auto b = std::from_chars(v.data() + sp + 1, v.data() + v.size(), collectives);
  return a.ec == std::errc() && b.ec == std::errc() && b.ptr == v.data() + v.size();
}

void publish_forever(Progress& p, std::unique_ptr<Store> store) {
  std::string last;
  const std::string key = p.prefix + "progress/" + std::to_string(p.rank);
  for (;;) {
    std::this_thread::sleep_for(kPublishEvery);
    std::string v = encode(p.step.load(std::memory_order_relaxed), p.collectives.load(std::memory_order_relaxed));
    if (v == last) continue;
    try {
      if (!store) store = std::make_unique<Store>(p.host, p.port, 5s, p.auth);
      store->set(key, v);
      last = v;
    } catch (const std::exception&) {
      store.reset();  // the store may be gone with the job; reports are best effort
      std::this_thread::sleep_for(2s);
    }
  }
}

}  // namespace

void start_progress_publisher(const std::string& host, int port, const StoreAuth& auth, const std::string& prefix,
                              int rank, int world_size) {
  Progress& p = progress();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.started) return;
  p.started = true;
  p.host = host;
  p.port = port;
  p.auth = auth;
  p.prefix = prefix;
  p.rank = rank;
  p.world_size = world_size;
  // Connected here rather than on the thread: authenticating while the process exits would race
  // with the exit handlers.
  std::unique_ptr<Store> store;
  try {
    store = std::make_unique<Store>(host, port, 5s, auth);
  } catch (const std::exception&) {
    // the thread tries again
  }
  std::thread([&p, s = std::move(store)]() mutable { publish_forever(p, std::move(s)); }).detach();
}

void note_collective() { progress().collectives.fetch_add(1, std::memory_order_relaxed); }

std::string stalled_ranks_note() {
  Progress& p = progress();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.started) return "";
  }
  const int64_t my_step = p.step.load(), my_coll = p.collectives.load();
  std::map<std::pair<int64_t, int64_t>, std::vector<int>> behind;  // (step, collectives) -> ranks there
  std::vector<int> silent;
  bool any = false;
  try {
    Store store(p.host, p.port, 2s, p.auth);
    for (int r = 0; r < p.world_size; ++r) {
      if (r == p.rank) continue;
      auto v = store.try_get(p.prefix + "progress/" + std::to_string(r));
      int64_t step = 0, coll = 0;
      if (!v || !decode(*v, step, coll)) {
        silent.push_back(r);
        continue;
      }
      any = true;
      // Behind: an earlier step, or the same step with fewer collectives issued (it stopped before
      // the one this rank waits in).
      if (step < my_step || (step == my_step && coll < my_coll)) behind[{step, coll}].push_back(r);
    }
  } catch (const std::exception&) {
    return "";  // the store is gone too: nothing to add
  }
  if (!any) return "";
  std::string s;
  for (const auto& [where, ranks] : behind) {
    s += s.empty() ? ": " : "; ";
    if (where.first >= 0)
      s += rank_list(ranks) + " made no progress since step " + std::to_string(where.first);
    else
      s += rank_list(ranks) + " stopped after issuing " + std::to_string(where.second) + " collectives (this rank " +
           std::to_string(my_coll) + ")";
  }
  if (!behind.empty() && my_step >= 0) s += " (this rank is at step " + std::to_string(my_step) + ")";
  if (!silent.empty()) s += (s.empty() ? ": " : "; ") + rank_list(silent) + " never reported progress";
  return s;
}

}  // namespace detail

void report_step(int64_t step) { detail::progress().step.store(step, std::memory_order_relaxed); }

}  // namespace tandem::dist
