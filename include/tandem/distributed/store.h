#pragma once
// A small TCP key-value store through which the processes of a job find each other (rendezvous).
//
// Every connection first proves that it belongs to the job: it names the job (so that two jobs given
// one port cannot mix) and, when the job has a secret, both ends prove by HMAC-SHA256 challenge-
// response that they know it. A client that has not done so within a deadline is dropped, and what
// any client can make the server hold is bounded (StoreLimits).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tandem::dist {

/// Who may use a store: clients of this job id that know this secret (none: any client of the job).
struct StoreAuth {
  std::string job_id;
  std::string secret;  // raw bytes; at least 16 when set
};

/// Bounds on what clients can make a server hold. Reaching one is logged in one line (then at most
/// once per 10 s for the same limit).
struct StoreLimits {
  size_t max_connections = 4096;                  // past it a new client is turned away (or replaces the
                                                  // oldest that has not authenticated)
  size_t max_frame_bytes = size_t{16} << 20;      // largest request, so largest key plus value
  size_t max_connection_bytes = size_t{32} << 20; // received and unsent bytes of one connection: past it
                                                  // the server stops reading from that connection
  size_t max_stored_bytes = size_t{1} << 30;      // keys and values together: past it a set is refused
  std::chrono::milliseconds handshake_timeout{10000};  // to finish the handshake after connecting
};

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // the address to listen on; a name is resolved
  int port = 0;                    // 0: a free port
  StoreAuth auth;
  StoreLimits limits;
  /// Where limit and refusal messages go (one line each, no newline); default: stderr.
  std::function<void(const std::string&)> log;
};

/// Serves the store from a thread of this process until destroyed. Values live in memory only.
class StoreServer {
 public:
  /// Listens as the options say. Throws tandem::Error naming the address when it cannot listen there.
  explicit StoreServer(StoreServerOptions options);
  /// A server for any client on host:port (no job id, no secret), with the default limits.
  explicit StoreServer(int port = 0, const std::string& host = "127.0.0.1");
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
  /// Connects to host:port and authenticates, retrying until `timeout` passes (the server may still
  /// be starting). The timeout also bounds every later call. A server of another job, or one that
  /// does not share the secret, is an error at once (tandem::Error, kind Input).
  Store(const std::string& host, int port, std::chrono::milliseconds timeout = std::chrono::seconds(300),
        StoreAuth auth = {});
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
