#pragma once
// Internal: what the launchers of one job share. On one machine that is only the job's store, which
// the launcher hosts; across machines node 0's launcher hosts it, and every launcher uses it to meet
// the others, to learn of a failure anywhere, and to start each attempt of the job together.
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/distributed/launch.h"
#include "tandem/distributed/store.h"

namespace tandem::dist::detail {

/// How long the launchers wait for each other: --timeout, else 300 s.
std::chrono::milliseconds rendezvous_timeout(const LaunchOptions& o);

/// After a rank of the job exits with a failure status, how long the launchers wait for word of a rank
/// killed by a signal before they blame the exit: a rank whose peer was killed fails moments later with
/// a connection error, and the kill, not that error, is the cause to report.
constexpr std::chrono::milliseconds kBlameGrace{2000};

/// A launcher that gets no reply from node 0's store within this long counts node 0 as gone.
constexpr std::chrono::milliseconds kStoreReplyTimeout{10000};

/// Every launcher says it is alive this often (a counter in the job's store, moved by a thread of its own).
constexpr std::chrono::milliseconds kHeartbeatEvery{250};
/// When a rank's failure is being blamed: a launcher whose heartbeat has not moved for this long died (and
/// its ranks with it, which is what the others failed of).
constexpr std::chrono::milliseconds kSilentWhileFailing{1500};
/// At any time: a launcher silent for this long is gone.
constexpr std::chrono::milliseconds kSilentLauncher{10000};

/// Thrown from a wait that Ctrl-C (or another signal) interrupted.
struct LaunchInterrupted {
  int signal = 0;
};

/// How an attempt of the job ended somewhere.
struct RoundFailure {
  int exit_code = 1;
  bool final = false;  // an interrupt or a lost launcher: no restart
  std::string what;    // "rank 3 on node 1 (host h1) exited with status 1"
  int node = -1;       // where it happened
  int rank = -1;       // the rank that failed; -1 for a launcher interrupted or lost
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
  /// Makes `f` the failure of `round` unless one was named already (the first wins): for failures that
  /// are a cause for certain, a rank killed by a signal or a launcher interrupted.
  void claim_failure(int round, const RoundFailure& f);
  /// Records a rank's failure status, which may be the consequence of a failure elsewhere: the first
  /// recorded becomes the failure of `round` when no claim comes within kBlameGrace (settle_failure).
  void note_exit(int round, const RoundFailure& f);
  /// Once the grace has passed: claims the first recorded exit (else `own`) unless a failure was named.
  void settle_failure(int round, const RoundFailure& own);
  /// The failure named for `round`, if any; never waits. A launcher that cannot reach the store any
  /// more reports node 0 as gone (a final failure).
  std::optional<RoundFailure> round_failure(int round);
  /// True once some rank of `round` failed anywhere, even if the failure is not named yet.
  bool round_failing(int round);
  /// Reads the other launchers' heartbeats (throttled: call it a few times a second).
  void watch_launchers();
  /// The failure of a node whose launcher's heartbeat has not moved for `quiet` (as far as watch_launchers
  /// saw) while its ranks of `round` had not all succeeded: that launcher died, or its machine did, and its
  /// ranks went with it.
  std::optional<RoundFailure> silent_launcher(int round, std::chrono::milliseconds quiet);
  /// Records that this machine's ranks of `round` all exited with 0.
  void mark_done(int round);
  /// True once every machine's ranks of `round` exited with 0.
  bool all_done(int round);
  /// Before the launcher exits: node 0 keeps the store up until the others have read the outcome.
  void leave();

 private:
  // Waits until the counter at key reaches the number of nodes; `what` names the wait in errors.
  void wait_count(const std::string& key, const std::string& what);
  // Remembers that node 0's store cannot be reached: the launchers' store is never reconnected to
  // (a new server there would be a new job), so every later call answers from this.
  void lose(const std::exception& e);
  RoundFailure lost_failure() const;
  std::string round_key(int round, const char* name) const;

  const LaunchOptions& o_;
  std::function<int()> interrupted_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Store> store_;  // several machines only
  std::string store_addr_;
  StoreAuth auth_;
  std::string node0_host_;  // as node 0's launcher named its machine
  std::vector<std::string> hosts_;  // every node's machine, as its launcher named it
  std::string lost_;        // why the store cannot be reached; empty while it can
  std::map<int, RoundFailure> named_;  // the failure of a round, once read (it never changes)
  // The heartbeat: this launcher's (a thread), and the others' as last seen.
  struct Beat {
    int64_t value = -1;
    std::chrono::steady_clock::time_point moved;
  };
  std::map<int, Beat> beats_;
  std::chrono::steady_clock::time_point next_watch_{};
  std::shared_ptr<std::atomic<bool>> stop_beating_;  // shared with the heartbeat's thread, which owns the rest
};

}  // namespace tandem::dist::detail
