#pragma once
// Reproducible random numbers: a counter-based generator, identical on every device.
#include <cstdint>

namespace tandem {

/// A seed plus a running counter. Each random fill consumes as many counters as it has elements,
/// so the same seed gives the same numbers on the CPU and on a GPU, in any thread count.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  /// Continues from counter o (a checkpoint's offset()).
  void set_offset(uint64_t o) { offset_ = o; }
  /// Reserves n counters and returns the first.
  uint64_t advance(uint64_t n) {
    uint64_t o = offset_;
    offset_ += n;
    return o;
  }
  /// A uniform integer in [0, n), for host-side shuffles.
  uint64_t next_below(uint64_t n);
  /// A uniform double in [0, 1).
  double next_double();

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

}  // namespace tandem
