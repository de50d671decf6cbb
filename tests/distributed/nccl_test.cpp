// The NCCL communicator on CUDA tensors: a group of one in this process (any GPU machine), and
// multi-process jobs through `tandem launch` where the machine has enough GPUs.
#include <gtest/gtest.h>

#include "distributed/rendezvous/group.h"
#include "process_util.h"
#include "tandem/device.h"
#include "tandem/distributed/store.h"
#include "text_util.h"

using namespace tandem;
using namespace tandem::dist;
using tandem::test::ProcResult;
using tandem::test::run_process;

namespace {

const std::string kTandem = TANDEM_BIN;
const std::string kWorker = TANDEM_DIST_WORKER;

using tandem::test::contains;

// Skips unless NCCL was built and the machine has `gpus` GPUs.
#define REQUIRE_GPUS(gpus)                                                                        \
  do {                                                                                            \
    if (!TANDEM_TEST_WITH_NCCL) GTEST_SKIP() << "tandem was built without NCCL";                  \
    if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";                          \
    if (tandem::cuda_device_count() < (gpus)) GTEST_SKIP() << "needs " << (gpus) << " CUDA GPUs"; \
  } while (0)

std::shared_ptr<Communicator> group_of_one(StoreServer& server, std::unique_ptr<Store>& store) {
  store = std::make_unique<Store>("127.0.0.1", server.port(), std::chrono::seconds(30));
  dist::detail::GroupSpec g;
  g.device = Device::cuda(0);
  g.store = store.get();
  g.prefix = "test/";
  g.timeout = std::chrono::seconds(30);
  return dist::detail::make_nccl_communicator(g);
}

TEST(NcclGroupOfOne, CollectivesOnOneGpu) {
  REQUIRE_GPUS(1);
  StoreServer server(0, "127.0.0.1");
  std::unique_ptr<Store> store;
  auto c = group_of_one(server, store);
  EXPECT_EQ(c->backend_name(), "nccl");
  EXPECT_EQ(c->size(), 1);
  EXPECT_TRUE(c->device() == Device::cuda(0));

  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      Tensor t = Tensor::from_vector<float>({1, -2, 3, 250}, {4}).to(dt).to(Device::cuda(0));
      WorkPtr w = c->all_reduce(t, op);
      w->wait();
      EXPECT_EQ(t.cpu().to_vector<float>(), (std::vector<float>{1, -2, 3, 250})) << dtype_name(dt);
      EXPECT_TRUE(w->done());
    }
  }
  Tensor in = Tensor::from_vector<int32_t>({7, 8, 9}, {3}).to(Device::cuda(0));
  Tensor out = Tensor::zeros({3}, DType::i32, Device::cuda(0));
  c->all_gather(in, out)->wait();
  EXPECT_EQ(out.cpu().to_vector<int32_t>(), (std::vector<int32_t>{7, 8, 9}));
  Tensor outv = Tensor::zeros({3}, DType::i32, Device::cuda(0));
  c->all_gatherv(in, outv, {3})->wait();
  EXPECT_EQ(outv.cpu().to_vector<int32_t>(), (std::vector<int32_t>{7, 8, 9}));
  c->broadcast(in, 0)->wait();
  EXPECT_EQ(in.cpu().to_vector<int32_t>(), (std::vector<int32_t>{7, 8, 9}));
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      Tensor rin = Tensor::from_vector<float>({4, -6, 8}, {3}).to(dt).to(Device::cuda(0));
      Tensor rout = Tensor::zeros({3}, dt, Device::cuda(0));
      c->reduce_scatter(rin, rout, op)->wait();
      EXPECT_EQ(rout.cpu().to_vector<float>(), (std::vector<float>{4, -6, 8})) << dtype_name(dt);
      c->reduce_scatter(rin, rin, op)->wait();  // in place: the output is the rank's (only) block
      EXPECT_EQ(rin.cpu().to_vector<float>(), (std::vector<float>{4, -6, 8})) << dtype_name(dt);
    }
  }
  Tensor gathered = Tensor::from_vector<float>({1, 2}, {2}).to(Device::cuda(0));
  c->all_gather(gathered, gathered)->wait();  // in place
  EXPECT_EQ(gathered.cpu().to_vector<float>(), (std::vector<float>{1, 2}));
  c->barrier();

  Tensor cpu = Tensor::zeros({2});
  EXPECT_THROW(c->all_reduce(cpu), Error);  // CPU tensors belong to Gloo
  Tensor bytes = Tensor::zeros({2}, DType::u8, Device::cuda(0));
  EXPECT_THROW(c->all_reduce(bytes), Error);
}

ProcResult launch(int n, const std::string& scenario, double timeout_s = 120) {
  return run_process({kTandem, "launch", "-n", std::to_string(n), "--", kWorker, scenario, "--device", "cuda"}, {},
                     timeout_s);
}

TEST(NcclLaunch, AllReduceTwoRanks) {
  REQUIRE_GPUS(2);
  ProcResult r = launch(2, "allreduce");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: all_reduce ok on 2 ranks")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] rank 1: all_reduce ok on 2 ranks")) << r.output;
}

TEST(NcclLaunch, GathersBroadcastBarrierTwoRanks) {
  REQUIRE_GPUS(2);
  ProcResult r = launch(2, "collectives");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* what : {"reduce_scatter ok", "all_gather ok", "all_gatherv ok", "broadcast ok", "barrier ok"}) {
    EXPECT_TRUE(contains(r.output, "rank 0: " + std::string(what))) << r.output;
    EXPECT_TRUE(contains(r.output, "[rank 1] rank 1: " + std::string(what))) << r.output;
  }
}

TEST(NcclLaunch, AllCollectivesThreeRanks) {
  REQUIRE_GPUS(3);
  ProcResult r = launch(3, "all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] rank 2: all_reduce ok on 3 ranks")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] rank 2: reduce_scatter ok")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] rank 2: barrier ok")) << r.output;
}

TEST(NcclLaunch, APeerThatNeverJoinsTheCollectiveTimesOut) {
  REQUIRE_GPUS(2);
  ProcResult r = launch(2, "peer_hangs", 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "collective all_reduce on rank 0 timed out after 1 s (a peer may have died)"))
      << r.output;
  EXPECT_LT(r.seconds, 30.0);
}

TEST(NcclLaunch, APeerThatDiedFailsTheCollective) {
  REQUIRE_GPUS(2);
  ProcResult r = launch(2, "peer_dies", 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0: collective error after")) << r.output;
  EXPECT_LT(r.seconds, 30.0);
}

}  // namespace
