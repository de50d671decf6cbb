#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "tandem/error.h"
#include "tandem/profiler.h"

namespace tandem::backend {

Backend* make_cpu_backend();   // backend/cpu
Backend* make_cuda_backend();  // backend/cuda, or backend/no_cuda returning null

Backend& cpu_backend() {
  static Backend* b = make_cpu_backend();
  return *b;
}

Backend* cuda_backend() {
  static Backend* b = make_cuda_backend();
  return b;
}

Backend& backend_for(Device d) {
  Backend* b = d.is_cpu() ? &cpu_backend() : cuda_backend();
  TANDEM_CHECK(b != nullptr, "device ", d.str(), " requested, but tandem was built without CUDA");
  if (profiler::detail::any_enabled()) [[unlikely]]
    return profiling_backend(*b, d);
  return *b;
}

}  // namespace tandem::backend

namespace tandem::backend {

std::unique_ptr<CapturedWork> Backend::capture(int, const std::function<void()>&) {
  detail::throw_error(Error::Kind::Input, "recording device work into a graph needs a CUDA device");
}

}  // namespace tandem::backend
