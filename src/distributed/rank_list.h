#pragma once
// Internal: ranks named in messages.
#include <string>
#include <vector>

namespace tandem::dist::detail {

/// "rank 3" or "ranks 0, 2, 5": the first eight, then how many there are in all.
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) return s + ", ... (" + std::to_string(ranks.size()) + " in all)";
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace tandem::dist::detail
