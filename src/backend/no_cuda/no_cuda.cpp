// Built without CUDA: there is no CUDA backend, and every request for a GPU says so.
#include "backend/backend.h"

namespace tandem::backend {
Backend* make_cuda_backend() { return nullptr; }
}  // namespace tandem::backend
