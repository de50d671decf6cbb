#pragma once
// Small helpers for tests that read what a program printed.
#include <string>

#include "tandem/error.h"

namespace tandem::test {

/// Whether `part` occurs in `s`.
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The message of the tandem::Error that f throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tandem::test
