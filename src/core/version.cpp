#include "tandem/version.h"

namespace tandem {

BuildInfo build_info() {
  return BuildInfo{"0.1.0", TANDEM_WITH_CUDA != 0, TANDEM_WITH_NCCL != 0, TANDEM_WITH_GLOO != 0,
                   TANDEM_WITH_MPI != 0};
}

}  // namespace tandem
