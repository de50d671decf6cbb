// The store's server: one thread multiplexing every client with poll(). Requests of one connection
// are answered in order; a get of an absent key parks its connection until some client sets the key.
//
// Connections that have work to do wait in a queue, and the loop drains that queue: waking a parked
// get never runs the woken connection's next request from inside another one's, so no chain of
// clients can make the server recurse. Everything a client can make the server hold is bounded
// (StoreLimits), and a client must finish the handshake (store_protocol.h) before anything else.
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <deque>
#include <map>
#include <thread>
#include <unordered_map>

#include "distributed/rendezvous/net.h"
#include "distributed/rendezvous/secret.h"
#include "distributed/rendezvous/store_protocol.h"
#include "distributed/rendezvous/store_server_impl.h"
#include "tandem/distributed/store.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace store_detail {

std::string peer_of(const sockaddr_storage& ss) {
  char host[NI_MAXHOST] = {}, serv[NI_MAXSERV] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), sizeof ss, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return net::HostPort{host, std::atoi(serv)}.str();
}

}  // namespace store_detail

using namespace store_detail;
using std::chrono::milliseconds;

StoreServer::StoreServer(int port, const std::string& host)
    : StoreServer(StoreServerOptions{host, port, {}, {}, {}}) {}

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.opt = std::move(options);
  const StoreLimits& lim = s.opt.limits;
  TANDEM_CHECK(lim.max_connections >= 1 && lim.max_frame_bytes >= proto::kMaxHandshakeFrame &&
                   lim.max_connection_bytes >= lim.max_frame_bytes && lim.handshake_timeout.count() > 0,
               "rendezvous store: inconsistent limits (a connection must hold at least one largest frame, and "
               "every limit must be positive)");
  TANDEM_CHECK(s.opt.auth.secret.empty() || s.opt.auth.secret.size() >= secret::kMinBytes,
               "rendezvous store: a secret needs at least ", secret::kMinBytes, " bytes");
  if (!s.opt.auth.secret.empty()) secret::hmac_sha256(s.opt.auth.secret, "");  // fails early without OpenSSL
  if (!s.opt.log) s.opt.log = [](const std::string& line) {
    std::string l = line + "\n";
    net::write_all(2, l.data(), l.size());
  };
  const std::string& host = s.opt.host;
  std::string shown = net::HostPort{host.empty() ? "0.0.0.0" : host, s.opt.port}.str();
  addrinfo hints{};
  hints.ai_family = host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(s.opt.port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  TANDEM_CHECK(rc == 0, "rendezvous store: cannot resolve the address ", shown, ": ", gai_strerror(rc));
  int err = 0;
  for (addrinfo* a = res; a && s.listen_fd < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      err = errno;
      close(fd);
      continue;
    }
    s.listen_fd = fd;
  }
  freeaddrinfo(res);
  TANDEM_RUNTIME_CHECK(s.listen_fd >= 0, "rendezvous store: cannot listen on ", shown, ": ", net::errno_str(err),
                       err == EADDRINUSE     ? " (another process holds the port; pick a free one)"
                       : err == EADDRNOTAVAIL ? " (that is not an address of this machine)"
                                              : "");
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  s.port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  s.where = net::HostPort{host.empty() ? "0.0.0.0" : host, s.port}.str();
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    int e = errno;
    close(s.listen_fd);
    TANDEM_RUNTIME_CHECK(false, "rendezvous store: pipe2 failed: ", net::errno_str(e));
  }
  s.wake_r = p[0];
  s.wake_w = p[1];
  s.thread = std::thread([&s] { s.run(); });
}

StoreServer::~StoreServer() {
  Impl& s = *impl_;
  char b = 1;
  while (write(s.wake_w, &b, 1) < 0 && errno == EINTR) {
  }
  if (s.thread.joinable()) s.thread.join();
  for (auto& [id, c] : s.conns) close(c.fd);
  close(s.listen_fd);
  close(s.wake_r);
  close(s.wake_w);
}

int StoreServer::port() const { return impl_->port; }

void StoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    auto now = Clock::now();
    std::optional<Clock::time_point> next_deadline;
    auto consider = [&](Clock::time_point t) {
      if (!next_deadline || t < *next_deadline) next_deadline = t;
    };
    for (auto it = conns.begin(); it != conns.end();) {
      Conn& c = it->second;
      if (!c.dead && c.stage != Stage::Ready) {
        if (now >= c.deadline) {
          log("handshake", "dropped the connection from " + c.peer + ": no handshake within " +
                               net::format_duration(opt.limits.handshake_timeout));
          c.dead = true;
        } else {
          consider(c.deadline);
        }
      }
      if (c.dead)
        drop(it++);
      else
        ++it;
    }
    if (accept_paused_until && now >= *accept_paused_until) accept_paused_until.reset();
    if (accept_paused_until) consider(*accept_paused_until);

    fds.clear();
    ids.clear();
    fds.push_back({wake_r, POLLIN, 0});
    fds.push_back({listen_fd, static_cast<short>(accept_paused_until ? 0 : POLLIN), 0});
    for (auto& [id, c] : conns) {
      short ev = 0;
      if (can_read(c)) {
        ev |= POLLIN;
      } else if (!c.paused_logged && c.pending() >= opt.limits.max_connection_bytes) {
        c.paused_logged = true;
        log("connection-bytes", "stopped reading from " + c.peer + " until it takes its replies: it has " +
                                    bytes_str(c.pending()) + " pending (the limit is " +
                                    bytes_str(opt.limits.max_connection_bytes) + ")");
      }
      if (c.unsent() > 0) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      ids.push_back(id);
    }
    int timeout_ms = -1;
    if (next_deadline) {
      auto ms = std::chrono::duration_cast<milliseconds>(*next_deadline - now).count() + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
    }
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      log("poll", "stopped: poll failed: " + net::errno_str(errno));
      return;  // clients will see their connections fail
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      short rev = fds[i].revents;
      if (!rev) continue;
      auto it = conns.find(ids[i - 2]);
      if (it == conns.end()) continue;
      Conn& c = it->second;
      if (rev & POLLIN) read_from(c);
      if (!c.dead && (rev & POLLOUT)) flush(c);
      // A hang-up we cannot read past (reading paused, or nothing left to read) ends the connection.
      if (!c.dead && (rev & (POLLHUP | POLLERR)) && !(rev & POLLIN)) c.dead = true;
      if (!c.dead) schedule(it->first, c);
    }
    drain_queue();
  }
}

void StoreServer::Impl::drop(std::map<uint64_t, Conn>::iterator it) {
  Conn& c = it->second;
  if (c.parked) {
    auto w = waiters.find(c.parked_on);
    if (w != waiters.end()) {
      std::erase(w->second, it->first);
      if (w->second.empty()) waiters.erase(w);
    }
  }
  close(c.fd);
  conns.erase(it);
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int e = errno;
      if (e == EINTR || e == ECONNABORTED) continue;
      if (e == EAGAIN || e == EWOULDBLOCK) return;
      // Out of descriptors (or memory): the pending connection stays in the backlog and the listening
      // socket stays readable, so accepting pauses instead of spinning on it.
      accept_paused_until = Clock::now() + milliseconds(250);
      std::string why = net::errno_str(e);
      if (e == EMFILE || e == ENFILE) {
        rlimit rl{};
        getrlimit(RLIMIT_NOFILE, &rl);
        why += " (this process may open " + std::to_string(rl.rlim_cur) + "; raise it with ulimit -n)";
      }
      log("accept", "cannot accept connections: " + why + "; " + std::to_string(conns.size()) +
                        " are open; trying again every 250 ms");
      return;
    }
    std::string peer = peer_of(ss);
    if (conns.size() >= opt.limits.max_connections) {
      // Clients that have not proven themselves give way to new ones; proven ones never do.
      auto victim = std::find_if(conns.begin(), conns.end(), [](const auto& kv) { return kv.second.stage != Stage::Ready; });
      if (victim == conns.end()) {
        log("connections-full", "turned away a connection from " + peer + ": " + std::to_string(conns.size()) +
                               " connections are open, the limit");
        close(fd);
        continue;
      }
      log("connections-evict", std::to_string(conns.size()) + " connections are open, the limit: dropped the oldest "
                         "that had not finished its handshake (from " + victim->second.peer + ") for one from " + peer);
      drop(victim);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    c.peer = std::move(peer);
    c.deadline = Clock::now() + opt.limits.handshake_timeout;
    conns.emplace(next_id++, std::move(c));
  }
}

void StoreServer::Impl::read_from(Conn& c) {
  while (can_read(c)) {
    ssize_t r = recv(c.fd, read_buf.data(), read_buf.size(), 0);
    if (r > 0) {
      c.in.append(read_buf.data(), static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.eof = true;  // an orderly close or a reset: what arrived before it is still served
    break;
  }
}

void StoreServer::Impl::schedule(uint64_t id, Conn& c) {
  if (c.queued) return;
  c.queued = true;
  run_queue.push_back(id);
}

void StoreServer::Impl::drain_queue() {
  while (!run_queue.empty()) {
    uint64_t id = run_queue.front();
    run_queue.pop_front();
    auto it = conns.find(id);
    if (it == conns.end()) continue;
    Conn& c = it->second;
    c.queued = false;
    if (c.dead) continue;
    process(id, c);
    if (c.eof) c.dead = true;  // its replies have nowhere to go
  }
}

void StoreServer::Impl::process(uint64_t id, Conn& c) {
  while (!c.parked && !c.dead && !c.closing && c.unsent() < opt.limits.max_connection_bytes) {
    size_t avail = c.in.size() - c.in_off;
    if (avail < 4) break;
    const char* p = c.in.data() + c.in_off;
    uint32_t len = proto::get_u32(p);
    size_t limit = c.stage == Stage::Ready ? opt.limits.max_frame_bytes : proto::kMaxHandshakeFrame;
    if (len > limit) {
      log(c.stage == Stage::Ready ? "frame" : "frame-early", "closed the connection from " + c.peer + ": it sent a request of " + bytes_str(len) +
                       (c.stage == Stage::Ready ? "" : " before its handshake") + ", more than the limit of " +
                       bytes_str(limit));
      refuse(c, "a request of " + bytes_str(len) + " is larger than this store takes (" + bytes_str(limit) + ")");
      break;
    }
    if (avail - 4 < len) break;
    uint8_t op = 0;
    std::vector<std::string> fields;
    if (!proto::decode(p + 4, len, op, fields)) {
      log("malformed", "closed the connection from " + c.peer + ": a malformed request");
      refuse(c, "malformed request");
      break;
    }
    c.in_off += 4 + len;
    if (c.stage == Stage::Ready)
      handle(id, c, op, fields);
    else
      handshake(c, op, fields);
  }
  if (c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
  } else if (c.in_off > c.in.size() / 2) {
    c.in.erase(0, c.in_off);
    c.in_off = 0;
  }
  if (!c.dead) flush(c);
}

}  // namespace tandem::dist
