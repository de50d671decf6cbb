#pragma once
// Internal: what the fused attention (cuda_attention.cpp) needs from device code (cuda_softmax.cu).
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::backend {

/// out[0] = seed, out[1] = offset + (*replays << 40): the dropout seed and offset cuDNN's attention reads
/// from the device (two i64), so that each replay of a recorded step draws new masks, as dropout_mask does.
void launch_attention_rng_state(uint64_t seed, uint64_t offset, const unsigned long long* replays, int64_t* out,
                                cudaStream_t stream);

}  // namespace tandem::backend
