// Recognising the launcher from the environment, and the process-wide rendezvous state.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "distributed/bootstrap_state.h"
#include "distributed/group.h"
#include "distributed/net.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace detail {

namespace {

int parse_int(const char* name, const char* value) {
  std::string_view v(value);
  int x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  TANDEM_CHECK(ec == std::errc() && p == v.data() + v.size(), name, "='", v, "' is not an integer");
  return x;
}

// Validates a complete rank description, naming the variables it came from.
void check_ranks(const DistEnv& e, const char* rank_var, const char* size_var, const char* lrank_var,
                 const char* lsize_var) {
  TANDEM_CHECK(e.world_size >= 1, size_var, "=", e.world_size, " must be at least 1");
  TANDEM_CHECK(e.rank >= 0 && e.rank < e.world_size, rank_var, "=", e.rank, " is out of range for ", size_var,
               "=", e.world_size, " (ranks are 0 .. ", e.world_size - 1, ")");
  TANDEM_CHECK(e.local_size >= 1 && e.local_size <= e.world_size, lsize_var, "=", e.local_size,
               " must be between 1 and ", size_var, "=", e.world_size);
  TANDEM_CHECK(e.local_rank >= 0 && e.local_rank < e.local_size, lrank_var, "=", e.local_rank,
               " is out of range for ", lsize_var, "=", e.local_size);
}

}  // namespace

EnvSpec read_env(const std::function<const char*(const char*)>& get) {
  EnvSpec s;
  if (const char* t = get("TANDEM_TIMEOUT"); t && *t) {
    char* end = nullptr;
    double sec = std::strtod(t, &end);
    TANDEM_CHECK(end && *end == '\0' && std::isfinite(sec) && sec > 0, "TANDEM_TIMEOUT='", t,
                 "' is not a positive number of seconds");
    s.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(sec * 1000.0)));
  }

  const char* t_rank = get("TANDEM_RANK");
  const char* t_size = get("TANDEM_WORLD_SIZE");
  const char* t_store = get("TANDEM_STORE_ADDR");
  if (t_rank || t_size || t_store) {
    TANDEM_CHECK(t_rank && t_size && t_store, "an incomplete tandem launch environment: TANDEM_RANK, ",
                 "TANDEM_WORLD_SIZE and TANDEM_STORE_ADDR must all be set (",
                 !t_rank ? "TANDEM_RANK" : !t_size ? "TANDEM_WORLD_SIZE" : "TANDEM_STORE_ADDR",
                 " is missing); start the job with `tandem launch`");
    DistEnv& e = s.env;
    e.launcher = "tandem";
    e.rank = parse_int("TANDEM_RANK", t_rank);
    e.world_size = parse_int("TANDEM_WORLD_SIZE", t_size);
    const char* lr = get("TANDEM_LOCAL_RANK");
    const char* ls = get("TANDEM_LOCAL_SIZE");
    e.local_rank = lr ? parse_int("TANDEM_LOCAL_RANK", lr) : e.rank;
    e.local_size = ls ? parse_int("TANDEM_LOCAL_SIZE", ls) : e.world_size;
    check_ranks(e, "TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_SIZE");
    net::HostPort hp = net::parse_host_port(t_store, "TANDEM_STORE_ADDR");
    s.store_host = hp.host;
    s.store_port = hp.port;
    return s;
  }

  if (get("OMPI_COMM_WORLD_SIZE") || get("PMI_SIZE") || get("PMIX_RANK")) {
    s.mpi = true;
    s.env.launcher = "mpi";
    return s;
  }

  const char* r = get("RANK");
  const char* w = get("WORLD_SIZE");
  if (r && w) {
    DistEnv& e = s.env;
    e.launcher = "torchrun";
    e.rank = parse_int("RANK", r);
    e.world_size = parse_int("WORLD_SIZE", w);
    const char* lr = get("LOCAL_RANK");
    const char* ls = get("LOCAL_WORLD_SIZE");
    e.local_rank = lr ? parse_int("LOCAL_RANK", lr) : e.rank;
    e.local_size = ls ? parse_int("LOCAL_WORLD_SIZE", ls) : e.world_size;
    check_ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    const char* addr = get("MASTER_ADDR");
    const char* port = get("MASTER_PORT");
    TANDEM_CHECK(addr && *addr && port && *port, "RANK and WORLD_SIZE are set (a torchrun-style launch) but ",
                 !(addr && *addr) ? "MASTER_ADDR" : "MASTER_PORT",
                 " is not: set MASTER_ADDR and MASTER_PORT to the host and a free port of rank 0");
    s.store_host = addr;
    if (const char* sp = get("TANDEM_STORE_PORT"); sp && *sp) {
      s.store_port = net::parse_port(sp, "TANDEM_STORE_PORT");
    } else {
      s.store_port = net::parse_port(port, "MASTER_PORT");
      // torchrun's agent already serves its own store on MASTER_PORT.
      const char* agent = get("TORCHELASTIC_USE_AGENT_STORE");
      if (agent && std::string_view(agent) == "True") {
        TANDEM_CHECK(s.store_port < 65535, "MASTER_PORT=65535 leaves no port for the rendezvous store; set TANDEM_STORE_PORT");
        s.store_port += 1;
      }
    }
    s.host_store = e.rank == 0 && e.world_size > 1;
    return s;
  }
  return s;  // a single process
}

BootstrapState& state() {
  // Never destroyed: communicators held in static objects may still use the store during exit.
  static BootstrapState* s = new BootstrapState;
  return *s;
}

namespace {
// Called on rank 0 of an mpiexec launch, with state().mu held by detect_env.
std::string host_store_for_mpi(bool single_host) {
  BootstrapState& s = state();
  s.server = std::make_unique<StoreServer>(0, single_host ? "127.0.0.1" : "");
  std::string host;
  if (single_host) {
    host = "127.0.0.1";
  } else if (const char* ifn = std::getenv("TANDEM_SOCKET_IFNAME"); ifn && *ifn) {
    host = net::interface_address(ifn);
  } else {
    host = net::first_external_address();
    if (host.empty()) host = net::host_name();
  }
  return net::HostPort{host, s.server->port()}.str();
}
}  // namespace

}  // namespace detail

DistEnv detect_env() {
  detail::BootstrapState& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.detected) return s.env;
  detail::EnvSpec spec = detail::read_env([](const char* n) { return std::getenv(n); });
  s.timeout = spec.timeout;
  if (spec.mpi) {
    detail::MpiJob job = detail::mpi_bootstrap(&detail::host_store_for_mpi);
    s.env = DistEnv{job.rank, job.size, job.local_rank, job.local_size, "mpi"};
    if (job.size > 1) {
      net::HostPort hp = net::parse_host_port(job.store_addr, "the store address broadcast by MPI rank 0");
      s.store_host = hp.host;
      s.store_port = hp.port;
    }
  } else {
    s.env = spec.env;
    s.store_host = spec.store_host;
    s.store_port = spec.store_port;
    if (spec.host_store) s.server = std::make_unique<StoreServer>(spec.store_port);
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

namespace detail {
Store& connect_store_locked(BootstrapState& s, std::chrono::milliseconds timeout) {
  if (s.store) return *s.store;
  TANDEM_CHECK(s.store_port != 0, "there is no rendezvous store: this process is not part of a multi-process job "
               "(start it with `tandem launch`, mpiexec or torchrun)");
  s.store = std::make_unique<Store>(s.store_host, s.store_port, timeout);
  return *s.store;
}
}  // namespace detail

}  // namespace tandem::dist
