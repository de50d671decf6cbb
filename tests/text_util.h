#pragma once
// Small helpers for tests that read what a program printed.
#include <string>

namespace tandem::test {

/// Whether `part` occurs in `s`.
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace tandem::test
