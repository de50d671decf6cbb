// Built without Gloo: CPU tensors cannot be exchanged between processes.
#include "distributed/rendezvous/group.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

std::shared_ptr<Communicator> make_gloo_communicator(const GroupSpec&) {
  TANDEM_CHECK(false, "tandem was built without Gloo; multi-process training on CPU tensors needs it (install Gloo "
               "and rebuild with -DTANDEM_GLOO=ON), or train on GPUs with NCCL");
}

}  // namespace tandem::dist::detail
