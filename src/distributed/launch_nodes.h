#pragma once
// Internal: what the launchers of one job share. On one machine that is only the job's store, which
// the launcher hosts; across machines node 0's launcher hosts it, and every launcher uses it to meet
// the others, to learn of a failure anywhere, and to start each attempt of the job together.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tandem/distributed/launch.h"
#include "tandem/distributed/store.h"

namespace tandem::dist::detail {

/// How long the launchers wait for each other: --timeout, else 300 s.
std::chrono::milliseconds rendezvous_timeout(const LaunchOptions& o);

/// Thrown from a wait that Ctrl-C (or another signal) interrupted.
struct LaunchInterrupted {
  int signal = 0;
};

/// How an attempt of the job ended somewhere.
struct RoundFailure {
  int exit_code = 1;
  bool final = false;  // an interrupt or a lost launcher: no restart
  std::string what;    // "rank 3 (node 1, host h1) exited with status 1"
};

class NodeGroup {
 public:
  /// Hosts or joins the job's store and, across machines, waits until every launcher has joined,
  /// checking that they agree on the job's shape. `interrupted` is asked between waits: a signal number
  /// (Ctrl-C: SIGINT) ends the wait with LaunchInterrupted.
  NodeGroup(const LaunchOptions& o, int ranks_per_node, std::function<int()> interrupted);
  ~NodeGroup();
  NodeGroup(const NodeGroup&) = delete;
  NodeGroup& operator=(const NodeGroup&) = delete;

  bool multi() const { return store_ != nullptr; }
  /// "host:port" the ranks connect to, and how they authenticate.
  const std::string& store_addr() const { return store_addr_; }
  const StoreAuth& auth() const { return auth_; }

  /// Returns once every launcher has reached attempt `round` (its ranks of the last one all stopped).
  void start_round(int round);
  /// Tells the other launchers that attempt `round` failed here (the first failure reported wins).
  void fail_round(int round, const RoundFailure& f);
  /// The failure reported for `round` anywhere, if any; never waits. A launcher that cannot reach the
  /// store any more counts as a final failure.
  std::optional<RoundFailure> round_failure(int round);
  /// Records that this machine's ranks of `round` all exited with 0.
  void mark_done(int round);
  /// True once every machine's ranks of `round` exited with 0.
  bool all_done(int round);
  /// Before the launcher exits: node 0 keeps the store up until the others have read the outcome.
  void leave();

 private:
  // Waits until the counter at key reaches the number of nodes; `what` names the wait in errors.
  void wait_count(const std::string& key, const std::string& what);

  const LaunchOptions& o_;
  std::function<int()> interrupted_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Store> store_;  // several machines only
  std::string store_addr_;
  StoreAuth auth_;
};

}  // namespace tandem::dist::detail
