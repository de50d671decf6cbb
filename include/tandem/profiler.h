#pragma once
// Time profiling per device: how long the kernels that ops, backward and the optimizers run take, by
// kernel name (SINGA's Device::SetVerbosity, SetSkipIteration and PrintTimeProfiling). Off by
// default; while on, every kernel on the device is timed alone (on a GPU the host waits for the device
// before and after each one), so steps run slower than they otherwise would.
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/device.h"

namespace tandem::profiler {

/// Where a kernel's time is counted: inside a backward pass, an optimizer's step, the distributed
/// optimizer's gradient work, a recorded step replayed whole, or elsewhere (forward).
enum class Phase : uint8_t { Forward, Backward, Update, Distributed, Recorded };
/// "forward", "backward", "update", "distributed", "recorded".
const char* phase_name(Phase p);

/// One kernel name in one phase: calls and seconds summed over what was profiled.
struct OpTime {
  std::string name;
  Phase phase = Phase::Forward;
  int64_t calls = 0;
  double seconds = 0.0;
};

struct Profile {
  int verbosity = 0;
  int skip_iterations = 5;
  int64_t iterations = 0;  // finished on the device: backward passes and replays of recorded steps
  int64_t profiled = 0;    // of those, the ones after the skipped start
  std::vector<OpTime> ops;  // in the order first timed
};

/// 0: off (the default); 1: forward and backward time per iteration; 2: each kernel as well; 3: the
/// distributed optimizer's kernels. Throws tandem::Error for other levels. Measurements are kept
/// when the level changes.
void set_verbosity(Device d, int level);
/// The first n iterations on the device are not timed (default 5: the first steps choose
/// algorithms and fill caches). Throws for n < 0.
void set_skip_iterations(Device d, int n);
/// What was measured on the device so far.
Profile profile(Device d);
/// Forgets the measurements and the iteration count (the skipped start begins again).
void reset(Device d);
/// The report of the device's profile at its verbosity, per profiled iteration; empty at 0.
std::string report(Device d);
/// Counts one finished iteration on the device (the end of a backward pass; DeviceGraph::replay).
void end_iteration(Device d);

/// While alive, the kernels the calling thread runs count as backward (the autograd engine holds one).
class BackwardScope {
 public:
  BackwardScope();
  ~BackwardScope();
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;

 private:
  bool prev_;
};

namespace detail {
/// True while some device's verbosity is above 0: the one check kernels pay when profiling is off.
bool any_enabled();
/// Whether the device's verbosity is above 0.
bool enabled(Device d);
/// Whether a kernel of `phase` about to run on the device is timed: enabled and past the skipped
/// iterations. (A forward kernel after a finished backward pass begins the next iteration: the
/// optimizer's step after backward counts in the backward pass's iteration.)
bool timing(Device d, Phase phase);
/// The phase of a kernel the calling thread runs now: Backward inside a BackwardScope, else Forward.
Phase thread_phase();
/// Adds one timed call of `name`.
void add(Device d, const char* name, Phase phase, double seconds);
}  // namespace detail

}  // namespace tandem::profiler
