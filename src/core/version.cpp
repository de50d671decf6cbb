#include "tandem/version.h"

namespace tandem {

BuildInfo build_info() {
  // TANDEM_VERSION is CMake's PROJECT_VERSION, the one place the version is written.
  return BuildInfo{TANDEM_VERSION, TANDEM_WITH_CUDA != 0, TANDEM_WITH_NCCL != 0, TANDEM_WITH_GLOO != 0,
                   TANDEM_WITH_MPI != 0};
}

}  // namespace tandem
