// mpiexec launches: MPI tells each process its rank and which ranks share its host, and carries the
// rendezvous store's address from rank 0 to the others. Training traffic never goes through MPI.
#include <mpi.h>

#include <cstring>
#include <string>

#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/secret.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

namespace {

std::string mpi_error(int rc) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, static_cast<size_t>(len));
}

#define TANDEM_MPI_CHECK(call)                                                                   \
  do {                                                                                           \
    int rc_ = (call);                                                                            \
    TANDEM_RUNTIME_CHECK(rc_ == MPI_SUCCESS, #call, " failed: ", mpi_error(rc_));                \
  } while (0)

// Finalises MPI at normal process exit, when tandem initialised it.
struct MpiSession {
  bool owned = false;
  ~MpiSession() {
    int finalized = 0;
    if (owned && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
  }
};
MpiSession session;

}  // namespace

const bool kMpiBuilt = true;

void mpi_abort(int exit_code) {
  int initialized = 0, finalized = 0;
  if (!session.owned || MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized ||
      MPI_Finalized(&finalized) != MPI_SUCCESS || finalized)
    return;
  // A rank that returned from main would wait in MPI_Finalize for peers that may be stuck for good;
  // MPI_Abort has mpiexec stop every rank instead.
  MPI_Abort(MPI_COMM_WORLD, exit_code == 0 ? 1 : exit_code);
}

MpiJob mpi_bootstrap(std::string (*host_store)(bool single_host, const StoreAuth& auth)) {
  int initialized = 0;
  TANDEM_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    TANDEM_RUNTIME_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error(rc));
    session.owned = true;
    TANDEM_RUNTIME_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI_Init_thread: the MPI library offers thread level ",
                         provided, " but tandem needs MPI_THREAD_FUNNELED or more");
  } else {
    int provided = 0;
    TANDEM_MPI_CHECK(MPI_Query_thread(&provided));
    TANDEM_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI was initialised with thread level ", provided,
                 " but tandem needs MPI_THREAD_FUNNELED or more (use MPI_Init_thread)");
  }
  // Report failures as return codes rather than aborting the job, so that they become tandem errors.
  TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  MpiJob job;
  TANDEM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &job.rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &job.size));
  MPI_Comm local = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, job.rank, MPI_INFO_NULL, &local));
  TANDEM_MPI_CHECK(MPI_Comm_rank(local, &job.local_rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(local, &job.local_size));
  TANDEM_MPI_CHECK(MPI_Comm_free(&local));
  if (job.size == 1) return job;

  // Rank 0 makes the job's id and secret and hosts the store; MPI, which only the job's processes
  // share, carries all three as "address job-id secret-hex". A failure there must still reach the
  // others, or they would wait in the broadcast forever: the message travels in place of the address,
  // marked by a leading '!'.
  char buf[1024] = {};
  if (job.rank == 0) {
    std::string msg;
    try {
      StoreAuth auth{"mpi-" + secret::to_hex(secret::random_bytes(8)),
                     secret::available() ? secret::random_bytes(secret::kGeneratedBytes) : ""};
      std::string addr = host_store(job.local_size == job.size, auth);
      msg = addr + " " + auth.job_id + " " + secret::to_hex(auth.secret);
    } catch (const std::exception& e) {
      msg = std::string("!") + e.what();
    }
    std::strncpy(buf, msg.c_str(), sizeof buf - 1);
  }
  TANDEM_MPI_CHECK(MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD));
  std::string msg(buf);
  TANDEM_RUNTIME_CHECK(!msg.empty() && msg[0] != '!', "MPI rank 0 could not start the rendezvous store: ",
                       msg.empty() ? std::string("no address") : msg.substr(1));
  size_t a = msg.find(' '), b = msg.find(' ', a == std::string::npos ? a : a + 1);
  TANDEM_RUNTIME_CHECK(a != std::string::npos && b != std::string::npos, "malformed rendezvous details from MPI rank 0");
  job.store_addr = msg.substr(0, a);
  job.auth.job_id = msg.substr(a + 1, b - a - 1);
  job.auth.secret = secret::from_hex(msg.substr(b + 1));
  return job;
}

}  // namespace tandem::dist::detail
