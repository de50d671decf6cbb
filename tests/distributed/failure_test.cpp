// Jobs that go wrong after the ranks met: a rank that stops for good is named by the collective that
// times out waiting for it; under mpiexec the failing rank takes the job down instead of waiting in
// MPI_Finalize; ranks started with different settings stop at once, naming the setting.
#include <gtest/gtest.h>

#include "process_util.h"
#include "text_util.h"

using tandem::test::in_path;
using tandem::test::ProcResult;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;
const std::string kWorker = TANDEM_DIST_WORKER;

#define SKIP_WITHOUT_GLOO() \
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo"

using tandem::test::contains;

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

TEST(HungRank, TheTimedOutCollectiveNamesTheRankThatStopped) {
  SKIP_WITHOUT_GLOO();
  ProcResult r = run_process({kTandem, "launch", "-n", "3", "--", kWorker, "stuck_rank"}, {}, 60);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 20);
  // Rank 1 reported step 3 and never issued its collective; ranks 0 and 2 wait in it.
  EXPECT_TRUE(contains(r.output, "collective all_reduce on rank 0 timed out after 2 s (a peer may have died): "
                                 "rank 1 made no progress since step 3 (this rank is at step 3)"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "rank 2 made no progress")) << r.output;
}

TEST(HungRank, MpiexecStopsEveryRankWhenOneFails) {
  SKIP_WITHOUT_GLOO();
#if !TANDEM_TEST_WITH_MPI
  GTEST_SKIP() << "tandem was built without MPI";
#endif
  if (!in_path("mpiexec")) GTEST_SKIP() << "mpiexec is not installed";
  // Rank 0 fails after its collective times out while rank 1 sleeps for two minutes: rank 0 must end
  // the job (MPI_Abort), not wait in MPI_Finalize for rank 1.
  ProcResult r = run_process({"mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", "2", kWorker, "stuck_rank"},
                             {}, 60);
  EXPECT_FALSE(r.timed_out) << "mpiexec was still running after 60 s:\n" << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 made no progress since step 3")) << r.output;
}

TEST(Agreement, RanksStartedWithDifferentSettingsStopAtOnce) {
  SKIP_WITHOUT_GLOO();
  ProcResult r = run_process({kTandem, "launch", "-n", "3", "--timeout", "60", "--", kWorker, "agree_mismatch"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_LT(r.seconds, 15);  // not a wait for the 60 s timeout
  EXPECT_TRUE(contains(r.output, "the ranks were started with different --batch-size: 64 on ranks 0, 2; 32 on rank 1. "
                                 "Every rank must be started with the same value"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "agreed")) << r.output;
}

TEST(Agreement, SettingsThatMayDifferAreWarnedAboutOnce) {
  SKIP_WITHOUT_GLOO();
  ProcResult r = run_process({kTandem, "launch", "-n", "3", "--", kWorker, "agree"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "warning: the ranks were started with different --seed: 0 on ranks 0, 2; 1 on rank 1"), 1)
      << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: agreed (1 warnings)")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] rank 2: agreed (0 warnings)")) << r.output;
}

}  // namespace
