#pragma once
// Internal: socket and address helpers shared by the store, the bootstrap and the launcher.
#include <chrono>
#include <cstddef>
#include <string>

namespace tandem::dist::net {

/// A host and a TCP port, as in "10.0.0.1:29500" or "[::1]:29500".
struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;
};

/// Parses "host:port" (IPv6 hosts in brackets); throws tandem::Error (Input) naming `what` when malformed.
HostPort parse_host_port(const std::string& text, const std::string& what);
/// Parses a port number 1..65535; throws tandem::Error (Input) naming `what` otherwise.
int parse_port(const std::string& text, const std::string& what);

/// "30 s", "1.5 s", "250 ms": durations as error messages show them.
std::string format_duration(std::chrono::milliseconds d);

/// strerror(err) as a std::string (thread-safe).
std::string errno_str(int err);

/// This machine's host name.
std::string host_name();
/// The IPv4 (else IPv6) address of a network interface; throws tandem::Error (Input) when it has none.
std::string interface_address(const std::string& ifname);
/// The first non-loopback address of this machine, or "" when it has none.
std::string first_external_address();
/// The numeric address a host name resolves to (IPv4 preferred); throws tandem::Error (Input) when it
/// does not resolve.
std::string resolve(const std::string& host);
/// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(const std::string& host);

/// The numeric address of the local end of a connected socket.
std::string local_address(int fd);

/// Sets close-on-exec and, when asked, non-blocking mode; throws naming the call on failure.
void set_fd_flags(int fd, bool nonblocking);

/// Writes all bytes to a blocking socket or pipe, retrying on EINTR and partial writes; false on error
/// (errno set). Never raises SIGPIPE on sockets.
bool write_all(int fd, const void* data, size_t n);

}  // namespace tandem::dist::net
