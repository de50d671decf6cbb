#pragma once
// Joining a distributed job: which launcher started this process, which rank it is, and the
// communicator that connects it to the other ranks.
//
// Launchers, in the order they are recognised:
//   tandem launch  TANDEM_RANK, TANDEM_WORLD_SIZE, TANDEM_LOCAL_RANK, TANDEM_LOCAL_SIZE, TANDEM_STORE_ADDR,
//                  TANDEM_JOB_ID, TANDEM_SECRET, TANDEM_RESTART_COUNT
//   mpiexec        OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the environment (tandem built with MPI);
//                  rank 0 makes the job's secret, hosts the rendezvous store and broadcasts both over MPI
//   torchrun       RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0
//                  hosts the store on MASTER_PORT (TANDEM_STORE_PORT overrides it, and under torchrun's
//                  own agent store, TORCHELASTIC_USE_AGENT_STORE=True, MASTER_PORT + 1 is used); the job
//                  id is TORCHELASTIC_RUN_ID
//   srun (Slurm)   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (or SLURM_STEP_TASKS_PER_NODE),
//                  SLURM_STEP_ID; rank 0 hosts the store on the first host of SLURM_STEP_NODELIST (MASTER_ADDR
//                  overrides it) at a port derived from the job id (TANDEM_STORE_PORT or MASTER_PORT override
//                  it); the job id is SLURM_JOB_ID.SLURM_STEP_ID
//   none           a single process (with a warning when the environment holds part of a launch)
// Other variables: TANDEM_TIMEOUT (seconds; replaces the timeout passed to init_communicator),
// TANDEM_SOCKET_IFNAME (the network interface for the store and Gloo between hosts), TANDEM_SECRET_FILE or
// TANDEM_SECRET (the job's secret for torchrun-style and Slurm starts), TANDEM_JOB_ID (overrides the job id).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tandem/device.h"
#include "tandem/distributed/communicator.h"
#include "tandem/distributed/store.h"

namespace tandem::dist {

/// Where this process sits in the job.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string launcher = "none";  // "tandem", "mpi", "torchrun" or "none"
};

/// Reads the environment once (later calls return the same answer). Under mpiexec this initialises
/// MPI; under mpiexec and torchrun, rank 0 starts the rendezvous store here.
DistEnv detect_env();

/// Joins the job and returns the communicator for tensors on `device`: the single-process one when
/// the world size is 1, NCCL for CUDA devices (the GPU is cuda:local_rank, or cuda:0 when the process
/// sees one GPU), Gloo for the CPU. Every rank must call it, in the same order as its other
/// init_communicator calls. A rank that does not join within `timeout` is named in the error, as is
/// a rank whose world size differs. The timeout then bounds each collective (Communicator::set_timeout).
std::shared_ptr<Communicator> init_communicator(Device device,
                                                std::chrono::milliseconds timeout = std::chrono::seconds(300));

/// A communicator of one process: all_reduce leaves data as is, gathers copy, broadcast does nothing.
std::shared_ptr<Communicator> make_single_communicator(Device device = Device::cpu());

/// True once this process is connected to the job's rendezvous store (after init_communicator in a
/// multi-process job).
bool has_rendezvous_store();
/// The job's rendezvous store, for small out-of-band exchanges between ranks; throws when there is none.
Store& rendezvous_store();

/// Records that this rank reached training step `step`: one atomic store, cheap enough for every
/// step. A background thread publishes it to the job's store about twice a second, so that a rank
/// whose collective times out can name the rank that stopped and the step where it stopped.
void report_step(int64_t step);

/// For a program about to exit after an error: under mpiexec, MPI_Abort stops every rank of the job
/// (returning from main would leave this rank in MPI_Finalize, waiting for peers that may never come);
/// elsewhere it does nothing and returns.
void abort_job_after_error(int exit_code);

/// detect_env().rank
int dist_rank();
/// detect_env().world_size
int dist_world_size();
/// detect_env().local_rank
int dist_local_rank();

}  // namespace tandem::dist
