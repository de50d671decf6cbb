// The one-process communicator, and init_communicator outside a distributed launch.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/sparse_all_reduce.h"
#include "tandem/error.h"

using namespace tandem;
using namespace tandem::dist;

namespace {

TEST(SingleCommunicator, DescribesAGroupOfOne) {
  auto c = make_single_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->local_rank(), 0);
  EXPECT_EQ(c->local_size(), 1);
  EXPECT_EQ(c->backend_name(), "single");
  EXPECT_TRUE(c->device().is_cpu());
}

TEST(SingleCommunicator, AllReduceLeavesTheData) {
  auto c = make_single_communicator();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    Tensor f = Tensor::from_vector<float>({1.5f, -2.f, 3.f}, {3});
    Tensor i = Tensor::from_vector<int64_t>({7, -9}, {2});
    WorkPtr w = c->all_reduce(f, op);
    EXPECT_TRUE(w->done());
    w->wait();
    c->all_reduce(i, op)->wait();
    EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, -2.f, 3.f}));
    EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{7, -9}));
  }
}

TEST(SingleCommunicator, GathersCopy) {
  auto c = make_single_communicator();
  Tensor in = Tensor::from_vector<int32_t>({4, 5, 6}, {3});
  Tensor out = Tensor::zeros({3}, DType::i32);
  c->all_gather(in, out)->wait();
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_FALSE(out.shares_storage(in));

  Tensor outv = Tensor::zeros({3}, DType::i32);
  c->all_gatherv(in, outv, {3})->wait();
  EXPECT_EQ(outv.to_vector<int32_t>(), (std::vector<int32_t>{4, 5, 6}));
}

TEST(SingleCommunicator, ReduceScatterCopiesItsOnlyBlock) {
  auto c = make_single_communicator();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    Tensor in = Tensor::from_vector<float>({2.5f, -1.f, 7.f}, {3});
    Tensor out = Tensor::zeros({3});
    c->reduce_scatter(in, out, op)->wait();
    EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{2.5f, -1.f, 7.f}));
    EXPECT_FALSE(out.shares_storage(in));
    c->reduce_scatter(in, in, op)->wait();  // in place
    EXPECT_EQ(in.to_vector<float>(), (std::vector<float>{2.5f, -1.f, 7.f}));
  }
  Tensor whole = Tensor::from_vector<int64_t>({3, 4}, {2});
  c->all_gather(whole, whole)->wait();  // in place: the input is the output's only block
  EXPECT_EQ(whole.to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
}

TEST(SingleCommunicator, ReduceScatterRejectsWhatAGroupWouldReject) {
  auto c = make_single_communicator();
  Tensor four = Tensor::zeros({4});
  Tensor three = Tensor::zeros({3});
  Tensor ints = Tensor::zeros({4}, DType::i32);
  EXPECT_THROW(c->reduce_scatter(four, three), Error);
  EXPECT_THROW(c->reduce_scatter(four, ints), Error);
  try {
    c->reduce_scatter(four, three);
    ADD_FAILURE() << "a reduce_scatter into too small an output was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must hold 1 x 3 = 3 elements"), std::string::npos) << e.what();
  }
  Tensor base = Tensor::zeros({8});
  Tensor shifted = base.narrow(0, 2, 4);
  EXPECT_THROW(c->reduce_scatter(base.narrow(0, 0, 4), shifted), Error);  // overlaps, not in place
}

TEST(SingleCommunicator, BroadcastAndBarrierDoNothing) {
  auto c = make_single_communicator();
  Tensor t = Tensor::from_vector<float>({1.f, 2.f}, {2});
  c->broadcast(t, 0)->wait();
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1.f, 2.f}));
  c->barrier();
  c->set_timeout(std::chrono::milliseconds(10));
}

TEST(SingleCommunicator, RejectsWhatAGroupWouldReject) {
  auto c = make_single_communicator();
  Tensor t = Tensor::zeros({4}, DType::f32);
  Tensor small = Tensor::zeros({3}, DType::f32);
  Tensor other = Tensor::zeros({4}, DType::i32);
  EXPECT_THROW(c->broadcast(t, 1), Error);
  EXPECT_THROW(c->all_gather(t, small), Error);
  EXPECT_THROW(c->all_gather(t, other), Error);
  EXPECT_THROW(c->all_gatherv(t, t, {4, 0}), Error);
  EXPECT_THROW(c->all_gatherv(small, t, {4}), Error);
  Tensor strided = Tensor::zeros({4, 4}, DType::f32).transpose(0, 1);
  EXPECT_THROW(c->all_reduce(strided), Error);
  Tensor undefined;
  EXPECT_THROW(c->all_reduce(undefined), Error);
  EXPECT_THROW(c->set_timeout(std::chrono::milliseconds(0)), Error);
  try {
    c->all_gather(t, small);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must hold 1 x 4 = 4 elements"), std::string::npos) << e.what();
  }
}

// One rank: the sum is this rank's selection, and the accumulation keeps the rest.
TEST(SingleCommunicator, SparseAllReduceKeepsTheSelection) {
  auto c = make_single_communicator();
  Tensor t = Tensor::from_vector<float>({0.5f, -3.f, 2.f, -0.25f}, {2, 2});
  Tensor acc = Tensor::from_vector<float>({0.f, 0.f, 1.f, 0.f}, {4});
  sparse_all_reduce(*c, t, acc, 0.5, true);  // the 2 largest of {0.5, -3, 3, -0.25}
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0.f, -3.f, 3.f, 0.f}));
  EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{0.5f, 0.f, 0.f, -0.25f}));
  Tensor u = Tensor::from_vector<float>({0.5f, -3.f, 2.f, -0.25f}, {4});
  sparse_all_reduce(*c, u, Tensor(), 0.5, false);  // |x| >= 0.5
  EXPECT_EQ(u.to_vector<float>(), (std::vector<float>{0.5f, -3.f, 2.f, 0.f}));
}

TEST(SingleCommunicator, SparseAllReduceRefusesBadArguments) {
  auto c = make_single_communicator();
  Tensor t = Tensor::zeros({4});
  Tensor d = Tensor::zeros({4}, DType::f64), small = Tensor::zeros({3});
  auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { sparse_all_reduce(*c, d, Tensor(), 0.5, true); }).find("must be f32"), std::string::npos);
  EXPECT_NE(message([&] { sparse_all_reduce(*c, t, small, 0.5, true); }).find("of 4 elements"), std::string::npos);
  EXPECT_NE(message([&] { sparse_all_reduce(*c, t, Tensor(), 1.5, true); }).find("in (0, 1]"), std::string::npos);
  EXPECT_NE(message([&] { sparse_all_reduce(*c, t, Tensor(), -1.0, false); }).find("must not be negative"),
            std::string::npos);
}

TEST(SingleCommunicator, IsWhatInitCommunicatorGivesASingleProcess) {
  DistEnv env = detect_env();
  if (env.world_size != 1) GTEST_SKIP() << "this test process was started as part of a distributed job";
  EXPECT_EQ(env.launcher, "none");
  EXPECT_EQ(env.rank, 0);
  auto c = init_communicator(Device::cpu());
  EXPECT_EQ(c->backend_name(), "single");
  EXPECT_EQ(c->size(), 1);
  EXPECT_FALSE(has_rendezvous_store());
  EXPECT_THROW(rendezvous_store(), Error);
  EXPECT_EQ(dist_rank(), 0);
  EXPECT_EQ(dist_world_size(), 1);
}

}  // namespace
