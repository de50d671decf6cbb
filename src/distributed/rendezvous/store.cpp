// The store's client: one non-blocking socket, every wait bounded by poll() with a deadline.
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <mutex>
#include <thread>

#include "distributed/rendezvous/net.h"
#include "distributed/rendezvous/secret.h"
#include "distributed/rendezvous/store_protocol.h"
#include "tandem/distributed/store.h"
#include "tandem/error.h"

namespace tandem::dist {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// The largest frame a client sends or accepts: what a server takes by default.
const size_t kMaxFrame = StoreLimits{}.max_frame_bytes;

// Why an I/O step stopped before finishing.
enum class IoFail { None, Timeout, Closed, Error };

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Waits for `events` on fd until the deadline.
IoFail wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return IoFail::None;
    if (n == 0) return IoFail::Timeout;
    if (errno != EINTR) return IoFail::Error;
  }
}

IoFail send_all(int fd, const std::string& s, Clock::time_point deadline) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (IoFail f = wait_fd(fd, POLLOUT, deadline); f != IoFail::None) return f;
    } else {
      return errno == EPIPE || errno == ECONNRESET ? IoFail::Closed : IoFail::Error;
    }
  }
  return IoFail::None;
}

IoFail recv_all(int fd, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return IoFail::Closed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (IoFail f = wait_fd(fd, POLLIN, deadline); f != IoFail::None) return f;
    } else {
      return errno == ECONNRESET ? IoFail::Closed : IoFail::Error;
    }
  }
  return IoFail::None;
}

// Transient failures while the server may still be coming up.
bool retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == ECONNRESET || err == EAGAIN || err == EINTR;
}

}  // namespace

struct Store::Impl {
  std::string host;
  int port = 0;
  std::string where;
  milliseconds timeout;
  StoreAuth auth;
  mutable std::mutex mu;
  int fd = -1;

  ~Impl() { disconnect(); }
  void disconnect() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  void connect_until(Clock::time_point deadline);
  // Proves to the server that this process belongs to the job, and checks the server's proof. False
  // when the connection broke (worth another try); throws when the server turned this process away.
  bool authenticate(Clock::time_point deadline);
  // One frame each way on the connection, without reconnecting; the caller holds mu.
  uint8_t exchange(uint8_t op, const std::vector<std::string>& fields, std::vector<std::string>& reply,
                   Clock::time_point deadline, const std::string& timeout_msg);
  // Sends one request and returns the reply; the caller holds mu.
  uint8_t request(uint8_t op, const std::vector<std::string>& fields, std::vector<std::string>& reply,
                  Clock::time_point deadline, const std::string& timeout_msg);
  [[noreturn]] void fail(IoFail f, const std::string& timeout_msg);
};

void Store::Impl::connect_until(Clock::time_point deadline) {
  std::string last = "no address";
  int delay_ms = 10;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string port_str = std::to_string(port);
    int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
    if (rc != 0) {
      last = std::string("cannot resolve host '") + host + "': " + gai_strerror(rc);
    }
    for (addrinfo* a = rc == 0 ? res : nullptr; a; a = a->ai_next) {
      int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (s < 0) {
        last = net::errno_str(errno);
        continue;
      }
      int err = 0;
      if (::connect(s, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          err = 0;
          IoFail f = wait_fd(s, POLLOUT, deadline);
          if (f == IoFail::None) {
            socklen_t len = sizeof err;
            getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
          } else {
            err = ETIMEDOUT;
          }
        }
      }
      if (err == 0) {
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd = s;
        bool ok = false;
        try {
          ok = authenticate(deadline);
        } catch (...) {
          freeaddrinfo(res);
          throw;
        }
        if (ok) {
          freeaddrinfo(res);
          return;
        }
        // The server hung up during the handshake: one at its connection limit does so. Try again.
        disconnect();
        last = "the server closed the connection during the handshake";
        break;
      }
      close(s);
      last = net::errno_str(err);
      if (!retryable(err)) break;
    }
    if (res) freeaddrinfo(res);
    int left = remaining_ms(deadline);
    TANDEM_RUNTIME_CHECK(left > 0, "could not reach the rendezvous store at ", where, " within ",
                         net::format_duration(timeout), ": ", last,
                         " (is the process hosting it running - rank 0 or the launcher - and is the address right?)");
    std::this_thread::sleep_for(milliseconds(std::min(delay_ms, left)));
    delay_ms = std::min(delay_ms * 2, 500);
  }
}

void Store::Impl::fail(IoFail f, const std::string& timeout_msg) {
  int err = errno;
  disconnect();  // the stream may hold a late reply: start afresh next time
  TANDEM_RUNTIME_CHECK(f != IoFail::Timeout, timeout_msg);
  TANDEM_RUNTIME_CHECK(f != IoFail::Closed, "the rendezvous store at ", where,
                       " closed the connection (did the process hosting it exit?)");
  TANDEM_RUNTIME_CHECK(false, "lost the connection to the rendezvous store at ", where, ": ", net::errno_str(err));
}

uint8_t Store::Impl::exchange(uint8_t op, const std::vector<std::string>& fields, std::vector<std::string>& reply,
                              Clock::time_point deadline, const std::string& timeout_msg) {
  if (IoFail f = send_all(fd, proto::encode(op, fields), deadline); f != IoFail::None) fail(f, timeout_msg);
  char hdr[4];
  if (IoFail f = recv_all(fd, hdr, 4, deadline); f != IoFail::None) fail(f, timeout_msg);
  uint32_t len = proto::get_u32(hdr);
  if (len > kMaxFrame) {
    disconnect();
    TANDEM_RUNTIME_CHECK(false, "the rendezvous store at ", where, " sent a corrupt reply (is that address a store?)");
  }
  std::string body(len, '\0');
  if (IoFail f = recv_all(fd, body.data(), len, deadline); f != IoFail::None) fail(f, timeout_msg);
  uint8_t status = 0;
  if (!proto::decode(body.data(), body.size(), status, reply)) {
    disconnect();
    TANDEM_RUNTIME_CHECK(false, "the rendezvous store at ", where, " sent a corrupt reply (is that address a store?)");
  }
  return status;
}

bool Store::Impl::authenticate(Clock::time_point deadline) {
  const std::string timeout_msg = "the rendezvous store at " + where + " did not answer the handshake within " +
                                  net::format_duration(timeout) + " (is that address a tandem store?)";
  const std::string nonce = secret::random_bytes(proto::kNonceBytes);
  std::vector<std::string> r;
  uint8_t st;
  try {
    st = exchange(proto::kHello, {proto::kVersion, auth.job_id, nonce}, r, deadline, timeout_msg);
  } catch (const Error& e) {
    if (fd < 0 && e.kind() == Error::Kind::Runtime && Clock::now() < deadline) return false;  // hung up: retry
    throw;
  }
  TANDEM_CHECK(st != proto::kError, "the rendezvous store at ", where, " turned this process away: ",
               r.empty() ? "no reason given" : r[0],
               " (every process of a job must be given the same job id; two jobs need two addresses)");
  TANDEM_RUNTIME_CHECK(st == proto::kOk && r.size() == 3 && r[0].size() == proto::kNonceBytes,
                       "the rendezvous store at ", where, " sent a malformed handshake reply");
  const std::string& server_nonce = r[0];
  if (r[1] == "open") {
    TANDEM_CHECK(auth.secret.empty(), "the rendezvous store at ", where, " does not ask for the job's secret, but this "
                 "process has one (TANDEM_SECRET or TANDEM_SECRET_FILE): give every process of the job the same "
                 "secret, or none");
    return true;
  }
  TANDEM_CHECK(!auth.secret.empty(), "the rendezvous store at ", where, " asks for the job's secret and this process "
               "has none: give it the job's secret in TANDEM_SECRET_FILE (or TANDEM_SECRET)");
  std::string expected =
      secret::hmac_sha256(auth.secret, proto::proof_message("server", auth.job_id, nonce, server_nonce));
  TANDEM_CHECK(r[1] == "secret" && secret::equal(r[2], expected), "the rendezvous store at ", where,
               " does not know this job's secret: either the processes were given different secrets, or another "
               "program answers at that address");
  std::string proof =
      secret::hmac_sha256(auth.secret, proto::proof_message("client", auth.job_id, server_nonce, nonce));
  st = exchange(proto::kAuth, {proof}, r, deadline, timeout_msg);
  TANDEM_CHECK(st == proto::kOk, "the rendezvous store at ", where, " refused this process's secret: ",
               r.empty() ? "no reason given" : r[0],
               " (every process of a job must be given the same TANDEM_SECRET or TANDEM_SECRET_FILE)");
  return true;
}

uint8_t Store::Impl::request(uint8_t op, const std::vector<std::string>& fields, std::vector<std::string>& reply,
                             Clock::time_point deadline, const std::string& timeout_msg) {
  if (fd < 0) connect_until(Clock::now() + timeout);
  TANDEM_CHECK(proto::frame_size(fields) - 4 <= kMaxFrame, "rendezvous store: a request of ", proto::frame_size(fields),
               " bytes is larger than the store takes (", kMaxFrame >> 20, " MiB); keep values small");
  uint8_t status = exchange(op, fields, reply, deadline, timeout_msg);
  if (status == proto::kError)
    TANDEM_RUNTIME_CHECK(false, "rendezvous store at ", where, ": ", reply.empty() ? "error" : reply[0]);
  return status;
}

Store::Store(const std::string& host, int port, milliseconds timeout, StoreAuth auth)
    : impl_(std::make_unique<Impl>()) {
  TANDEM_CHECK(port >= 1 && port <= 65535, "rendezvous store: port ", port, " is not a TCP port (1..65535)");
  TANDEM_CHECK(auth.secret.empty() || auth.secret.size() >= secret::kMinBytes, "rendezvous store: a secret needs at "
               "least ", secret::kMinBytes, " bytes");
  impl_->auth = std::move(auth);
  impl_->host = host;
  impl_->port = port;
  impl_->where = net::HostPort{host, port}.str();
  impl_->timeout = timeout;
  impl_->connect_until(Clock::now() + timeout);
}

Store::~Store() = default;

namespace {
std::string op_timeout(const std::string& what, const std::string& key, const std::string& where, milliseconds t) {
  return "rendezvous store at " + where + ": " + what + " of key '" + key + "' got no reply within " +
         net::format_duration(t) + " (is the process hosting the store alive?)";
}
}  // namespace

void Store::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> reply;
  impl_->request(proto::kSet, {key, value}, reply, Clock::now() + impl_->timeout,
                 op_timeout("set", key, impl_->where, impl_->timeout));
}

std::string Store::get(const std::string& key) { return get(key, timeout(), ""); }

std::string Store::get(const std::string& key, milliseconds timeout, const std::string& missing) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string msg = missing.empty()
                        ? "timed out after " + net::format_duration(timeout) + " waiting for key '" + key +
                              "' in the rendezvous store at " + impl_->where +
                              " (the process that should set it may have failed or not started)"
                        : missing + " within " + net::format_duration(timeout) + " (key '" + key +
                              "' in the rendezvous store at " + impl_->where + ")";
  std::vector<std::string> reply;
  impl_->request(proto::kGet, {key}, reply, Clock::now() + timeout, msg);
  TANDEM_RUNTIME_CHECK(reply.size() == 1, "rendezvous store at ", impl_->where, ": malformed reply to get");
  return std::move(reply[0]);
}

std::optional<std::string> Store::try_get(const std::string& key) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> reply;
  uint8_t st = impl_->request(proto::kTryGet, {key}, reply, Clock::now() + impl_->timeout,
                              op_timeout("try_get", key, impl_->where, impl_->timeout));
  if (st == proto::kNotFound) return std::nullopt;
  TANDEM_RUNTIME_CHECK(reply.size() == 1, "rendezvous store at ", impl_->where, ": malformed reply to try_get");
  return std::move(reply[0]);
}

int64_t Store::add(const std::string& key, int64_t n) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> reply;
  impl_->request(proto::kAdd, {key, std::to_string(n)}, reply, Clock::now() + impl_->timeout,
                 op_timeout("add", key, impl_->where, impl_->timeout));
  int64_t v = 0;
  bool ok = reply.size() == 1;
  if (ok) {
    auto [p, ec] = std::from_chars(reply[0].data(), reply[0].data() + reply[0].size(), v);
    ok = ec == std::errc() && p == reply[0].data() + reply[0].size();
  }
  TANDEM_RUNTIME_CHECK(ok, "rendezvous store at ", impl_->where, ": malformed reply to add");
  return v;
}

bool Store::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> reply;
  return impl_->request(proto::kCheck, keys, reply, Clock::now() + impl_->timeout,
                        op_timeout("check", keys.empty() ? "" : keys[0], impl_->where, impl_->timeout)) ==
         proto::kOk;
}

bool Store::erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> reply;
  return impl_->request(proto::kErase, {key}, reply, Clock::now() + impl_->timeout,
                        op_timeout("erase", key, impl_->where, impl_->timeout)) == proto::kOk;
}

void Store::set_timeout(milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->timeout = timeout;
}

milliseconds Store::timeout() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->timeout;
}

std::string Store::address() const { return impl_->where; }

std::string Store::local_address() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->fd < 0) impl_->connect_until(Clock::now() + impl_->timeout);
  return net::local_address(impl_->fd);
}

}  // namespace tandem::dist
