// The process-wide rendezvous state: detect_env starts the store where this process hosts it, and
// every later connection to it goes through here.
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "distributed/rendezvous/bootstrap_state.h"
#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/net.h"
#include "distributed/rendezvous/secret.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace detail {

BootstrapState& state() {
  // Never destroyed: communicators held in static objects may still use the store during exit.
  static BootstrapState* s = new BootstrapState;
  return *s;
}

std::string key_prefix() { return "tandem/r" + std::to_string(state().restart) + "/"; }

namespace {

void warn(const std::string& msg) {
  std::string line = "tandem: warning: " + msg + "\n";
  net::write_all(2, line.data(), line.size());
}

// Said once, by the process that hosts a store without a secret.
void warn_unauthenticated(const std::string& where) {
  warn("the rendezvous store at " + where + " is unauthenticated: any process that can reach it can read and "
       "change this job's keys. Give every process of the job one secret: TANDEM_SECRET_FILE=FILE (a file only "
       "you can read) or TANDEM_SECRET (docs/distributed.md, Security)");
}

// Called on rank 0 of an mpiexec launch, with state().mu held by detect_env.
std::string host_store_for_mpi(bool single_host, const StoreAuth& auth) {
  BootstrapState& s = state();
  std::string host;
  if (single_host) {
    host = "127.0.0.1";
  } else if (const char* ifn = std::getenv("TANDEM_SOCKET_IFNAME"); ifn && *ifn) {
    host = net::interface_address(ifn);
  } else {
    host = net::first_external_address();
    TANDEM_CHECK(!host.empty(), "MPI rank 0 found no network address to serve the rendezvous store on for ranks "
                 "on other hosts; set TANDEM_SOCKET_IFNAME to the interface they share");
  }
  s.server = std::make_unique<StoreServer>(StoreServerOptions{host, 0, auth, {}, {}});
  return net::HostPort{host, s.server->port()}.str();
}

}  // namespace

}  // namespace detail

DistEnv detect_env() {
  detail::BootstrapState& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.detected) return s.env;
  detail::EnvSpec spec = detail::read_env([](const char* n) { return std::getenv(n); });
  for (const auto& w : spec.warnings) detail::warn(w);
  s.timeout = spec.timeout;
  s.restart = spec.restart;
  if (spec.mpi) {
    detail::MpiJob job = detail::mpi_bootstrap(&detail::host_store_for_mpi);
    s.env = DistEnv{job.rank, job.size, job.local_rank, job.local_size, "mpi"};
    if (job.size > 1) {
      net::HostPort hp = net::parse_host_port(job.store_addr, "the store address broadcast by MPI rank 0");
      s.store_host = hp.host;
      s.store_port = hp.port;
      s.auth = job.auth;
    }
  } else {
    s.env = spec.env;
    s.store_host = spec.store_host;
    s.store_port = spec.store_port;
    s.auth = spec.auth;
    if (spec.host_store) {
      // A host name that resolves to a loopback address here (Debian's 127.0.1.1 for its own name) would
      // leave the ranks of other machines knocking at a door that only this machine can open.
      if (spec.bind_host != "127.0.0.1") {
        std::string resolved = net::resolve(spec.bind_host);
        TANDEM_CHECK(!net::is_loopback(resolved), "the rendezvous store's host ", spec.bind_host, " resolves to ",
                     resolved, " on this machine, a loopback address that ranks on other machines cannot reach: "
                     "give its IP address (MASTER_ADDR), or name the network interface in TANDEM_SOCKET_IFNAME");
      }
      try {
        s.server = std::make_unique<StoreServer>(StoreServerOptions{spec.bind_host, spec.store_port, spec.auth, {}, {}});
      } catch (const Error& e) {
        // The commonest cause: another job (or a job still shutting down) on the same port.
        TANDEM_CHECK(false, "rank 0 hosts the job's rendezvous store on port ", spec.store_port, " (",
                     spec.port_from.empty() ? "its store address" : spec.port_from, ") and cannot: ", e.what(),
                     ". If another job runs on this machine with the same port, give each job its own",
                     spec.env.launcher == "torchrun" ? " MASTER_PORT" : " port");
      }
      if (spec.auth.secret.empty()) detail::warn_unauthenticated(net::HostPort{spec.bind_host, spec.store_port}.str());
    }
  }
  s.detected = true;
  return s.env;
}

int dist_rank() { return detect_env().rank; }
int dist_world_size() { return detect_env().world_size; }
int dist_local_rank() { return detect_env().local_rank; }

bool has_rendezvous_store() {
  detail::BootstrapState& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.store != nullptr;
}

Store& rendezvous_store() {
  detect_env();
  detail::BootstrapState& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  return detail::connect_store_locked(s, s.timeout.value_or(std::chrono::seconds(300)));
}

void abort_job_after_error(int exit_code) {
  detail::BootstrapState& s = detail::state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.detected || s.env.launcher != "mpi" || s.env.world_size <= 1) return;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  detail::mpi_abort(exit_code);
}

namespace detail {
Store& connect_store_locked(BootstrapState& s, std::chrono::milliseconds timeout) {
  if (s.store) return *s.store;
  TANDEM_CHECK(s.store_port != 0, "there is no rendezvous store: this process is not part of a multi-process job "
               "(start it with `tandem launch`, mpiexec, torchrun or srun)");
  s.store = std::make_unique<Store>(s.store_host, s.store_port, timeout, s.auth);
  return *s.store;
}
}  // namespace detail

}  // namespace tandem::dist
