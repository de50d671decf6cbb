// Time profiles per device, and the report SINGA's PrintTimeProfiling prints.
#include "tandem/profiler.h"

#include <atomic>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#include "tandem/error.h"

namespace tandem::profiler {

namespace {

// An iteration runs from its first forward kernel to the next iteration's: the optimizer's step
// after a backward pass belongs to the pass's iteration. Only the thread that ran the pass begins the
// next one (a data loader's uploads on another thread do not).
struct DeviceProfile {
  int verbosity = 0;
  int skip = 5;
  int64_t iterations = 0;  // backward passes (and replays) finished
  int64_t started = 0;     // iterations begun: the current one's index
  bool ended = false;      // the current iteration's backward pass has finished
  std::thread::id ended_by;  // the thread that finished it
  std::vector<OpTime> ops;
  std::unordered_map<std::string, size_t> index;  // name + phase -> position in ops
};

std::mutex g_mu;
std::atomic<int> g_enabled{0};  // devices whose verbosity is above 0
thread_local bool t_backward = false;

std::map<std::pair<int, int>, DeviceProfile>& profiles() {
  static auto* p = new std::map<std::pair<int, int>, DeviceProfile>();  // outlives every static user
  return *p;
}

std::pair<int, int> key(Device d) { return {static_cast<int>(d.type), d.is_cpu() ? 0 : d.index}; }

// The caller holds g_mu.
DeviceProfile& profile_of(Device d) { return profiles()[key(d)]; }

int64_t profiled_iterations(const DeviceProfile& p) { return std::max<int64_t>(0, p.iterations - p.skip); }

// A forward kernel after a finished backward pass begins the next iteration.
void maybe_begin_iteration(DeviceProfile& p, Phase phase) {
  if (p.ended && (phase == Phase::Forward || phase == Phase::Recorded) && p.ended_by == std::this_thread::get_id()) {
    ++p.started;
    p.ended = false;
  }
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Update: return "update";
    case Phase::Distributed: return "distributed";
    case Phase::Recorded: return "recorded";
  }
  return "?";
}

void set_verbosity(Device d, int level) {
  TANDEM_CHECK(level >= 0 && level <= 3, "SetVerbosity: level ", level,
               " is not one of 0 (off), 1 (forward and backward time), 2 (each operation), 3 (distributed "
               "training operations)");
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceProfile& p = profile_of(d);
  if ((p.verbosity > 0) != (level > 0)) g_enabled += level > 0 ? 1 : -1;
  p.verbosity = level;
}

void set_skip_iterations(Device d, int n) {
  TANDEM_CHECK(n >= 0, "SetSkipIteration: the number of iterations to skip must be 0 or more, got ", n);
  std::lock_guard<std::mutex> lock(g_mu);
  profile_of(d).skip = n;
}

Profile profile(Device d) {
  std::lock_guard<std::mutex> lock(g_mu);
  const DeviceProfile& p = profile_of(d);
  return Profile{p.verbosity, p.skip, p.iterations, profiled_iterations(p), p.ops};
}

void reset(Device d) {
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceProfile& p = profile_of(d);
  p.iterations = 0;
  p.started = 0;
  p.ended = false;
  p.ops.clear();
  p.index.clear();
}

void end_iteration(Device d) {
  if (!detail::any_enabled()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceProfile& p = profile_of(d);
  if (p.verbosity == 0) return;
  if (p.ended) ++p.started;  // a pass without forward kernels of its own on this device
  ++p.iterations;
  p.ended = true;
  p.ended_by = std::this_thread::get_id();
}

std::string report(Device d) {
  const Profile p = profile(d);
  if (p.verbosity == 0) return {};
  // Per profiled iteration; totals while none has finished yet.
  const bool per_iteration = p.profiled > 0;
  const double div = per_iteration ? static_cast<double>(p.profiled) : 1.0;
  std::ostringstream ss;
  ss << std::setprecision(6);
  ss << "\nTime Profiling: " << d.str() << ", ";
  if (per_iteration)
    ss << p.profiled << " iteration" << (p.profiled == 1 ? "" : "s") << " after the first " << p.skip_iterations
       << " skipped";
  else
    ss << "totals (" << p.iterations << " of the " << p.skip_iterations << " iterations to skip finished)";
  ss << "\n";
  if (p.ops.empty()) {
    ss << "nothing was timed yet\n";
    return ss.str();
  }
  if (p.verbosity == 1) {
    double forward = 0.0, backward = 0.0, recorded = 0.0;
    for (const OpTime& op : p.ops) {
      if (op.phase == Phase::Forward)
        forward += op.seconds;
      else if (op.phase == Phase::Recorded)
        recorded += op.seconds;
      else
        backward += op.seconds;  // with the optimizer's step, as SINGA counts everything after forward
    }
    ss << "Forward Propagation Time : " << forward / div << " sec\n";
    ss << "Backward Propagation Time : " << backward / div << " sec\n";
    if (recorded > 0.0) ss << "Recorded Step Time : " << recorded / div << " sec\n";
    return ss.str();
  }
  int id = 0, shown = 0;
  for (const OpTime& op : p.ops) {
    if (p.verbosity == 3 && op.phase != Phase::Distributed) continue;
    const double calls = static_cast<double>(op.calls) / div;
    ss << "OP_ID" << id++ << ". " << op.name << " [" << phase_name(op.phase) << "] : " << op.seconds / div
       << " sec, " << calls << (calls == 1.0 ? " call" : " calls") << "\n";
    ++shown;
  }
  if (shown == 0) ss << "no distributed training operation was timed\n";
  return ss.str();
}

BackwardScope::BackwardScope() : prev_(t_backward) { t_backward = true; }
BackwardScope::~BackwardScope() { t_backward = prev_; }

namespace detail {

bool any_enabled() { return g_enabled.load(std::memory_order_relaxed) > 0; }

bool enabled(Device d) {
  if (!any_enabled()) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  return profile_of(d).verbosity > 0;
}

bool timing(Device d, Phase phase) {
  if (!any_enabled()) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceProfile& p = profile_of(d);
  if (p.verbosity == 0) return false;
  maybe_begin_iteration(p, phase);
  return p.started >= p.skip;
}

Phase thread_phase() { return t_backward ? Phase::Backward : Phase::Forward; }

void add(Device d, const char* name, Phase phase, double seconds) {
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceProfile& p = profile_of(d);
  std::string k = std::string(name) + '\0' + phase_name(phase);
  auto it = p.index.find(k);
  if (it == p.index.end()) {
    it = p.index.emplace(std::move(k), p.ops.size()).first;
    p.ops.push_back(OpTime{name, phase, 0, 0.0});
  }
  OpTime& op = p.ops[it->second];
  ++op.calls;
  op.seconds += seconds;
}

}  // namespace detail

}  // namespace tandem::profiler
