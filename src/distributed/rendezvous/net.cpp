#include "distributed/rendezvous/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>

#include "tandem/error.h"

namespace tandem::dist::net {

std::string HostPort::str() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

int parse_port(const std::string& text, const std::string& what) {
  int port = -1;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  TANDEM_CHECK(ec == std::errc() && p == text.data() + text.size() && port >= 1 && port <= 65535, what, "='",
               text, "' is not a TCP port (1..65535)");
  return port;
}

HostPort parse_host_port(const std::string& text, const std::string& what) {
  HostPort hp;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    TANDEM_CHECK(close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':', what, "='", text,
                 "' is not of the form [ipv6]:port");
    hp.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    TANDEM_CHECK(colon != std::string::npos && colon > 0, what, "='", text, "' is not of the form host:port");
    hp.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  hp.port = parse_port(port, what);
  return hp;
}

std::string format_duration(std::chrono::milliseconds d) {
  long long ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  char buf[64];
  if (ms % 1000 == 0)
    std::snprintf(buf, sizeof buf, "%lld s", ms / 1000);
  else
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::string errno_str(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* s = strerror_r(err, buf, sizeof buf);
  return s ? std::string(s) : std::string("error ") + std::to_string(err);
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

namespace {
std::string numeric_address(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

struct IfAddrs {
  ifaddrs* list = nullptr;
  IfAddrs() {
    TANDEM_RUNTIME_CHECK(getifaddrs(&list) == 0, "getifaddrs failed: ", errno_str(errno));
  }
  ~IfAddrs() { freeifaddrs(list); }
};
}  // namespace

std::string interface_address(const std::string& ifname) {
  IfAddrs ifs;
  std::string v6;
  bool seen = false;
  for (ifaddrs* a = ifs.list; a; a = a->ifa_next) {
    if (!a->ifa_addr || ifname != a->ifa_name) continue;
    seen = true;
    if (a->ifa_addr->sa_family == AF_INET) return numeric_address(a->ifa_addr);
    if (a->ifa_addr->sa_family == AF_INET6 && v6.empty()) v6 = numeric_address(a->ifa_addr);
  }
  TANDEM_CHECK(seen, "network interface '", ifname, "' (TANDEM_SOCKET_IFNAME) does not exist on ", host_name());
  TANDEM_CHECK(!v6.empty(), "network interface '", ifname, "' (TANDEM_SOCKET_IFNAME) has no IP address on ",
               host_name());
  return v6;
}

std::string first_external_address() {
  IfAddrs ifs;
  for (ifaddrs* a = ifs.list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    return numeric_address(a->ifa_addr);
  }
  return "";
}

std::string resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  TANDEM_CHECK(rc == 0, "cannot resolve the host name '", host, "': ", gai_strerror(rc));
  std::string v4, v6;
  for (addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET && v4.empty()) v4 = numeric_address(a->ai_addr);
    if (a->ai_family == AF_INET6 && v6.empty()) v6 = numeric_address(a->ai_addr);
  }
  freeaddrinfo(res);
  TANDEM_CHECK(!v4.empty() || !v6.empty(), "the host name '", host, "' has no IP address");
  return v4.empty() ? v6 : v4;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string local_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return numeric_address(reinterpret_cast<sockaddr*>(&ss));
}

void set_fd_flags(int fd, bool nonblocking) {
  int fdflags = fcntl(fd, F_GETFD);
  TANDEM_RUNTIME_CHECK(fdflags >= 0 && fcntl(fd, F_SETFD, fdflags | FD_CLOEXEC) == 0,
                       "fcntl(F_SETFD, FD_CLOEXEC) failed: ", errno_str(errno));
  if (nonblocking) {
    int fl = fcntl(fd, F_GETFL);
    TANDEM_RUNTIME_CHECK(fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0, "fcntl(F_SETFL, O_NONBLOCK) failed: ",
                         errno_str(errno));
  }
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  struct stat st {};
  bool sock = fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
  while (n > 0) {
    ssize_t w = sock ? ::send(fd, p, n, MSG_NOSIGNAL) : ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a non-blocking descriptor: wait until it drains
        pollfd pfd{fd, POLLOUT, 0};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR) return false;
        continue;
      }
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace tandem::dist::net
