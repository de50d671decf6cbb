// init_communicator: every rank announces itself in the store, checks that the others agree on the
// job, then the backend connects the ranks.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "distributed/launch/progress.h"
#include "distributed/rank_list.h"
#include "distributed/rendezvous/bootstrap_state.h"
#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/net.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Identifies the network namespace: processes that share it reach each other over loopback.
std::string network_identity() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  char ns[256] = {};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  if (boot.empty() || n <= 0) return net::host_name();  // no /proc: the host name is the best guess
  return boot + "/" + std::string(ns, static_cast<size_t>(n));
}

std::map<std::string, std::string> parse_fields(const std::string& s) {
  std::map<std::string, std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

using detail::rank_list;

// Fails this rank and tells the others, which otherwise would wait for it until the timeout.
[[noreturn]] void abort_join(Store& store, const std::string& prefix, const std::string& msg) {
  try {
    store.set(prefix + "abort", msg);
  } catch (const std::exception&) {
    // the error below matters more than whether the others hear of it
  }
  TANDEM_CHECK(false, msg);
}

// Announces this rank and waits for every other one; returns whether all run in one network namespace.
bool join(Store& store, const std::string& prefix, const DistEnv& env, const std::string& backend,
          milliseconds timeout) {
  const std::string me = network_identity();
  int claims = static_cast<int>(store.add(prefix + "claim/" + std::to_string(env.rank), 1));
  if (claims > 1) {
    // Either the launch gave two processes one rank, or this process reached another job's store: two
    // torchrun-style jobs on one MASTER_PORT (the second job's rank 0 could not listen there).
    const std::string port = env.launcher == "torchrun" ? "MASTER_PORT"
                             : env.launcher == "slurm"  ? "MASTER_PORT (or TANDEM_STORE_PORT)"
                                                        : "store address";
    std::string first;
    if (auto v = store.try_get(prefix + "join/" + std::to_string(env.rank))) {
      auto f = parse_fields(*v);
      first = " (pid " + f["pid"] + " on " + f["host"] + ")";
    }
    const int64_t joined = store.add(prefix + "joined", 0);
    // A store where a whole job has joined already serves a running job: not ours to stop.
    TANDEM_CHECK(joined < env.world_size, "the rendezvous store at ", store.address(), " already serves a job whose ",
                 joined, " ranks have all joined, its rank ", env.rank, first, " among them: this process is one too "
                 "many. Most likely two jobs were started on one port (the address is in use): give each job its own ",
                 port, "; else the launch gave rank ", env.rank, " to two processes");
    abort_join(store, prefix,
               "two processes joined as rank " + std::to_string(env.rank) + first + " at the rendezvous store " +
                   store.address() + ": either the rank variables of the launch (e.g. TANDEM_RANK or RANK) give one "
                   "rank to two processes, or two jobs were started on one port (give each job its own " + port +
                   ")");
  }
  std::ostringstream info;
  info << "world_size=" << env.world_size << "\nbackend=" << backend << "\nhost=" << net::host_name()
       << "\nnetns=" << me << "\npid=" << getpid() << "\n";
  store.set(prefix + "join/" + std::to_string(env.rank), info.str());
  store.add(prefix + "joined", 1);

  std::vector<int> missing;
  for (int r = 0; r < env.world_size; ++r) missing.push_back(r);
  bool single_host = true;
  auto deadline = Clock::now() + timeout;
  int delay_ms = 1;
  int64_t seen = -1;
  for (;;) {
    // What stops another rank from joining is a mistake in how the job was started: an input error here too.
    if (auto a = store.try_get(prefix + "abort")) TANDEM_CHECK(false, "another rank failed to join: ", *a);
    // The announcements are read only when their count moved: a large job that waits for a late
    // rank then costs the store two requests per rank and poll, not one per pair of ranks.
    int64_t joined = store.add(prefix + "joined", 0);
    std::vector<int> still;
    if (joined == seen) still = missing;
    for (int r : joined == seen ? std::vector<int>{} : missing) {
      auto v = store.try_get(prefix + "join/" + std::to_string(r));
      if (!v) {
        still.push_back(r);
        continue;
      }
      auto f = parse_fields(*v);
      if (f["world_size"] != std::to_string(env.world_size))
        abort_join(store, prefix,
                   "world size mismatch: rank " + std::to_string(env.rank) + " was started with world size " +
                       std::to_string(env.world_size) + " but rank " + std::to_string(r) + " (pid " + f["pid"] +
                       " on " + f["host"] + ") with " + f["world_size"] +
                       "; every process of a job must be given the same number of ranks");
      if (f["backend"] != backend)
        abort_join(store, prefix,
                   "backend mismatch: rank " + std::to_string(env.rank) + " joined with " + backend + " but rank " +
                       std::to_string(r) + " with " + f["backend"] +
                       "; every rank must pass the same kind of device to init_communicator");
      if (f["netns"] != me) single_host = false;
    }
    seen = joined;
    missing = std::move(still);
    if (missing.empty()) return single_host;
    if (Clock::now() >= deadline) {
      std::string list = rank_list(missing);
      TANDEM_RUNTIME_CHECK(false, list, " did not join within ",
                           net::format_duration(timeout), " (", env.world_size - static_cast<int>(missing.size()),
                           " of ", env.world_size, " ranks joined the rendezvous store at ", store.address(),
                           "; did the missing ", missing.size() == 1 ? "rank" : "ranks",
                           " start, and with the same store address?)");
    }
    std::this_thread::sleep_for(milliseconds(delay_ms));
    delay_ms = std::min(delay_ms * 2, 50);
  }
}

// The address other hosts reach this rank at.
std::string peer_address(Store& store) {
  if (const char* ifn = std::getenv("TANDEM_SOCKET_IFNAME"); ifn && *ifn) return net::interface_address(ifn);
  std::string a = store.local_address();  // the interface that routes to the store's host
  if (a.empty() || net::is_loopback(a)) {
    std::string ext = net::first_external_address();
    if (!ext.empty()) return ext;
  }
  return a.empty() ? net::host_name() : a;
}

}  // namespace

std::shared_ptr<Communicator> init_communicator(Device device, milliseconds timeout) {
  DistEnv env = detect_env();
  detail::BootstrapState& s = detail::state();
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.timeout) timeout = *s.timeout;
  TANDEM_CHECK(timeout.count() > 0, "init_communicator: the timeout must be positive");
  if (env.world_size == 1) return make_single_communicator(device);

  detail::GroupSpec g;
  g.rank = env.rank;
  g.size = env.world_size;
  g.local_rank = env.local_rank;
  g.local_size = env.local_size;
  g.timeout = timeout;
  if (device.is_cuda()) {
    check_device(Device::cuda(0));
    int count = cuda_device_count();
    int gpu = count == 1 ? 0 : env.local_rank;
    TANDEM_CHECK(gpu < count, "local rank ", env.local_rank, " would use GPU cuda:", gpu, " but this process sees ",
                 count, " GPUs: start at most ", count, " ranks per node (tandem launch --gpus-per-node ", count,
                 ") or give each rank its own GPU with CUDA_VISIBLE_DEVICES");
    g.device = Device::cuda(gpu);
  } else {
    g.device = Device::cpu();
  }
  std::string backend = device.is_cuda() ? "nccl" : "gloo";
  Store& store = detail::connect_store_locked(s, timeout);
  g.store = &store;
  g.prefix = detail::key_prefix() + "group/" + std::to_string(s.groups++) + "/";
  const std::string host = s.store_host;
  const int port = s.store_port;
  const StoreAuth auth = s.auth;
  lock.unlock();  // joining may take long; the store itself is thread-safe

  g.single_host = join(store, g.prefix, env, backend, timeout);
  g.address = g.single_host ? "127.0.0.1" : peer_address(store);
  detail::start_progress_publisher(host, port, auth, detail::key_prefix(), env.rank, env.world_size);
  return device.is_cuda() ? detail::make_nccl_communicator(g) : detail::make_gloo_communicator(g);
}

}  // namespace tandem::dist
