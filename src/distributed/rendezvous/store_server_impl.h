#pragma once
// Internal: what the store server's two files share: a connection's state, the rate-limited log and
// the server's state (store_server.cpp runs the loop and the connections, store_server_requests.cpp
// answers the handshake and the requests).
#include <netdb.h>
#include <sys/socket.h>

#include <charconv>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tandem/distributed/store.h"

namespace tandem::dist {

namespace store_detail {

using Clock = std::chrono::steady_clock;

enum class Stage { Hello, Auth, Ready };

struct Conn {
  int fd = -1;
  std::string peer;  // "address:port" for log lines
  Stage stage = Stage::Hello;
  Clock::time_point deadline;  // of the handshake
  std::string client_nonce, server_nonce;
  std::string in;  // bytes received; parsing resumes at in_off
  size_t in_off = 0;
  std::string out;  // bytes to send, from out_off
  size_t out_off = 0;
  std::string parked_on;  // the key of a waiting get
  bool parked = false;
  bool queued = false;   // in the run queue
  bool closing = false;  // hang up once `out` is sent
  bool eof = false;      // the client closed its end
  bool dead = false;
  bool paused_logged = false;

  size_t pending() const { return (in.size() - in_off) + (out.size() - out_off); }
  size_t unsent() const { return out.size() - out_off; }
};

inline bool parse_i64(const std::string& s, int64_t& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

/// "address:port" of a peer.
std::string peer_of(const sockaddr_storage& ss);

inline std::string bytes_str(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

// Logs the first event of each kind at once, later ones at most every 10 s with a count of the rest:
// a flood of hostile clients must not become a flood of log lines.
class LimitLog {
 public:
  void note(const std::function<void(const std::string&)>& sink, const std::string& kind, const std::string& line) {
    auto now = Clock::now();
    auto [it, fresh] = entries_.try_emplace(kind);
    Entry& e = it->second;
    if (!fresh && now - e.last < std::chrono::seconds(10)) {
      ++e.suppressed;
      return;
    }
    std::string msg = line;
    if (e.suppressed > 0)
      msg += " (and " + std::to_string(e.suppressed) + " more like it since the last such line)";
    e.last = now;
    e.suppressed = 0;
    sink(msg);
  }

 private:
  struct Entry {
    Clock::time_point last;
    size_t suppressed = 0;
  };
  std::map<std::string, Entry> entries_;
};

}  // namespace store_detail

struct StoreServer::Impl {
  using Clock = store_detail::Clock;
  using Conn = store_detail::Conn;
  StoreServerOptions opt;
  int listen_fd = -1;
  int wake_r = -1, wake_w = -1;
  int port = 0;
  std::string where;  // "host:port" for messages
  std::thread thread;

  // Owned by the server thread once it runs.
  std::unordered_map<std::string, std::string> data;
  size_t stored_bytes = 0;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;  // key -> parked connection ids
  std::map<uint64_t, Conn> conns;  // by id: the oldest first
  std::deque<uint64_t> run_queue;
  uint64_t next_id = 1;
  std::optional<Clock::time_point> accept_paused_until;
  store_detail::LimitLog limit_log;
  std::vector<char> read_buf = std::vector<char>(65536);  // on the heap: the thread's stack may be small

  void log(const std::string& kind, const std::string& line) {
    limit_log.note(opt.log, kind, "tandem store " + where + ": " + line);
  }
  void run();
  void accept_all();
  void drop(std::map<uint64_t, Conn>::iterator it);
  void read_from(Conn& c);
  void schedule(uint64_t id, Conn& c);
  void drain_queue();
  void process(uint64_t id, Conn& c);
  void handshake(Conn& c, uint8_t op, const std::vector<std::string>& f);
  void handle(uint64_t id, Conn& c, uint8_t op, std::vector<std::string>& f);
  void reply(Conn& c, uint8_t status, const std::vector<std::string>& fields = {});
  void refuse(Conn& c, const std::string& why);
  void flush(Conn& c);
  void wake_waiters(const std::string& key);
  bool can_read(const Conn& c) const {
    return !c.dead && !c.closing && !c.eof && c.pending() < opt.limits.max_connection_bytes;
  }
};

}  // namespace tandem::dist
