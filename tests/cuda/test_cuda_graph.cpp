// Recorded steps (DeviceGraph): replays give the same bits as eager steps, read their inputs where
// they were recorded, rewrite their outputs, draw new dropout masks, and a recording that reads back
// to the host fails cleanly. The CLI records by default and says when it cannot.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_test_util.h"
#include "e2e/cli_util.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/distributed/loss_scaler.h"
#include "tandem/graph.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"
#include "tandem/precision.h"
#include "tandem/profiler.h"

namespace tandem {
namespace {

using namespace cudatest;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

TEST(CudaGraph, ProfiledKernelsAndReplaysAreTimedAndRecordingsStillWork) {
  REQUIRE_GPU();
  profiler::reset(gpu());
  profiler::set_verbosity(gpu(), 2);
  profiler::set_skip_iterations(gpu(), 0);
  Tensor w = rand_cpu({64, 32}, 5).to(gpu());
  w.requires_grad_();
  Tensor x = rand_cpu({16, 32}, 6).to(gpu());
  for (int i = 0; i < 2; ++i) backward(sum(relu(linear(x, w, Tensor()))));
  // A recording while profiled: nothing in it is timed (no kernel runs), each replay is, whole.
  Tensor y;
  DeviceGraph graph(gpu(), [&] { y = scale(x, 2.0); });
  graph.replay();
  graph.replay();
  synchronize(gpu());
  expect_close(scale(x.cpu(), 2.0), y.cpu(), 0.0, 0.0, "replayed while profiled");
  const profiler::Profile p = profiler::profile(gpu());
  profiler::set_verbosity(gpu(), 0);
  profiler::set_skip_iterations(gpu(), 5);
  profiler::reset(gpu());
  EXPECT_EQ(p.iterations, 4);  // two backward passes, two replays
  bool gemm = false, relu_grad = false, replays = false;
  for (const profiler::OpTime& op : p.ops) {
    EXPECT_GT(op.seconds, 0.0) << op.name;
    gemm |= op.name == "gemm" && op.phase == profiler::Phase::Forward && op.calls == 2;
    relu_grad |= op.name == "relu_backward" && op.phase == profiler::Phase::Backward && op.calls == 2;
    replays |= op.name == "recorded_step" && op.phase == profiler::Phase::Recorded && op.calls == 2;
  }
  EXPECT_TRUE(gemm && relu_grad && replays) << profiler::report(gpu());
}

TEST(CudaGraph, ReplaysReadInputsInPlaceAndRewriteOutputs) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({1000}, 1).to(gpu());
  Tensor y;
  DeviceGraph graph(gpu(), [&] { y = add_scalar(scale(x, 2.0), 1.0); });
  for (uint64_t seed : {2, 3, 4}) {
    Tensor fresh = rand_cpu({1000}, seed);
    x.copy_(fresh.to(gpu()));
    graph.replay();
    expect_close(add_scalar(scale(fresh, 2.0), 1.0), y.cpu(), 1e-6, 1e-6, "replay " + std::to_string(seed));
  }
  EXPECT_GE(graph.pool_bytes(), y.nbytes());
  EXPECT_GE(memory_stats(gpu()).graphs, graph.pool_bytes());
  EXPECT_GE(memory_stats(gpu()).graphs_peak_in_use, y.nbytes());
  EXPECT_LE(memory_stats(gpu()).graphs_peak_in_use, memory_stats(gpu()).graphs);
}

TEST(CudaGraph, RecordingThatReadsTheHostFailsCleanly) {
  REQUIRE_GPU();
  Tensor x = rand_cpu({16}, 5).to(gpu());
  try {
    DeviceGraph graph(gpu(), [&] { (void)scale(x, 3.0).to_vector<float>(); });
    FAIL() << "a recording that copies to the host was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  // The device goes on working eagerly, and a later recording succeeds.
  expect_close(scale(x.cpu(), 3.0), scale(x, 3.0).cpu(), 1e-6, 0, "eager after a failed recording");
  Tensor y;
  DeviceGraph ok(gpu(), [&] { y = scale(x, 4.0); });
  ok.replay();
  expect_close(scale(x.cpu(), 4.0), y.cpu(), 1e-6, 0, "recording after a failed one");
}

TEST(CudaGraph, DropoutMasksDifferBetweenReplays) {
  REQUIRE_GPU();
  Tensor x = Tensor::ones({1 << 16}, DType::f32, gpu());
  Generator gen(7);
  Tensor y;
  DeviceGraph graph(gpu(), [&] { y = dropout(x, 0.5, /*training=*/true, gen); });
  std::vector<std::vector<float>> masks;
  for (int r = 0; r < 3; ++r) {
    graph.replay();
    masks.push_back(y.to_vector<float>());
    int64_t kept = 0;
    for (float v : masks.back()) kept += v != 0.0f;
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(x.numel()), 0.5, 0.02) << "replay " << r;
  }
  EXPECT_NE(masks[0], masks[1]);
  EXPECT_NE(masks[1], masks[2]);
}

// The guide's CNN with SGD (momentum, weight decay) through DistOpt on one GPU: N steps run eagerly, or
// the same N steps with the fourth onwards replayed from one recording. Options vary the step:
// partialUpdate over several chunks (its round robin's position lives on the device, so each replay
// averages the next chunk), or f16 with dynamic loss scaling (the skip of an overflowing step and the
// scale's adjustment decided on the device). Returns the parameters, the chunk partialUpdate would
// average next and the steps the loss scaler skipped.
struct Trained {
  std::vector<Tensor> params;
  int64_t next_chunk = -1, skipped = -1;
  double scale = 0;
};

Trained train_cnn(bool record, int steps, const dist::DistOptOptions& o = {}, bool f16 = false,
                  double weight_decay = 0.0) {
  set_deterministic_algorithms(true);
  nn::ModelConfig mc;
  mc.seed = 3;
  auto model = nn::make_model("cnn", mc);
  model->to(gpu());
  optim::SgdOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  so.weight_decay = weight_decay;
  dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), dist::make_single_communicator(gpu()), o);
  std::unique_ptr<dist::LossScaler> scaler;
  if (f16) {
    dist::LossScalerOptions lo;
    lo.init_scale = 4096;
    lo.growth_interval = 1;  // the scale doubles at every clean step until f16 overflows: skips come often
    scaler = std::make_unique<dist::LossScaler>(opt, lo);
  }
  Generator gen(11);
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < steps; ++i) {
    xs.push_back(Tensor::uniform({32, 1, 28, 28}, 0.0, 1.0, gen).to(gpu()));
    std::vector<int32_t> labels(32);
    for (auto& l : labels) l = static_cast<int32_t>(gen.next_below(10));
    ys.push_back(Tensor::from_vector(labels, {32}).to(gpu()));
  }
  auto step = [&](const Tensor& x, const Tensor& y) {
    PrecisionScope scope(f16 ? Precision::f16 : Precision::f32);
    Tensor loss = softmax_cross_entropy(model->forward(x), y);
    opt.backward_and_sync(scaler ? scaler->scale_loss(loss) : loss);
    if (scaler)
      scaler->update();
    else
      opt.update();
  };
  Tensor sx = xs[0].clone(), sy = ys[0].clone();
  std::unique_ptr<DeviceGraph> graph;
  for (int i = 0; i < steps; ++i) {
    if (!record || i < 3) {
      step(xs[static_cast<size_t>(i)], ys[static_cast<size_t>(i)]);
      continue;
    }
    EXPECT_EQ(opt.replay_blocker(), "");
    sx.copy_(xs[static_cast<size_t>(i)]);
    sy.copy_(ys[static_cast<size_t>(i)]);
    if (!graph) {
      const dist::CommStats before = opt.stats();
      graph = std::make_unique<DeviceGraph>(gpu(), [&] { step(sx, sy); });
      EXPECT_EQ(opt.stats().steps, before.steps + 1);
    } else
      opt.count_replayed_step(dist::CommStats{1, 0, 0, 0, 0.0, 0});
    graph->replay();
  }
  EXPECT_EQ(opt.optimizer().steps(), steps);
  EXPECT_EQ(opt.stats().steps, steps);
  Trained out;
  for (const Tensor& p : model->parameters()) out.params.push_back(p.cpu());
  if (o.sync.method == "partialUpdate") out.next_chunk = opt.partial_chunk();
  if (scaler) {
    out.skipped = scaler->skipped_steps();
    out.scale = scaler->scale();
    EXPECT_EQ(opt.stats().skipped_updates, out.skipped);
  }
  set_deterministic_algorithms(false);
  return out;
}

TEST(CudaGraph, ReplayedTrainingMatchesEagerBitForBit) {
  REQUIRE_GPU();
  const std::vector<Tensor> eager = train_cnn(false, 12, {}, false, 1e-4).params,
                            replayed = train_cnn(true, 12, {}, false, 1e-4).params;
  ASSERT_EQ(eager.size(), replayed.size());
  for (size_t i = 0; i < eager.size(); ++i) expect_same_bytes(eager[i], replayed[i], "parameter " + std::to_string(i));
}

TEST(CudaGraph, ReplayedPartialUpdateStepsCycleThroughTheChunks) {
  REQUIRE_GPU();
  dist::DistOptOptions o;
  o.sync.method = "partialUpdate";
  o.bucket_bytes = 256 << 10;  // the CNN's 431,080 parameters in 7 chunks of 65,536
  const int steps = 12;
  Trained eager = train_cnn(false, steps, o, false), replayed = train_cnn(true, steps, o, false);
  EXPECT_EQ(eager.next_chunk, steps % 7);
  EXPECT_EQ(replayed.next_chunk, steps % 7);  // the recording was made at step 3, its replays moved on
  for (size_t i = 0; i < eager.params.size(); ++i)
    expect_same_bytes(eager.params[i], replayed.params[i], "parameter " + std::to_string(i));
}

TEST(CudaGraph, ReplayedF16StepsSkipOverflowsOnTheDevice) {
  REQUIRE_GPU();
  dist::DistOptOptions o;
  o.skip_nonfinite = true;
  const int steps = 30;
  Trained eager = train_cnn(false, steps, o, true), replayed = train_cnn(true, steps, o, true);
  EXPECT_GT(eager.skipped, 0) << "no step overflowed: the test shows nothing";
  EXPECT_EQ(replayed.skipped, eager.skipped);
  EXPECT_EQ(replayed.scale, eager.scale);
  for (size_t i = 0; i < eager.params.size(); ++i)
    expect_same_bytes(eager.params[i], replayed.params[i], "parameter " + std::to_string(i));
}

// tandem train in f16 records its steps like the other precisions (the skip decision is on the device).
TEST(CudaGraph, F16TrainingIsRecorded) {
  REQUIRE_GPU();
  auto r = test::run_tandem("bench train --device cuda --precision f16 --steps 20 --warmup 5");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"cuda_graph\":true"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("steps run eagerly"), std::string::npos) << r.output;
}

// An MLP with AdamW (decoupled weight decay, two parameter groups) under a warm-up + cosine schedule: N
// steps eagerly, or the fourth onwards replayed from one recording, whose rate and bias corrections the
// optimizer writes on the device before each replay.
std::vector<Tensor> train_adamw(bool record, int steps) {
  set_deterministic_algorithms(true);
  nn::ModelConfig mc;
  mc.seed = 5;
  mc.hidden = {64};
  auto model = nn::make_model("mlp", mc);
  model->to(gpu());
  optim::AdamOptions ao;
  ao.lr = 3e-3;
  ao.weight_decay = 0.1;
  ao.decoupled = true;
  ao.beta2 = 0.95;
  auto adam = std::make_shared<optim::Adam>(optim::decay_groups(*model, 0.1), ao);
  adam->set_schedule(std::make_shared<optim::WarmupCosine>(3e-3, 4, steps, 3e-4));
  dist::DistOpt opt(adam, dist::make_single_communicator(gpu()));
  Generator gen(12);
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < steps; ++i) {
    xs.push_back(Tensor::uniform({16, 1, 28, 28}, 0.0, 1.0, gen).to(gpu()));
    std::vector<int32_t> labels(16);
    for (auto& l : labels) l = static_cast<int32_t>(gen.next_below(10));
    ys.push_back(Tensor::from_vector(labels, {16}).to(gpu()));
  }
  auto step = [&](const Tensor& x, const Tensor& y) {
    opt.backward_and_sync(softmax_cross_entropy(model->forward(x), y));
    opt.update();
  };
  Tensor sx = xs[0].clone(), sy = ys[0].clone();
  std::unique_ptr<DeviceGraph> graph;
  for (int i = 0; i < steps; ++i) {
    if (!record || i < 3) {
      step(xs[static_cast<size_t>(i)], ys[static_cast<size_t>(i)]);
      continue;
    }
    EXPECT_EQ(opt.replay_blocker(), "");
    sx.copy_(xs[static_cast<size_t>(i)]);
    sy.copy_(ys[static_cast<size_t>(i)]);
    if (!graph) {
      graph = std::make_unique<DeviceGraph>(gpu(), [&] { step(sx, sy); });
      adam->after_recording();
    } else {
      adam->prepare_replay();
      opt.count_replayed_step(dist::CommStats{1, 0, 0, 0, 0.0, 0});
    }
    graph->replay();
  }
  EXPECT_EQ(adam->steps(), steps);
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.cpu());
  set_deterministic_algorithms(false);
  return out;
}

TEST(CudaGraph, ReplayedAdamWFollowsItsScheduleBitForBit) {
  REQUIRE_GPU();
  const std::vector<Tensor> eager = train_adamw(false, 12), replayed = train_adamw(true, 12);
  ASSERT_EQ(eager.size(), replayed.size());
  for (size_t i = 0; i < eager.size(); ++i) expect_same_bytes(eager[i], replayed[i], "parameter " + std::to_string(i));
  // A replay that kept the recorded rate would differ: the schedule moves the rate at every step.
  const std::vector<Tensor> fewer = train_adamw(false, 11);
  bool differs = false;
  for (size_t i = 0; i < eager.size(); ++i)
    differs = differs || eager[i].to_vector<float>() != fewer[i].to_vector<float>();
  EXPECT_TRUE(differs);
}

TEST(CudaGraph, AdamAndThresholdStepsSayWhyTheyRunEagerly) {
  REQUIRE_GPU();
  nn::ModelConfig mc;
  auto model = nn::make_model("mlp", mc);
  model->to(gpu());
  dist::DistOpt adam(std::make_shared<optim::Adam>(model->parameters(), optim::AdamOptions{}),
                     dist::make_single_communicator(gpu()));
  EXPECT_NE(adam.replay_blocker().find("adam"), std::string::npos) << adam.replay_blocker();
  dist::DistOptOptions o;
  o.sync.method = "sparseThreshold";
  dist::DistOpt thr(std::make_shared<optim::SGD>(model->parameters(), optim::SgdOptions{}),
                    dist::make_single_communicator(gpu()), o);
  EXPECT_NE(thr.replay_blocker().find("sparseThreshold"), std::string::npos) << thr.replay_blocker();
}

// The CLI: recording is on by default and shows in the result; what cannot be recorded runs eagerly
// and says why, with the same training.
TEST(CudaGraph, BenchRecordsByDefaultAndFallsBackWithAReason) {
  REQUIRE_GPU();
  auto graphed = test::run_tandem("bench train --device cuda --steps 20 --warmup 5");
  ASSERT_EQ(graphed.status, 0) << graphed.output;
  EXPECT_NE(graphed.output.find("\"cuda_graph\":true"), std::string::npos) << graphed.output;
  auto off = test::run_tandem("bench train --device cuda --steps 20 --warmup 5 --cuda-graph off");
  ASSERT_EQ(off.status, 0) << off.output;
  EXPECT_NE(off.output.find("\"cuda_graph\":false"), std::string::npos) << off.output;
  auto thr = test::run_tandem("bench train --device cuda --steps 20 --warmup 5 -d sparseThreshold -s 0.01");
  ASSERT_EQ(thr.status, 0) << thr.output;
  EXPECT_NE(thr.output.find("\"cuda_graph\":false"), std::string::npos) << thr.output;
  EXPECT_NE(thr.output.find("steps run eagerly: sparseThreshold"), std::string::npos) << thr.output;
}

// tandem train with and without recording: the same losses and accuracies (the epoch's last, smaller
// batch runs eagerly beside the replays).
// Trains the CNN twice, recorded and eagerly, with the given evaluation flags; the figures must agree.
void expect_recorded_training_matches_eager(const std::string& eval_flags) {
  const char* env = std::getenv("TANDEM_FASHION_DIR");
  const std::string dir = env ? env : test::kFashionDir;
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "no Fashion-MNIST at " << dir << " (set TANDEM_FASHION_DIR)";
  const std::string args = "train --model cnn --dataset fashion-mnist --data-dir " + dir +
                           " --device cuda --precision f32 --epochs 2 --limit-train 2000 --batch-size 64 "
                           "--progress off --deterministic " + eval_flags;
  auto on = test::run_tandem(args);
  auto off = test::run_tandem(args + " --cuda-graph off");
  ASSERT_EQ(on.status, 0) << on.output;
  ASSERT_EQ(off.status, 0) << off.output;
  // Per epoch: training loss, training accuracy, evaluation accuracy. Two processes may time their
  // way to different convolution algorithms: equal up to rounding, not to the bit.
  auto figures = [](const std::string& out) {
    std::vector<double> v;
    for (const char* key : {"Training loss = ", "training accuracy = ", "Evaluation accuracy = "})
      for (size_t pos = 0; (pos = out.find(key, pos)) != std::string::npos; pos += std::strlen(key))
        v.push_back(std::atof(out.c_str() + pos + std::strlen(key)));
    return v;
  };
  const std::vector<double> a = figures(on.output), b = figures(off.output);
  ASSERT_EQ(a.size(), 6u) << on.output;
  ASSERT_EQ(b.size(), 6u) << off.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], std::max(0.01, 2e-3 * std::fabs(b[i]))) << i;
  EXPECT_EQ(on.output.find("steps run eagerly"), std::string::npos) << on.output;
  EXPECT_EQ(on.output.find("evaluation runs eagerly"), std::string::npos) << on.output;  // it is recorded too
}

TEST(CudaGraph, TrainWithRecordingMatchesEager) {
  REQUIRE_GPU();
  expect_recorded_training_matches_eager("--limit-test 500 --eval-batch-size 64");
}

// The default evaluation batch (4 x 64) needs a larger convolution workspace and more reduction
// counters than the recorded training step: the second epoch's replays still find the buffers they
// were recorded with.
TEST(CudaGraph, EvaluatingAtALargerBatchKeepsTheRecordedStepsBuffers) {
  REQUIRE_GPU();
  expect_recorded_training_matches_eager("--limit-test 1000");
}

}  // namespace
}  // namespace tandem
