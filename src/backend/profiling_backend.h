#pragma once
// Internal: the backend seen by backend_for while a device is profiled (tandem/profiler.h). It times
// each kernel call alone and passes it on to the device's backend.
#include "backend/backend.h"

namespace tandem::backend {

/// The timing wrapper of `inner` for device d (one per device, kept for the process's lifetime).
Backend& profiling_backend(Backend& inner, Device d);

}  // namespace tandem::backend
