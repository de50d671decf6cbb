#pragma once
// Test helper: a store client that writes the wire format by hand, to play a broken or hostile
// client that the Store class would never be.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/rendezvous/store_protocol.h"

namespace tandem::test {

class RawClient {
 public:
  /// Connects to 127.0.0.1:port; a send_bytes that takes longer than `send_timeout_s` fails.
  explicit RawClient(int port, double send_timeout_s = 2) : send_timeout_s_(send_timeout_s) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{static_cast<time_t>(send_timeout_s), static_cast<suseconds_t>((send_timeout_s - static_cast<int>(send_timeout_s)) * 1e6)};
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  /// Bytes accepted by the kernel so far.
  size_t sent() const { return sent_; }

  /// False once the connection broke or the send timed out.
  bool send_bytes(const std::string& b) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(send_timeout_s_ * 1000));
    size_t off = 0;
    while (off < b.size()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      ssize_t w = ::send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (w <= 0) return false;
      off += static_cast<size_t>(w);
      sent_ += static_cast<size_t>(w);
    }
    return true;
  }
  bool send_frame(uint8_t op, const std::vector<std::string>& fields) {
    return send_bytes(dist::proto::encode(op, fields));
  }

  /// One frame from the server, or nothing when it closed the connection or sent none in time.
  std::optional<std::pair<uint8_t, std::vector<std::string>>> read_frame(double timeout_s = 5) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    for (;;) {
      if (in_.size() >= 4) {
        uint32_t len = dist::proto::get_u32(in_.data());
        if (in_.size() >= 4 + len) {
          uint8_t code = 0;
          std::vector<std::string> fields;
          bool ok = dist::proto::decode(in_.data() + 4, len, code, fields);
          in_.erase(0, 4 + len);
          if (!ok) return std::nullopt;
          return std::make_pair(code, fields);
        }
      }
      if (!fill(deadline)) return std::nullopt;
    }
  }

  /// Sends the handshake's first message for `job` and returns the server's reply.
  std::optional<std::pair<uint8_t, std::vector<std::string>>> hello(const std::string& job = "") {
    if (!send_frame(dist::proto::kHello, {dist::proto::kVersion, job, std::string(dist::proto::kNonceBytes, 'n')}))
      return std::nullopt;
    return read_frame();
  }

  /// True when the server closes the connection within timeout_s (what it sent before is skipped).
  bool closed_by_server(double timeout_s) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (fill(deadline)) in_.clear();
    return eof_;
  }

 private:
  // Reads what is there, waiting until the deadline; false at the end of the stream or the deadline.
  bool fill(std::chrono::steady_clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[65536];
    ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
    if (r <= 0) {
      eof_ = true;
      return false;
    }
    in_.append(buf, static_cast<size_t>(r));
    return true;
  }

  int fd_ = -1;
  double send_timeout_s_;
  bool connected_ = false;
  bool eof_ = false;
  size_t sent_ = 0;
  std::string in_;
};

}  // namespace tandem::test
