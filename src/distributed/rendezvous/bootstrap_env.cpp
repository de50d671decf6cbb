// Recognising the launcher from the environment: tandem launch, mpiexec, torchrun and Slurm, the job's
// id and secret, and where the rendezvous store is (and listens, for the process that hosts it).
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/net.h"
#include "distributed/rendezvous/secret.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

namespace {

using Getter = std::function<const char*(const char*)>;

int parse_int(const char* name, const char* value) {
  std::string_view v(value);
  int x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  TANDEM_CHECK(ec == std::errc() && p == v.data() + v.size(), name, "='", v, "' is not an integer");
  return x;
}

bool set(const char* v) { return v && *v; }

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

// Where rank 0 listens: the loopback address when every rank is on its machine, else the interface
// the user named, else the address the others are told (MASTER_ADDR or the first Slurm host; a name
// is resolved when the store starts). Never every interface: the store has nothing for other networks.
void choose_bind(EnvSpec& s, const Getter& get, bool all_local) {
  if (all_local || net::is_loopback(s.store_host)) s.store_host = "127.0.0.1";  // for every rank alike
  if (!s.host_store) return;
  if (s.store_host == "127.0.0.1") {
    s.bind_host = "127.0.0.1";
  } else if (const char* ifn = get("TANDEM_SOCKET_IFNAME"); set(ifn)) {
    s.bind_host = net::interface_address(ifn);
  } else {
    s.bind_host = s.store_host;
  }
}

// The job's identity and secret, common to the torchrun and Slurm styles.
void user_auth(EnvSpec& s, const Getter& get, std::string job_id) {
  if (const char* j = get("TANDEM_JOB_ID"); set(j)) job_id = j;
  s.auth.job_id = std::move(job_id);
  s.auth.secret = secret_from_env(get);
}

// Tasks on this node from a Slurm per-node list such as "2(x3),1": the entry of node `node`.
int tasks_on_node(const std::string& list, int node, const char* var) {
  int index = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int count = 0, repeat = 1;
    size_t paren = item.find("(x");
    const char* count_end = item.data() + (paren == std::string::npos ? item.size() : paren);
    auto [p, ec] = std::from_chars(item.data(), count_end, count);
    bool ok = ec == std::errc() && p == count_end && count >= 1;
    if (ok && paren != std::string::npos) {
      auto [q, ec2] = std::from_chars(item.data() + paren + 2, item.data() + item.size(), repeat);
      ok = ec2 == std::errc() && repeat >= 1 && q == item.data() + item.size() - 1 && item.back() == ')';
    }
    TANDEM_CHECK(ok, var, "='", list, "' is not a Slurm task count list such as 2(x3),1");
    if (node < index + repeat) return count;
    index += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  TANDEM_CHECK(false, var, "='", list, "' lists ", index, " nodes but SLURM_NODEID is ", node);
}

// Slurm step ids at and above this are the batch script, the external step and the like: not an srun step.
constexpr uint64_t kFirstSpecialStep = 4294967290ull;

// A complete Slurm step description, or nothing (with the warning to give when it looks like one).
bool read_slurm(EnvSpec& s, const Getter& get) {
  const char* procid = get("SLURM_PROCID");
  const char* ntasks = get("SLURM_NTASKS");
  const char* localid = get("SLURM_LOCALID");
  const char* step = get("SLURM_STEP_ID");
  const char* job = get("SLURM_JOB_ID");
  if (!set(ntasks) || parse_int("SLURM_NTASKS", ntasks) <= 1) return false;  // one task: nothing to join
  uint64_t step_id = 0;
  bool srun_step = set(step) && std::from_chars(step, step + std::strlen(step), step_id).ec == std::errc() &&
                   step_id < kFirstSpecialStep;
  const char* nodelist = set(get("SLURM_STEP_NODELIST")) ? get("SLURM_STEP_NODELIST")
                         : set(get("SLURM_JOB_NODELIST")) ? get("SLURM_JOB_NODELIST")
                                                          : get("SLURM_NODELIST");
  const char* per_node = get("SLURM_NTASKS_PER_NODE");
  const char* tasks_list = set(get("SLURM_STEP_TASKS_PER_NODE")) ? get("SLURM_STEP_TASKS_PER_NODE")
                                                                 : get("SLURM_TASKS_PER_NODE");
  std::string missing;
  auto need = [&](bool ok, const char* what) {
    if (!ok) missing += missing.empty() ? what : std::string(", ") + what;
  };
  need(srun_step, "SLURM_STEP_ID (an srun step)");
  need(set(procid), "SLURM_PROCID");
  need(set(localid), "SLURM_LOCALID");
  need(set(job), "SLURM_JOB_ID");
  need(set(nodelist) || set(get("MASTER_ADDR")), "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST");
  need(set(per_node) || (set(tasks_list) && set(get("SLURM_NODEID"))),
       "SLURM_NTASKS_PER_NODE or SLURM_STEP_TASKS_PER_NODE with SLURM_NODEID");
  if (!missing.empty()) {
    s.warnings.push_back(std::string("SLURM_NTASKS=") + ntasks + " says this is one of several Slurm tasks, but " +
                         missing + (missing.find(',') == std::string::npos ? " is" : " are") +
                         " not set: running as a single process. Start every rank with srun (`srun tandem train "
                         "...` inside the allocation), or with tandem launch");
    return false;
  }
  DistEnv& e = s.env;
  e.launcher = "slurm";
  e.rank = parse_int("SLURM_PROCID", procid);
  e.world_size = parse_int("SLURM_NTASKS", ntasks);
  e.local_rank = parse_int("SLURM_LOCALID", localid);
  e.local_size = set(per_node) ? parse_int("SLURM_NTASKS_PER_NODE", per_node)
                               : tasks_on_node(tasks_list, parse_int("SLURM_NODEID", get("SLURM_NODEID")),
                                               set(get("SLURM_STEP_TASKS_PER_NODE")) ? "SLURM_STEP_TASKS_PER_NODE"
                                                                                    : "SLURM_TASKS_PER_NODE");
  check_ranks(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
  const char* master = get("MASTER_ADDR");
  s.store_host = set(master) ? std::string(master) : first_slurm_host(nodelist, "the Slurm node list");
  uint64_t job_id = 0;
  std::from_chars(job, job + std::strlen(job), job_id);
  if (const char* p = get("TANDEM_STORE_PORT"); set(p)) {
    s.store_port = net::parse_port(p, "TANDEM_STORE_PORT");
    s.port_from = std::string("TANDEM_STORE_PORT=") + p;
  } else if (const char* mp = get("MASTER_PORT"); set(mp)) {
    s.store_port = net::parse_port(mp, "MASTER_PORT");
    s.port_from = std::string("MASTER_PORT=") + mp;
  } else {  // every task of the step derives the same port, and other steps and jobs mostly others
    s.store_port = 20000 + static_cast<int>((job_id * 31 + step_id) % 20000);
    s.port_from = "the port derived from the Slurm job and step ids; set MASTER_PORT to choose one";
  }
  user_auth(s, get, std::string(job) + "." + step);
  s.host_store = e.rank == 0;
  choose_bind(s, get, e.local_size == e.world_size);
  return true;
}

}  // namespace

std::string first_slurm_host(const std::string& list, const std::string& what) {
  std::string host;
  size_t i = 0;
  for (; i < list.size() && list[i] != ','; ++i) {
    if (list[i] == ']') break;
    if (list[i] != '[') {
      host.push_back(list[i]);
      continue;
    }
    size_t close = list.find(']', i);
    TANDEM_CHECK(close != std::string::npos, what, " '", list, "' has a '[' without its ']'");
    std::string range = list.substr(i + 1, close - i - 1);
    std::string first = range.substr(0, range.find_first_of(",-"));
    TANDEM_CHECK(!first.empty() && first.find_first_not_of("0123456789") == std::string::npos &&
                     range.find_first_not_of("0123456789,-") == std::string::npos,
                 what, " '", list, "' has a malformed range [", range, "]");
    host += first;  // zero padding kept: node[01-03] starts with node01
    i = close;
  }
  TANDEM_CHECK(!host.empty() && (i == list.size() || list[i] == ','), what, " '", list,
               "' is not a Slurm host list such as node[01-04,07]");
  return host;
}

std::string secret_from_env(const Getter& get) {
  const char* value = get("TANDEM_SECRET");
  const char* file = get("TANDEM_SECRET_FILE");
  TANDEM_CHECK(!(set(value) && set(file)), "both TANDEM_SECRET and TANDEM_SECRET_FILE are set: keep one");
  if (set(file)) return secret::read_file(file);
  if (set(value)) {
    TANDEM_CHECK(std::strlen(value) >= secret::kMinBytes, "TANDEM_SECRET holds ", std::strlen(value),
                 " characters; a secret needs at least ", secret::kMinBytes,
                 " (make one with: openssl rand -hex 32)");
    return value;
  }
  return "";
}

EnvSpec read_env(const Getter& get) {
  EnvSpec s;
  if (const char* t = get("TANDEM_TIMEOUT"); set(t)) {
    char* end = nullptr;
    double sec = std::strtod(t, &end);
    TANDEM_CHECK(end && *end == '\0' && std::isfinite(sec) && sec > 0, "TANDEM_TIMEOUT='", t,
                 "' is not a positive number of seconds");
    s.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(sec * 1000.0)));
  }
  if (const char* r = get("TANDEM_RESTART_COUNT"); set(r)) s.restart = parse_int("TANDEM_RESTART_COUNT", r);
  else if (const char* tr = get("TORCHELASTIC_RESTART_COUNT"); set(tr))
    s.restart = parse_int("TORCHELASTIC_RESTART_COUNT", tr);
  TANDEM_CHECK(s.restart >= 0, "TANDEM_RESTART_COUNT must not be negative");

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
    const char* job = get("TANDEM_JOB_ID");
    s.auth.job_id = job ? job : "";
    s.auth.secret = secret_from_env(get);
    return s;
  }

  const bool mpi_vars = get("OMPI_COMM_WORLD_SIZE") || get("PMI_SIZE") || get("PMIX_RANK");
  // An srun step of a build without MPI may still carry PMI variables: Slurm's own are used then.
  if (mpi_vars && (kMpiBuilt || !get("SLURM_STEP_ID"))) {
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
    TANDEM_CHECK(set(addr) && set(port), "RANK and WORLD_SIZE are set (a torchrun-style launch) but ",
                 !set(addr) ? "MASTER_ADDR" : "MASTER_PORT",
                 " is not: set MASTER_ADDR and MASTER_PORT to the host and a free port of rank 0");
    s.store_host = addr;
    if (const char* sp = get("TANDEM_STORE_PORT"); set(sp)) {
      s.store_port = net::parse_port(sp, "TANDEM_STORE_PORT");
      s.port_from = std::string("TANDEM_STORE_PORT=") + sp;
    } else {
      s.store_port = net::parse_port(port, "MASTER_PORT");
      s.port_from = std::string("MASTER_PORT=") + port;
      // torchrun's agent already serves its own store on MASTER_PORT.
      const char* agent = get("TORCHELASTIC_USE_AGENT_STORE");
      if (agent && std::string_view(agent) == "True") {
        TANDEM_CHECK(s.store_port < 65535, "MASTER_PORT=65535 leaves no port for the rendezvous store; set TANDEM_STORE_PORT");
        s.store_port += 1;
        s.port_from += " + 1 (torchrun's agent holds MASTER_PORT itself; TANDEM_STORE_PORT picks another)";
      }
    }
    const char* run_id = get("TORCHELASTIC_RUN_ID");
    user_auth(s, get, run_id ? run_id : "");
    s.host_store = e.rank == 0 && e.world_size > 1;
    // Only a LOCAL_WORLD_SIZE that was given can say that every rank is here.
    choose_bind(s, get, ls && e.local_size == e.world_size);
    return s;
  }

  if (read_slurm(s, get)) return s;

  // Parts of a torchrun-style environment without the rest: say so rather than run a job of one
  // that the user believes to be one rank of many.
  std::string partial;
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (set(get(v))) partial += partial.empty() ? v : std::string(", ") + v;
  bool lone_world = set(w) && !r && parse_int("WORLD_SIZE", w) <= 1;
  if (!partial.empty() && !lone_world)
    s.warnings.push_back(partial + (partial.find(',') == std::string::npos ? " is" : " are") +
                         " set but not both RANK and WORLD_SIZE: running as a single process. A torchrun-style "
                         "start needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in every rank");
  return s;  // a single process
}

}  // namespace tandem::dist::detail
