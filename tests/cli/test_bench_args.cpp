// The all-reduce benchmark's size arguments, spelled as in nccl-tests.
#include <gtest/gtest.h>

#include "cli/bench_allreduce.h"
#include "cli/commands.h"
#include "tandem/error.h"

using namespace tandem::cli;

TEST(BenchAllReduce, SweepFollowsTheFactor) {
  EXPECT_EQ(sweep_sizes(1024, 16384, 2), (std::vector<int64_t>{1024, 2048, 4096, 8192, 16384}));
  EXPECT_EQ(sweep_sizes(parse_size("1K"), parse_size("64K"), 4), (std::vector<int64_t>{1024, 4096, 16384, 65536}));
  EXPECT_EQ(sweep_sizes(10, 10, 2), (std::vector<int64_t>{8}));  // whole f32 elements
  // No overflow at the top of the range.
  EXPECT_EQ(sweep_sizes(int64_t{1} << 62, INT64_MAX, 2).size(), 1u);
}

TEST(BenchAllReduce, BadRangesAreInputErrors) {
  EXPECT_THROW(sweep_sizes(4096, 1024, 2), tandem::Error);
  EXPECT_THROW(sweep_sizes(2, 1024, 2), tandem::Error);
  EXPECT_THROW(sweep_sizes(4, 1024, 1), tandem::Error);
  EXPECT_THROW(parse_size("12Q"), tandem::Error);
}

TEST(DeviceForRank, OneVisibleGpuIsDeviceZeroOfTheRank) {
  EXPECT_EQ(cuda_index_for_rank(3, nullptr), 3);
  EXPECT_EQ(cuda_index_for_rank(3, ""), 3);
  EXPECT_EQ(cuda_index_for_rank(1, "0,1"), 1);
  EXPECT_EQ(cuda_index_for_rank(1, "5"), 0);  // srun --gpus-per-task=1
  EXPECT_EQ(cuda_index_for_rank(0, "GPU-8a1c"), 0);
}
