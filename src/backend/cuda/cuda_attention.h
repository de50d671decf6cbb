#pragma once
// Internal: what the fused attention (cuda_attention.cpp) needs from device code (cuda_softmax.cu).
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::backend {

/// out[0] = seed, out[1] = offset + (*replays << 40): the dropout seed and offset cuDNN's attention reads
/// from the device (two i64), so that each replay of a recorded step draws new masks, as dropout_mask does.
void launch_attention_rng_state(uint64_t seed, uint64_t offset, const unsigned long long* replays, int64_t* out,
                                cudaStream_t stream);

/// bias [b, 1, t, t] of 16-bit floats (bf16 when bf16, else f16) = a large negative number at (b, i, j) where
/// j < i - pos[b, i] (keys of the documents before query i's, pos i32 [b, t] as AttentionGeom::doc_pos), else
/// 0: the additive mask cuDNN's attention takes for packed documents.
void launch_document_bias(const int32_t* pos, int64_t b, int64_t t, bool bf16, void* bias, cudaStream_t stream);

}  // namespace tandem::backend
