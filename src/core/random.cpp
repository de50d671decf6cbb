#include "tandem/random.h"

#include "core/counter_rng.h"

namespace tandem {

uint64_t Generator::next_below(uint64_t n) {
  // Lemire's multiply-shift is unbiased enough for shuffles of up to 2^32 items; use rejection to be exact.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    uint64_t r = rng::mix(seed_, advance(1));
    if (r < limit) return r % n;
  }
}

double Generator::next_double() { return rng::uniform(seed_, advance(1)); }

}  // namespace tandem
