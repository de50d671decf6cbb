// The CUDA stream of tandem's kernels, for DLPack's stream hand-over.
#include "backend/cuda/cuda_context.h"
#include "binding.h"

namespace tandem::py {

uintptr_t compute_stream_handle(int device) { return reinterpret_cast<uintptr_t>(cuda::compute_stream(device)); }

}  // namespace tandem::py
