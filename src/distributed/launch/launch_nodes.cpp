#include "distributed/launch/launch_nodes.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/net.h"
#include "distributed/rendezvous/secret.h"
#include "tandem/error.h"

namespace tandem::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string encode(const RoundFailure& f) {
  return std::to_string(f.exit_code) + " " + (f.final ? "1" : "0") + " " + std::to_string(f.node) + " " +
         std::to_string(f.rank) + " " + f.what;
}

std::optional<RoundFailure> decode(const std::string& v) {
  RoundFailure f;
  const char* p = v.data();
  const char* end = v.data() + v.size();
  int final = 0;
  for (int* field : {&f.exit_code, &final, &f.node, &f.rank}) {
    auto [q, ec] = std::from_chars(p, end, *field);
    if (ec != std::errc() || q == end || *q != ' ') return std::nullopt;
    p = q + 1;
  }
  f.final = final == 1;
  f.what.assign(p, end);
  return f;
}

void warn_unauthenticated(const std::string& where, const std::string& fix) {
  std::string line = "tandem launch: warning: the job's rendezvous store at " + where +
                     " is unauthenticated: any process that can reach it can read and change the job's keys. " + fix +
                     " (docs/distributed.md, Security)\n";
  net::write_all(2, line.data(), line.size());
}

// "nnodes=2 nproc=4 host=h": what each launcher says about itself, compared across machines.
std::string describe(const LaunchOptions& o, int ranks_per_node) {
  return std::to_string(o.nnodes) + " " + std::to_string(ranks_per_node) + " " + net::host_name();
}

}  // namespace

std::chrono::milliseconds rendezvous_timeout(const LaunchOptions& o) {
  return o.timeout_s > 0 ? std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)) : 300s;
}

NodeGroup::NodeGroup(const LaunchOptions& o, int ranks_per_node, std::function<int()> interrupted)
    : o_(o), interrupted_(std::move(interrupted)) {
  if (o.nnodes == 1) {
    // One machine: only this machine's ranks connect, and they learn the secret from this process.
    auth_.job_id = "launch-" + secret::to_hex(secret::random_bytes(8));
    if (secret::available()) auth_.secret = secret::to_hex(secret::random_bytes(secret::kGeneratedBytes));
    server_ = std::make_unique<StoreServer>(StoreServerOptions{"127.0.0.1", 0, auth_, {}, {}});
    store_addr_ = "127.0.0.1:" + std::to_string(server_->port());
    if (auth_.secret.empty())
      warn_unauthenticated(store_addr_, "tandem was built without OpenSSL, which it needs to authenticate: install "
                                        "libssl-dev and rebuild");
    return;
  }
  auto get = [](const char* n) { return std::getenv(n); };
  auth_.job_id = o.job_id;
  auth_.secret = secret_from_env(get);
  store_addr_ = net::HostPort{o.master_addr, o.master_port}.str();
  if (o.node_rank == 0) {
    const char* ifn = std::getenv("TANDEM_SOCKET_IFNAME");
    std::string bind = ifn && *ifn ? net::interface_address(ifn) : net::resolve(o.master_addr);
    // A name that resolves to loopback here (Debian's 127.0.1.1 for the machine's own name) would
    // leave the other machines knocking at a door only this one can open; 127.0.0.1 itself is a
    // deliberate choice (every "machine" on this one).
    TANDEM_CHECK(net::is_loopback(o.master_addr) || !net::is_loopback(bind), "--master-addr ", o.master_addr,
                 " resolves to ", bind, " on this machine, a loopback address that the other machines cannot "
                 "reach: give its IP address, or name the network interface in TANDEM_SOCKET_IFNAME");
    try {
      server_ = std::make_unique<StoreServer>(StoreServerOptions{bind, o.master_port, auth_, {}, {}});
    } catch (const Error& e) {
      TANDEM_CHECK(false, "node 0 hosts the job's store at --master-addr ", o.master_addr, " --master-port ",
                   o.master_port, ", which must be an address of this machine and a free port: ", e.what());
    }
    if (auth_.secret.empty())
      warn_unauthenticated(net::HostPort{bind, o.master_port}.str(), "Give every node one secret: TANDEM_SECRET_FILE="
                                                                     "FILE (a file only you can read) or TANDEM_SECRET");
  }
  store_ = std::make_unique<Store>(o.master_addr, o.master_port, rendezvous_timeout(o), auth_);
  // Node 0 answers at once while it lives: a reply that takes longer means it is gone, which every
  // launcher must notice long before --timeout.
  store_->set_timeout(std::min(rendezvous_timeout(o), std::chrono::milliseconds(kStoreReplyTimeout)));

  const std::string me = std::to_string(o.node_rank);
  TANDEM_CHECK(store_->add("launch/claim/" + me, 1) == 1, "two launchers joined as --node-rank ", o.node_rank,
               ": give each machine its own node rank, 0 .. ", o.nnodes - 1);
  const std::string mine = describe(o, ranks_per_node);
  store_->set("launch/node/" + me, mine);
  store_->add("launch/nodes", 1);
  wait_count("launch/nodes", "not every node's launcher joined the job's store at " + store_addr_);
  std::string mismatch;
  hosts_.assign(static_cast<size_t>(o.nnodes), std::string());
  for (int r = 0; r < o.nnodes && mismatch.empty(); ++r) {
    std::string theirs = store_->get("launch/node/" + std::to_string(r));
    hosts_[static_cast<size_t>(r)] = theirs.substr(theirs.rfind(' ') + 1);
    if (r == 0) node0_host_ = theirs.substr(theirs.rfind(' ') + 1);
    std::string shape = theirs.substr(0, theirs.rfind(' '));
    if (shape != mine.substr(0, mine.rfind(' ')))
      mismatch = "node " + std::to_string(r) + " (" + theirs.substr(theirs.rfind(' ') + 1) +
                 ") was started with --nnodes/--nproc-per-node " + shape + " but node " + std::to_string(o.node_rank) +
                 " with " + mine.substr(0, mine.rfind(' ')) + ": start every node's launcher with the same values";
  }
  // Node 0 keeps the store up until every launcher has compared (each then stops with the same verdict).
  store_->add("launch/compared", 1);
  if (server_) {
    auto until = Clock::now() + 5s;
    while (store_->add("launch/compared", 0) < o.nnodes && Clock::now() < until) std::this_thread::sleep_for(20ms);
  }
  TANDEM_CHECK(mismatch.empty(), mismatch);

  // The heartbeat, on a connection and a thread of its own: a launcher busy relaying output (or blocked
  // writing to a paused terminal) is not taken for dead. The thread owns what it uses, so that the launcher
  // never waits for it (a connection to a store that is gone takes seconds to give up); it ends with the
  // process, or soon after the group.
  stop_beating_ = std::make_shared<std::atomic<bool>>(false);
  std::thread([stop = stop_beating_, addr = o.master_addr, port = o.master_port, auth = auth_,
               key = "launch/beat/" + me] {
    std::unique_ptr<Store> beat;
    while (!stop->load()) {
      try {
        if (!beat) beat = std::make_unique<Store>(addr, port, std::chrono::milliseconds(2000), auth);
        beat->add(key, 1);
      } catch (const std::exception&) {
        beat.reset();  // node 0's store is gone: the supervision says so
      }
      std::this_thread::sleep_for(kHeartbeatEvery);
    }
  }).detach();
}

NodeGroup::~NodeGroup() {
  if (stop_beating_) stop_beating_->store(true);
}

void NodeGroup::watch_launchers() {
  if (!store_ || !lost_.empty()) return;
  const auto now = Clock::now();
  if (now < next_watch_) return;
  next_watch_ = now + kHeartbeatEvery;
  try {
    for (int r = 0; r < o_.nnodes; ++r) {
      if (r == o_.node_rank) continue;
      const int64_t v = store_->add("launch/beat/" + std::to_string(r), 0);
      Beat& b = beats_[r];
      if (v != b.value) b = {v, now};
    }
  } catch (const std::exception& e) {
    lose(e);
  }
}

std::optional<RoundFailure> NodeGroup::silent_launcher(int round, std::chrono::milliseconds quiet) {
  const auto now = Clock::now();
  for (const auto& [r, b] : beats_) {
    if (r == 0 || now - b.moved < quiet) continue;  // node 0 gone is the store gone: lost_failure says so
    // A launcher whose ranks all succeeded may leave before the others end (after --timeout of waiting).
    try {
      if (store_->try_get(round_key(round, "done/") + std::to_string(r))) continue;
    } catch (const std::exception& e) {
      lose(e);
      return std::nullopt;
    }
    const auto secs = std::chrono::duration_cast<std::chrono::milliseconds>(now - b.moved);
    const std::string host = hosts_[static_cast<size_t>(r)].empty() ? "" : " (host " + hosts_[static_cast<size_t>(r)] + ")";
    return RoundFailure{1, true,
                        "the launcher of node " + std::to_string(r) + host + " is gone: it has given no sign of life for " +
                            net::format_duration(secs) + ", and its ranks went with it",
                        r, -1};
  }
  return std::nullopt;
}

void NodeGroup::wait_count(const std::string& key, const std::string& what) {
  auto timeout = rendezvous_timeout(o_);
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int64_t n = 0;
    try {
      n = store_->add(key, 0);
    } catch (const std::exception& e) {
      lose(e);
      TANDEM_RUNTIME_CHECK(false, lost_failure().what);
    }
    if (n >= o_.nnodes) return;
    if (int sig = interrupted_()) throw LaunchInterrupted{sig};
    TANDEM_RUNTIME_CHECK(Clock::now() < deadline, what, " within ", net::format_duration(timeout), " (", n, " of ",
                         o_.nnodes, " did; is `tandem launch --nnodes ", o_.nnodes, "` running on every machine, with "
                         "the same --master-addr and --master-port?)");
    std::this_thread::sleep_for(50ms);
  }
}

void NodeGroup::lose(const std::exception& e) {
  if (lost_.empty()) lost_ = e.what();
}

RoundFailure NodeGroup::lost_failure() const {
  std::string host = node0_host_.empty() ? std::string() : " (host " + node0_host_ + ")";
  return {1, true, "the launcher of node 0" + host + " is gone, and with it the job's store: " + lost_, 0, -1};
}

std::string NodeGroup::round_key(int round, const char* name) const {
  return "launch/r" + std::to_string(round) + "/" + name;
}

void NodeGroup::start_round(int round) {
  if (!store_) return;
  beats_.clear();  // the launchers were waiting for each other: their silence so far says nothing
  std::string key = round_key(round, "start");
  try {
    store_->add(key, 1);
  } catch (const std::exception& e) {
    lose(e);
    TANDEM_RUNTIME_CHECK(false, lost_failure().what);
  }
  wait_count(key, "not every node was ready for attempt " + std::to_string(round + 1) + " of the job");
}

void NodeGroup::claim_failure(int round, const RoundFailure& f) {
  if (!store_ || !lost_.empty()) return;
  try {
    // The counter decides who is first; the failure itself follows at once (a reader may see the count
    // a moment before the value).
    if (store_->add(round_key(round, "claims"), 1) == 1) store_->set(round_key(round, "failure"), encode(f));
  } catch (const std::exception& e) {
    lose(e);
  }
}

void NodeGroup::note_exit(int round, const RoundFailure& f) {
  if (!store_ || !lost_.empty()) return;
  try {
    if (store_->add(round_key(round, "exits"), 1) == 1) store_->set(round_key(round, "first_exit"), encode(f));
  } catch (const std::exception& e) {
    lose(e);
  }
}

void NodeGroup::settle_failure(int round, const RoundFailure& own) {
  if (!store_ || !lost_.empty()) return;
  try {
    if (store_->add(round_key(round, "claims"), 0) > 0) return;
    std::optional<RoundFailure> first;
    if (auto v = store_->try_get(round_key(round, "first_exit"))) first = decode(*v);
    // Every launcher settles on the same first exit, so which of them claims it does not matter.
    claim_failure(round, first ? *first : own);
  } catch (const std::exception& e) {
    lose(e);
  }
}

std::optional<RoundFailure> NodeGroup::round_failure(int round) {
  if (!store_) return std::nullopt;
  if (auto it = named_.find(round); it != named_.end()) return it->second;
  if (!lost_.empty()) return lost_failure();
  try {
    auto v = store_->try_get(round_key(round, "failure"));
    std::optional<RoundFailure> f = v ? decode(*v) : std::nullopt;
    if (f) named_[round] = *f;
    return f;
  } catch (const std::exception& e) {
    lose(e);
    return lost_failure();
  }
}

bool NodeGroup::round_failing(int round) {
  if (!store_) return false;
  if (!lost_.empty() || named_.count(round)) return true;
  try {
    return store_->add(round_key(round, "exits"), 0) > 0 || store_->add(round_key(round, "claims"), 0) > 0;
  } catch (const std::exception& e) {
    lose(e);
    return true;
  }
}

void NodeGroup::mark_done(int round) {
  if (!store_ || !lost_.empty()) return;
  try {
    store_->set(round_key(round, "done/") + std::to_string(o_.node_rank), "1");
    store_->add(round_key(round, "done"), 1);
  } catch (const std::exception& e) {
    lose(e);
  }
}

bool NodeGroup::all_done(int round) {
  if (!store_) return true;
  if (!lost_.empty()) return false;  // round_failure says why
  try {
    return store_->add(round_key(round, "done"), 0) >= o_.nnodes;
  } catch (const std::exception& e) {
    lose(e);
    return false;
  }
}

void NodeGroup::leave() {
  if (!store_ || !lost_.empty()) return;
  try {
    store_->add("launch/left", 1);
    if (!server_) return;
    auto deadline = Clock::now() + 5s;
    while (store_->add("launch/left", 0) < o_.nnodes && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  } catch (const std::exception&) {
  }
}

}  // namespace tandem::dist::detail
