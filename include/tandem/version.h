#pragma once
// What this build of tandem contains.

namespace tandem {

struct BuildInfo {
  const char* version;
  bool cuda, nccl, gloo, mpi;
};

/// The version and the optional components compiled in.
BuildInfo build_info();

}  // namespace tandem
