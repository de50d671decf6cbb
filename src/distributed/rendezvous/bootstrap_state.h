#pragma once
// Internal: the process-wide rendezvous state shared by detect_env, init_communicator and
// rendezvous_store.
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/store.h"

namespace tandem::dist::detail {

struct BootstrapState {
  std::mutex mu;
  bool detected = false;
  DistEnv env;
  std::string store_host;
  int store_port = 0;                             // 0: no store (a single process)
  StoreAuth auth;                                 // how this process proves that it belongs to the job
  int restart = 0;                                // TANDEM_RESTART_COUNT
  std::unique_ptr<StoreServer> server;            // when this process hosts the store
  std::unique_ptr<Store> store;                   // connected on first need
  std::optional<std::chrono::milliseconds> timeout;  // TANDEM_TIMEOUT
  int groups = 0;                                 // communicators created so far (names their keys)
};

/// The one state of this process.
BootstrapState& state();
/// Connects to the store when not yet connected; the caller holds s.mu.
Store& connect_store_locked(BootstrapState& s, std::chrono::milliseconds timeout);

}  // namespace tandem::dist::detail
