#pragma once
// Errors: user-fixable problems (bad input, bad arguments) and runtime failures (device, network).
#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

/// Thrown by tandem for every failure; kind() separates what a user must fix from what broke.
class Error : public std::runtime_error {
 public:
  enum class Kind { Input, Runtime, Internal };
  Error(Kind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

namespace detail {
/// Concatenates the streamable arguments into one string.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}
[[noreturn]] void throw_error(Error::Kind kind, const std::string& msg);
[[noreturn]] void throw_internal(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail
}  // namespace tandem

/// Throws tandem::Error (kind Input) with the message when cond is false: for bad input and arguments.
#define TANDEM_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) ::tandem::detail::throw_error(::tandem::Error::Kind::Input,                 \
                                               ::tandem::detail::cat(__VA_ARGS__));          \
  } while (0)

/// Throws tandem::Error (kind Runtime) when cond is false: for failures of devices and peers.
#define TANDEM_RUNTIME_CHECK(cond, ...)                                                      \
  do {                                                                                       \
    if (!(cond)) ::tandem::detail::throw_error(::tandem::Error::Kind::Runtime,               \
                                               ::tandem::detail::cat(__VA_ARGS__));          \
  } while (0)

/// Internal invariant: a failure is a bug in tandem, reported with its location.
#define TANDEM_ASSERT(cond, ...)                                                             \
  do {                                                                                       \
    if (!(cond)) ::tandem::detail::throw_internal(#cond, __FILE__, __LINE__,                 \
                                                  ::tandem::detail::cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
