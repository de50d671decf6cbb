#pragma once
// Internal: the raw NCCL all-reduce, timed without tandem in between, for the benchmark's baseline.
#include <cstdint>
#include <vector>

namespace tandem::dist {

/// Seconds per in-place f32 ncclAllReduce for each message size (bytes), on a communicator of its
/// own over the job's ranks, on the given GPU. Collective: every rank calls it. Empty when tandem was
/// built without NCCL.
std::vector<double> raw_nccl_allreduce_seconds(const std::vector<int64_t>& sizes, int iters, int warmup, int device);

}  // namespace tandem::dist
