// Built without MPI: a job started by mpiexec cannot learn its ranks.
#include "distributed/rendezvous/group.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

const bool kMpiBuilt = false;

MpiJob mpi_bootstrap(std::string (*)(bool, const StoreAuth&)) {
  TANDEM_CHECK(false, "tandem was built without MPI, but this process was started by mpiexec (MPI variables such as "
               "OMPI_COMM_WORLD_SIZE are set); rebuild with -DTANDEM_MPI=ON where MPI is installed, or start the job "
               "with `tandem launch` or torchrun");
}

void mpi_abort(int) {}

}  // namespace tandem::dist::detail
