#pragma once
// A small TCP key-value store through which the processes of a job find each other (rendezvous).
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tandem::dist {

/// Serves the store from a thread of this process until destroyed. Values live in memory only.
class StoreServer {
 public:
  /// Listens on host:port; port 0 picks a free port, host "" listens on every interface.
  /// Throws tandem::Error naming the address when it cannot listen there.
  explicit StoreServer(int port = 0, const std::string& host = "");
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// The port it listens on (the chosen one when constructed with 0).
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A connection to a StoreServer. Thread-safe: calls from several threads are served one at a time.
/// Values are arbitrary bytes held in std::string.
class Store {
 public:
  /// Connects to host:port, retrying until `timeout` passes (the server may still be starting).
  /// The timeout also bounds every later call.
  Store(const std::string& host, int port, std::chrono::milliseconds timeout = std::chrono::seconds(300));
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Stores value under key, replacing any earlier value and waking processes blocked in get(key).
  void set(const std::string& key, const std::string& value);
  /// The value of key, waiting until some process sets it; throws after the store's timeout.
  std::string get(const std::string& key);
  /// get with its own timeout; the timeout error starts with `missing` (e.g. "rank 1 did not join")
  /// so that it says what is probably wrong rather than only which key is absent.
  std::string get(const std::string& key, std::chrono::milliseconds timeout, const std::string& missing = "");
  /// The value of key, or nothing when it is absent (never waits).
  std::optional<std::string> try_get(const std::string& key);
  /// Atomically adds n to the decimal integer stored at key (absent counts as 0); returns the sum.
  int64_t add(const std::string& key, int64_t n);
  /// True when every key is present (never waits).
  bool check(const std::vector<std::string>& keys);
  /// Removes key; returns whether it was present.
  bool erase(const std::string& key);

  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;
  /// "host:port" of the server, as error messages name it.
  std::string address() const;
  /// Numeric address of this end of the connection: the local interface that reaches the server.
  std::string local_address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::dist
