#pragma once
// Compares the tensor files a run leaves (a checkpoint, each rank's own state beside it).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "tandem/checkpoint.h"

namespace tandem::test {

/// Every tensor of a checkpoint file, by name.
inline std::map<std::string, tandem::Tensor> tensors_of(const std::string& path) {
  std::map<std::string, tandem::Tensor> out;
  for (auto& [name, t] : tandem::read_checkpoint_tensors(path)) out.emplace(name, t);
  return out;
}

/// The two files hold the same tensors, bit for bit.
inline void expect_same_tensors(const std::string& a, const std::string& b, const std::string& what) {
  auto ta = tensors_of(a), tb = tensors_of(b);
  ASSERT_EQ(ta.size(), tb.size()) << what;
  for (auto& [name, t] : ta) {
    auto it = tb.find(name);
    ASSERT_NE(it, tb.end()) << what << ": " << name << " is missing";
    ASSERT_EQ(t.nbytes(), it->second.nbytes()) << what << ": " << name;
    EXPECT_EQ(0, std::memcmp(t.data_ptr(), it->second.data_ptr(), t.nbytes())) << what << ": " << name << " differs";
  }
}

/// The checkpoints `a` and `b` of runs of `ranks` ranks hold the same bits: the checkpoint and each
/// rank's own state file beside it.
inline void expect_same_checkpoints(const std::string& a, const std::string& b, int ranks) {
  expect_same_tensors(a, b, "the checkpoint");
  for (int r = 0; r < ranks; ++r)
    expect_same_tensors(a + ".rank" + std::to_string(r), b + ".rank" + std::to_string(r),
                        "rank " + std::to_string(r) + "'s state");
}

}  // namespace tandem::test
