#pragma once
// Internal: counter-based random numbers shared by the CPU and CUDA backends, so that a seed gives
// the same values on every device. Element i of a fill draws from (seed, offset + i) alone.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

namespace tandem::rng {

/// A 64-bit mix of (seed, counter): two rounds of a SplitMix-style finaliser.
TANDEM_HD uint64_t mix(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  z += seed ^ 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 32)) * 0xD6E8FEB86659FD93ull;
  z = (z ^ (z >> 32)) * 0xD6E8FEB86659FD93ull;
  return z ^ (z >> 32);
}

/// Uniform double in [0, 1) with 53 random bits.
TANDEM_HD double uniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(mix(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

/// Uniform float in [0, 1) with 24 random bits (for dropout masks).
TANDEM_HD float uniform_f(uint64_t seed, uint64_t counter) {
  return static_cast<float>(mix(seed, counter) >> 40) * (1.0f / 16777216.0f);
}

/// Standard normal draw (Box-Muller on two independent uniforms), computed in double.
TANDEM_HD double normal(uint64_t seed, uint64_t counter) {
  double u1 = (static_cast<double>(mix(seed, counter) >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
  double u2 = uniform(seed ^ 0x5851F42D4C957F2Dull, counter);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

}  // namespace tandem::rng
