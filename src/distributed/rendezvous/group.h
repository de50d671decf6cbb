#pragma once
// Internal: what the bootstrap hands to a communicator backend once every rank has joined, and the
// factories of the optional backends (each has a stub that throws when tandem was built without it).
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/communicator.h"
#include "tandem/distributed/store.h"

namespace tandem::dist::detail {

/// A joined group: every rank agreed on the size and is reachable through the store.
struct GroupSpec {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  Device device;
  Store* store = nullptr;        // outlives the communicator (the process-wide rendezvous store)
  std::string prefix;            // store keys of this communicator start with it
  bool single_host = true;       // every rank runs on this machine
  std::string address;           // this rank's address for peer connections when not single_host
  std::chrono::milliseconds timeout{300000};
};

/// CPU tensors over TCP. Built from distributed/comm/gloo, or distributed/comm/no_gloo which throws.
std::shared_ptr<Communicator> make_gloo_communicator(const GroupSpec& g);
/// CUDA tensors. Built from distributed/comm/nccl, or distributed/comm/no_nccl which throws.
std::shared_ptr<Communicator> make_nccl_communicator(const GroupSpec& g);

/// Ranks as an mpiexec launch assigns them.
struct MpiJob {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string store_addr;  // "host:port" published by rank 0
  StoreAuth auth;          // the job id and secret rank 0 made
};
/// Initialises MPI (thread level FUNNELED or more), reads ranks from MPI_COMM_WORLD and the local rank
/// from the shared-memory split; rank 0 makes the job's id and secret, calls host_store() (which starts
/// the store and returns its "host:port", given whether every rank is on one host) and broadcasts all
/// three. MPI is finalised when the process exits normally. Built from distributed/rendezvous/mpi, or
/// distributed/rendezvous/no_mpi which throws.
MpiJob mpi_bootstrap(std::string (*host_store)(bool single_host, const StoreAuth& auth));
/// Stops every rank of an mpiexec job (MPI_Abort) when this process initialised MPI; else returns.
void mpi_abort(int exit_code);
/// Whether this build has MPI: without it a Slurm step is not handed to MPI.
extern const bool kMpiBuilt;

/// What the environment says about the job, before any connection is made.
struct EnvSpec {
  DistEnv env;
  bool mpi = false;            // an mpiexec launch: ranks come from MPI
  std::string store_host;      // where the rendezvous store is (not yet known under MPI)
  int store_port = 0;
  std::string port_from;       // the variable that gave store_port ("MASTER_PORT=29500"), for messages
  bool host_store = false;     // this process must start the store (torchrun-style or Slurm rank 0)
  std::string bind_host;       // the address it listens on then
  StoreAuth auth;              // the job id, and the secret when one was given
  int restart = 0;             // how many times the job was restarted: keys of each attempt stay apart
  std::optional<std::chrono::milliseconds> timeout;  // TANDEM_TIMEOUT
  std::vector<std::string> warnings;  // said once on stderr by detect_env
};
/// Interprets the variables that `get` returns (getenv in production), reading a secret file when one
/// is named; throws tandem::Error (Input) naming the variable when one is malformed or missing.
EnvSpec read_env(const std::function<const char*(const char*)>& get);

/// The first host of a Slurm host list ("node[01-03,07],gpu5" -> "node01"); throws tandem::Error
/// (Input) naming `what` when the list is malformed.
std::string first_slurm_host(const std::string& list, const std::string& what);
/// The job's secret from TANDEM_SECRET or TANDEM_SECRET_FILE; empty when neither is set.
std::string secret_from_env(const std::function<const char*(const char*)>& get);

/// The key prefix of everything a job attempt keeps in its store ("tandem/r<restart>/").
std::string key_prefix();

}  // namespace tandem::dist::detail
