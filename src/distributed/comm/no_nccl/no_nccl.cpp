// Built without NCCL: CUDA tensors cannot be exchanged between processes.
#include "distributed/rendezvous/group.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

std::shared_ptr<Communicator> make_nccl_communicator(const GroupSpec&) {
  TANDEM_CHECK(false, "tandem was built without NCCL; multi-process training on GPU tensors needs it (install "
               "NCCL next to the CUDA toolkit and rebuild with -DTANDEM_NCCL=ON), or train on CPU tensors with Gloo");
}

}  // namespace tandem::dist::detail
