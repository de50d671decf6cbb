// The store's server: one thread multiplexing every client with poll(). Requests of one connection
// are answered in order; a get of an absent key parks its connection until some client sets the key.
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <map>
#include <thread>
#include <unordered_map>

#include "distributed/net.h"
#include "distributed/store_protocol.h"
#include "tandem/distributed/store.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace {

struct Conn {
  int fd = -1;
  std::string in;        // bytes received, not yet parsed
  std::string out;       // bytes to send
  size_t out_off = 0;
  bool parked = false;   // waiting in a blocking get
  bool dead = false;
};

bool parse_i64(const std::string& s, int64_t& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

struct StoreServer::Impl {
  int listen_fd = -1;
  int wake_r = -1, wake_w = -1;
  int port = 0;
  std::string where;  // "host:port" for messages
  std::thread thread;

  // Owned by the server thread once it runs.
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;  // key -> parked connection ids
  std::map<uint64_t, Conn> conns;
  uint64_t next_id = 1;

  void run();
  void accept_all();
  void read_from(uint64_t id, Conn& c);
  void process(uint64_t id, Conn& c);
  void handle(uint64_t id, Conn& c, uint8_t op, std::vector<std::string>& fields);
  void reply(Conn& c, uint8_t status, const std::vector<std::string>& fields = {});
  void flush(Conn& c);
  void wake_waiters(const std::string& key);
};

StoreServer::StoreServer(int port, const std::string& host) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  std::string shown = (host.empty() ? std::string("0.0.0.0") : host) + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
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
                       err == EADDRINUSE ? " (another process holds the port; pick a free one)" : "");
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  s.port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  s.where = (host.empty() ? std::string("0.0.0.0") : host) + ":" + std::to_string(s.port);
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
    fds.clear();
    ids.clear();
    fds.push_back({wake_r, POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (auto& [id, c] : conns) {
      short ev = POLLIN;
      if (c.out_off < c.out.size()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      ids.push_back(id);
    }
    int n = poll(fds.data(), fds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nothing sensible left to do; clients will see their connections fail
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      auto it = conns.find(ids[i - 2]);
      if (it == conns.end()) continue;
      Conn& c = it->second;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(it->first, c);
      if (!c.dead && (fds[i].revents & POLLOUT)) flush(c);
    }
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->second.dead) {
        close(it->second.fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN, or out of descriptors: the client will retry or time out
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    conns.emplace(next_id++, std::move(c));
  }
}

void StoreServer::Impl::read_from(uint64_t id, Conn& c) {
  char buf[65536];
  bool closed = false;
  for (;;) {
    ssize_t r = recv(c.fd, buf, sizeof buf, 0);
    if (r > 0) {
      c.in.append(buf, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    closed = true;  // orderly close or a reset
    break;
  }
  process(id, c);  // a client may send its last request and close at once: apply it anyway
  if (closed) c.dead = true;  // parked gets are dropped with the connection
}

void StoreServer::Impl::process(uint64_t id, Conn& c) {
  size_t off = 0;
  while (!c.parked && !c.dead && c.in.size() - off >= 4) {
    uint32_t len = proto::get_u32(c.in.data() + off);
    if (len > proto::kMaxFrame) {
      c.dead = true;  // not a store client, or a corrupt stream
      break;
    }
    if (c.in.size() - off - 4 < len) break;
    uint8_t op = 0;
    std::vector<std::string> fields;
    if (!proto::decode(c.in.data() + off + 4, len, op, fields)) {
      c.dead = true;
      break;
    }
    off += 4 + len;
    handle(id, c, op, fields);
  }
  c.in.erase(0, off);
  if (!c.dead) flush(c);
}

void StoreServer::Impl::handle(uint64_t id, Conn& c, uint8_t op, std::vector<std::string>& f) {
  auto need = [&](size_t n) {
    if (f.size() == n) return true;
    reply(c, proto::kError, {"malformed request"});
    return false;
  };
  switch (op) {
    case proto::kSet:
      if (!need(2)) return;
      data[f[0]] = std::move(f[1]);
      reply(c, proto::kOk);
      wake_waiters(f[0]);
      return;
    case proto::kGet: {
      if (!need(1)) return;
      auto it = data.find(f[0]);
      if (it != data.end()) {
        reply(c, proto::kOk, {it->second});
      } else {
        c.parked = true;
        waiters[f[0]].push_back(id);
      }
      return;
    }
    case proto::kTryGet: {
      if (!need(1)) return;
      auto it = data.find(f[0]);
      if (it != data.end())
        reply(c, proto::kOk, {it->second});
      else
        reply(c, proto::kNotFound);
      return;
    }
    case proto::kAdd: {
      if (!need(2)) return;
      int64_t delta = 0, cur = 0;
      if (!parse_i64(f[1], delta)) return reply(c, proto::kError, {"add: the increment is not an integer"});
      auto it = data.find(f[0]);
      if (it != data.end() && !parse_i64(it->second, cur))
        return reply(c, proto::kError, {"add: key '" + f[0] + "' holds a value that is not an integer"});
      std::string v = std::to_string(cur + delta);
      data[f[0]] = v;
      reply(c, proto::kOk, {v});
      wake_waiters(f[0]);
      return;
    }
    case proto::kCheck: {
      bool all = true;
      for (const auto& k : f) all = all && data.count(k) > 0;
      reply(c, all ? proto::kOk : proto::kNotFound);
      return;
    }
    case proto::kErase:
      if (!need(1)) return;
      reply(c, data.erase(f[0]) ? proto::kOk : proto::kNotFound);
      return;
    default:
      reply(c, proto::kError, {"unknown request " + std::to_string(op)});
  }
}

void StoreServer::Impl::reply(Conn& c, uint8_t status, const std::vector<std::string>& fields) {
  c.out += proto::encode(status, fields);
}

void StoreServer::Impl::flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t w = send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (w > 0) {
      c.out_off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // poll reports when it drains
    c.dead = true;
    return;
  }
  c.out.clear();
  c.out_off = 0;
}

void StoreServer::Impl::wake_waiters(const std::string& key) {
  auto w = waiters.find(key);
  if (w == waiters.end()) return;
  std::vector<uint64_t> ids = std::move(w->second);
  waiters.erase(w);
  const std::string value = data[key];  // handlers run below may change or erase it
  for (uint64_t wid : ids) {
    auto it = conns.find(wid);
    if (it == conns.end() || it->second.dead) continue;
    Conn& wc = it->second;
    wc.parked = false;
    reply(wc, proto::kOk, {value});
    process(wid, wc);  // requests that arrived behind the get
  }
}

}  // namespace tandem::dist
