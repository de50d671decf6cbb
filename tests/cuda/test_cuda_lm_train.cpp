// Language-model training on a GPU, through the `tandem` program: the windows drawn there are the
// CPU's (the first step's loss agrees in f32), bf16 is the default, and a recorded step at a constant
// rate ends where eager steps end.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"
#include "tandem/checkpoint.h"
#include "tandem/device.h"
#include "text_util.h"

namespace fs = std::filesystem;
using tandem::test::make_corpus;
using tandem::test::run_tandem;

namespace {

#define REQUIRE_GPU() \
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_lm_gpu_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using tandem::test::contains;

using tandem::test::step_losses;

std::vector<float> table_of(const std::string& checkpoint) {
  for (auto& [name, t] : tandem::read_checkpoint_tensors(checkpoint))
    if (name == "param/table.weight") return t.to_vector<float>();
  ADD_FAILURE() << "no param/table.weight in " << checkpoint;
  return {};
}

// `run` (ending in --checkpoint) with recorded steps, then with --cuda-graph off; the largest difference
// between the two trained tables.
struct RecordedAndEager {
  tandem::test::RunResult recorded, eager;
  double table_diff = 1e30;
};
RecordedAndEager run_recorded_and_eager(const std::string& run, const fs::path& dir) {
  RecordedAndEager r;
  r.recorded = run_tandem(run + (dir / "recorded.ck").string());
  EXPECT_EQ(r.recorded.status, 0) << r.recorded.output;
  EXPECT_FALSE(contains(r.recorded.output, "steps run eagerly")) << r.recorded.output;
  r.eager = run_tandem(run + (dir / "eager.ck").string() + " --cuda-graph off");
  EXPECT_EQ(r.eager.status, 0) << r.eager.output;
  if (r.recorded.status != 0 || r.eager.status != 0) return r;
  const std::vector<float> a = table_of((dir / "recorded.ck").string()), b = table_of((dir / "eager.ck").string());
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return r;
  r.table_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) r.table_diff = std::max(r.table_diff, std::fabs(double(a[i]) - b[i]));
  return r;
}

}  // namespace

TEST(CudaLmTrain, TheGpuDrawsTheCpusWindowsAndTrainsInBf16ByDefault) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("windows"), corpus = make_corpus(dir);
  const std::string run = "train --model bigram --data " + corpus.string() + " --steps 20 --context 64 --lr 0.1 " +
                          "--eval-every 0 --eval-steps 4 --seed 3 ";
  auto cpu = run_tandem(run + "--device cpu --threads 2");
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  auto f32 = run_tandem(run + "--device cuda --precision f32");
  ASSERT_EQ(f32.status, 0) << f32.output;
  const auto lc = step_losses(cpu.output), lg = step_losses(f32.output);
  ASSERT_EQ(lc.size(), 20u);
  ASSERT_EQ(lg.size(), 20u);
  EXPECT_NEAR(lc.at(1), lg.at(1), 1e-3);    // the same windows, the same initial table
  EXPECT_NEAR(lc.at(20), lg.at(20), 2e-2);  // and the same training, up to rounding
  auto bf16 = run_tandem(run + "--device cuda");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "cuda:0, bf16")) << bf16.output;
  // AdamW's recorded steps read the scheduled rate on the device: nothing runs eagerly.
  EXPECT_FALSE(contains(bf16.output, "steps run eagerly")) << bf16.output;
  const auto lb = step_losses(bf16.output);
  ASSERT_EQ(lb.size(), 20u);
  EXPECT_LT(lb.at(20), lb.at(1) - 1.0) << bf16.output;
  fs::remove_all(dir);
}

TEST(CudaLmTrain, RecordedStepsAtAConstantRateEndWhereEagerStepsEnd) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("recorded"), corpus = make_corpus(dir);
  const std::string run = "train --model bigram --data " + corpus.string() + " --steps 12 --context 64 --device cuda " +
                          "--precision f32 --optimizer sgd --lr 1 --momentum 0.9 --weight-decay 0 --min-lr 1 " +
                          "--eval-every 0 --eval-steps 2 --checkpoint ";
  RecordedAndEager r = run_recorded_and_eager(run, dir);
  EXPECT_LT(r.table_diff, 1e-5);
  fs::remove_all(dir);
}

// AdamW under warm-up and cosine decay: recorded steps (the rate and bias corrections written on the
// device before each replay) end where eager ones end.
TEST(CudaLmTrain, RecordedAdamWStepsFollowTheScheduleAsEagerStepsDo) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("adamw"), corpus = make_corpus(dir);
  const std::string run = "train --model bigram --data " + corpus.string() + " --steps 16 --context 64 --device cuda " +
                          "--precision f32 --lr 0.05 --warmup 4 --min-lr 0.005 --eval-every 0 --eval-steps 2 " +
                          "--deterministic --checkpoint ";
  RecordedAndEager r = run_recorded_and_eager(run, dir);
  EXPECT_LT(r.table_diff, 1e-5);
  const auto& recorded = r.recorded;
  const auto& eager = r.eager;
  double moved = 0;
  // The losses of the two runs agree step by step as well.
  const auto la = step_losses(recorded.output), lb = step_losses(eager.output);
  ASSERT_EQ(la.size(), 16u);
  ASSERT_EQ(lb.size(), 16u);
  for (auto& [k, v] : la) moved = std::max(moved, std::fabs(v - lb.at(k)));
  EXPECT_LT(moved, 1e-4);
  fs::remove_all(dir);
}

// bf16 products read the 16-bit copies AdamW writes with the weights, or (--shard optimizer) that the sharded
// step writes after its gather (the default), or convert the weights at every step (TANDEM_PARAM_COPIES=0): the
// same bits, with clipping folded into the step as well.
TEST(CudaLmTrain, ParameterCopiesGiveTheBitsOfConvertingAtEveryStep) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("copies"), corpus = make_corpus(dir);
  for (const std::string shard : {"none", "optimizer"}) {
    const std::string run = "train --model gpt --gpt-config char --layers 2 --heads 2 --width 64 --context 64 "
                            "--dropout 0 --data " + corpus.string() + " --steps 12 --batch-size 4 --device cuda "
                            "--clip-norm 0.5 --lr 3e-3 --warmup 2 --deterministic --eval-every 0 --eval-steps 2 "
                            "--shard " + shard + " --checkpoint ";
    auto with = run_tandem(run + (dir / ("copies_" + shard + ".ck")).string());
    ASSERT_EQ(with.status, 0) << with.output;
    if (shard == "none") {
      EXPECT_FALSE(contains(with.output, "steps run eagerly")) << with.output;
    }
    setenv("TANDEM_PARAM_COPIES", "0", 1);
    auto without = run_tandem(run + (dir / ("converted_" + shard + ".ck")).string());
    unsetenv("TANDEM_PARAM_COPIES");
    ASSERT_EQ(without.status, 0) << without.output;
    EXPECT_EQ(step_losses(with.output), step_losses(without.output)) << "--shard " << shard;
    auto a = tandem::read_checkpoint_tensors((dir / ("copies_" + shard + ".ck")).string());
    auto b = tandem::read_checkpoint_tensors((dir / ("converted_" + shard + ".ck")).string());
    ASSERT_EQ(a.size(), b.size());
    int params = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      if (a[i].first.rfind("param/", 0) != 0) continue;
      ++params;
      EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first << " --shard " << shard;
    }
    EXPECT_GT(params, 10);
  }
  fs::remove_all(dir);
}

using Checkpoint = std::vector<std::pair<std::string, tandem::Tensor>>;

// `run` (ending in --checkpoint) of `steps` steps, recorded and then with --cuda-graph off, each into
// dir/{recorded,eager}_<tag>.ck: both succeed, the first records its steps, the losses agree step by step within
// 1e-4; returns the two checkpoints (empty ones after a failure).
std::pair<Checkpoint, Checkpoint> recorded_and_eager_checkpoints(const std::string& run, const fs::path& dir,
                                                                 const std::string& tag, size_t steps) {
  const std::string rec = (dir / ("recorded_" + tag + ".ck")).string(), eag = (dir / ("eager_" + tag + ".ck")).string();
  auto recorded = run_tandem(run + rec);
  EXPECT_EQ(recorded.status, 0) << recorded.output;
  EXPECT_FALSE(contains(recorded.output, "steps run eagerly")) << recorded.output;
  auto eager = run_tandem(run + eag + " --cuda-graph off");
  EXPECT_EQ(eager.status, 0) << eager.output;
  if (recorded.status != 0 || eager.status != 0) return {};
  const auto la = step_losses(recorded.output), lb = step_losses(eager.output);
  EXPECT_EQ(la.size(), steps) << tag;
  EXPECT_EQ(lb.size(), steps) << tag;
  double loss_diff = 0;
  for (auto& [k, v] : la)
    if (lb.count(k)) loss_diff = std::max(loss_diff, std::fabs(v - lb.at(k)));
  EXPECT_LT(loss_diff, 1e-4) << tag;
  return {tandem::read_checkpoint_tensors(rec), tandem::read_checkpoint_tensors(eag)};
}

// Sharded steps (--shard optimizer and gradients, one GPU) are recorded and replayed like unsharded ones: the
// slices' AdamW reads its scheduled rate on the device, and the run ends where the same run taken eagerly
// (--cuda-graph off) ends.
TEST(CudaLmTrain, RecordedShardedStepsEndWhereEagerStepsEnd) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("shardrec"), corpus = make_corpus(dir);
  for (const std::string shard : {"optimizer", "gradients"}) {
    const std::string run = "train --model gpt --gpt-config char --layers 2 --heads 2 --width 64 --context 64 "
                            "--dropout 0 --data " + corpus.string() + " --steps 14 --batch-size 4 --device cuda "
                            "--clip-norm 0.5 --lr 3e-3 --warmup 3 --min-lr 3e-4 --deterministic --eval-every 0 "
                            "--eval-steps 2 --shard " + shard + " --checkpoint ";
    const auto [a, b] = recorded_and_eager_checkpoints(run, dir, shard, 14);
    ASSERT_EQ(a.size(), b.size());
    double param_diff = 0;
    int params = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      if (a[i].first.rfind("param/", 0) != 0) continue;
      ++params;
      const std::vector<float> x = a[i].second.to_vector<float>(), y = b[i].second.to_vector<float>();
      ASSERT_EQ(x.size(), y.size());
      for (size_t j = 0; j < x.size(); ++j) param_diff = std::max(param_diff, std::fabs(double(x[j]) - y[j]));
    }
    EXPECT_GT(params, 10);
    EXPECT_LT(param_diff, 1e-5) << "--shard " << shard;
  }
  fs::remove_all(dir);
}

// Master weights on the GPU (--master-weights bf16, unsharded and --shard optimizer): the steps are recorded and
// end where the same run taken eagerly ends (the f32 masters within 1e-5), the parameters hold bf16 values and
// the checkpoint one master per parameter.
TEST(CudaLmTrain, MasterWeightsStepsAreRecordedAndKeepBf16Parameters) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("masters"), corpus = make_corpus(dir);
  for (const std::string shard : {"none", "optimizer"}) {
    const std::string run = "train --model gpt --gpt-config char --layers 2 --heads 2 --width 64 --context 64 "
                            "--dropout 0 --data " + corpus.string() + " --steps 12 --batch-size 4 --device cuda "
                            "--clip-norm 0.5 --lr 3e-3 --warmup 3 --deterministic --eval-every 0 --eval-steps 2 "
                            "--master-weights bf16 --shard " + shard + " --checkpoint ";
    const auto [a, b] = recorded_and_eager_checkpoints(run, dir, shard, 12);
    ASSERT_EQ(a.size(), b.size());
    double master_diff = 0;
    int params = 0, masters = 0, unrounded = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      if (a[i].first.rfind("param/", 0) == 0) {
        ++params;
        const std::vector<float> x = a[i].second.to_vector<float>();
        const std::vector<float> r = a[i].second.to(tandem::DType::bf16).to(tandem::DType::f32).to_vector<float>();
        for (size_t j = 0; j < x.size(); ++j) unrounded += x[j] != r[j];
      } else if (a[i].first.rfind("opt/master/", 0) == 0) {
        ++masters;
        const std::vector<float> x = a[i].second.to_vector<float>(), y = b[i].second.to_vector<float>();
        ASSERT_EQ(x.size(), y.size());
        for (size_t j = 0; j < x.size(); ++j) master_diff = std::max(master_diff, std::fabs(double(x[j]) - y[j]));
      }
    }
    EXPECT_GT(params, 10);
    EXPECT_EQ(masters, params) << "--shard " << shard;
    EXPECT_EQ(unrounded, 0) << "parameter values that are not bf16 ones, --shard " << shard;
    EXPECT_LT(master_diff, 1e-5) << "--shard " << shard;
  }
  fs::remove_all(dir);
}

// The product name the peak table reads (tests/cli checks the table itself).
TEST(CudaLmTrain, DeviceNameIsTheDriversProductName) {
  REQUIRE_GPU();
  const std::string name = tandem::device_name(tandem::Device::cuda(0));
  EXPECT_FALSE(name.empty());
  EXPECT_NE(name, "cpu");
  EXPECT_EQ(tandem::device_name(tandem::Device::cpu()), "cpu");
}

// Checkpoints change nothing in a sharded run of recorded steps: the state gathered for a checkpoint is only
// read, never taken back into the slices by a later step (which would set them back to the state of that
// checkpoint, the replays since being host-free). A run saving every 10 steps ends in the bits of the same
// run saving only at its end, for --shard optimizer and gradients; and so does the image trainer, whose
// epochs end in a smaller batch taken eagerly after the replays.
TEST(CudaLmTrain, CheckpointsDoNotChangeAShardedRecordedRun) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("shardck"), corpus = make_corpus(dir);
  for (const std::string shard : {"optimizer", "gradients"}) {
    const std::string run = "train --model gpt --gpt-config char --layers 2 --heads 2 --width 64 --context 64 "
                            "--dropout 0 --data " + corpus.string() + " --steps 45 --batch-size 4 --device cuda "
                            "--lr 3e-3 --warmup 3 --deterministic --eval-every 0 --eval-steps 2 --shard " + shard;
    const std::string often = (dir / ("often_" + shard + ".ck")).string(), once = (dir / ("once_" + shard + ".ck")).string();
    auto a = run_tandem(run + " --checkpoint-every 10 --checkpoint " + often);
    ASSERT_EQ(a.status, 0) << a.output;
    EXPECT_FALSE(contains(a.output, "steps run eagerly")) << a.output;
    auto b = run_tandem(run + " --checkpoint " + once);
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_EQ(step_losses(a.output), step_losses(b.output)) << "--shard " << shard;
    auto ta = tandem::read_checkpoint_tensors(often), tb = tandem::read_checkpoint_tensors(once);
    ASSERT_EQ(ta.size(), tb.size());
    for (size_t i = 0; i < ta.size(); ++i) {
      ASSERT_EQ(ta[i].first, tb[i].first);
      EXPECT_EQ(ta[i].second.to_vector<float>(), tb[i].second.to_vector<float>()) << ta[i].first << " --shard " << shard;
    }
  }
  if (tandem::test::have_fashion_mnist()) {
    // 1000 samples in batches of 64: 15 recorded steps and a last batch of 40, taken eagerly, each epoch.
    const std::string run = "train --model cnn --epochs 3 --limit-train 1000 --limit-test 200 --batch-size 64 "
                            "--optimizer adamw --lr 1e-3 --device cuda --deterministic --progress off --shard optimizer";
    auto a = run_tandem(run + " --checkpoint " + (dir / "cnn.ck").string());
    auto b = run_tandem(run);
    ASSERT_EQ(a.status, 0) << a.output;
    ASSERT_EQ(b.status, 0) << b.output;
    std::regex re(R"(Training loss = ([0-9.eE+-]+))");
    std::vector<std::string> la, lb;
    for (auto it = std::sregex_iterator(a.output.begin(), a.output.end(), re); it != std::sregex_iterator(); ++it) la.push_back((*it)[1]);
    for (auto it = std::sregex_iterator(b.output.begin(), b.output.end(), re); it != std::sregex_iterator(); ++it) lb.push_back((*it)[1]);
    EXPECT_EQ(la.size(), 3u) << a.output;
    EXPECT_EQ(la, lb) << a.output << b.output;
  }
  fs::remove_all(dir);
}

// One GPU: --shard optimizer and gradients take the step --shard none takes. Where they seem to part (the
// final validation loss 1e-3 away), two runs of --shard none part as much: the atomics in the token table's
// gradient and in cuDNN's attention backward add in a different order each run. With --deterministic
// (neither uses atomics) the three stages end in the same bits: losses, parameters and the optimizer's
// state; without it they stay within the run-to-run spread bounded below.
TEST(CudaLmTrain, ShardStagesTakeTheUnshardedStepOnOneGpu) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("shardbits"), corpus = make_corpus(dir);
  const std::string run = "train --model gpt --gpt-config char --layers 2 --heads 4 --width 128 --context 128 "
                          "--data " + corpus.string() + " --steps 120 --batch-size 16 --device cuda --seed 1 "
                          "--eval-every 0 --eval-steps 4 --checkpoint ";
  auto params_of = [](const std::string& ck) {
    std::map<std::string, std::vector<float>> m;
    for (auto& [name, t] : tandem::read_checkpoint_tensors(ck))
      if (name.rfind("param/", 0) == 0 || name.rfind("opt/", 0) == 0) m[name] = t.to_vector<float>();
    return m;
  };
  std::map<std::string, std::map<int, double>> losses;
  std::map<std::string, double> val;
  std::map<std::string, std::map<std::string, std::vector<float>>> params;
  for (const std::string mode : {"det", "default"}) {
    for (const std::string shard : {"none", "optimizer", "gradients"}) {
      const std::string key = mode + "-" + shard, ck = (dir / (key + ".ck")).string();
      auto r = run_tandem(run + ck + " --shard " + shard + (mode == "det" ? " --deterministic" : ""));
      ASSERT_EQ(r.status, 0) << r.output;
      losses[key] = step_losses(r.output);
      val[key] = tandem::test::final_validation_loss(r.output);
      ASSERT_TRUE(std::isfinite(val[key])) << r.output;
      params[key] = params_of(ck);
    }
  }
  for (const std::string shard : {"optimizer", "gradients"}) {
    EXPECT_FALSE(losses["det-none"].empty());
    EXPECT_EQ(losses["det-" + shard], losses["det-none"]) << "--shard " << shard;
    EXPECT_EQ(val["det-" + shard], val["det-none"]) << "--shard " << shard;
    ASSERT_EQ(params["det-" + shard].size(), params["det-none"].size());
    for (auto& [name, v] : params["det-none"])
      EXPECT_EQ(params["det-" + shard][name], v) << name << " --shard " << shard;
    // Without --deterministic: the run-to-run spread of the atomics, not a different step.
    EXPECT_NEAR(val["default-" + shard], val["default-none"], 0.02) << "--shard " << shard;
  }
  EXPECT_NEAR(val["default-none"], val["det-none"], 0.02);
  fs::remove_all(dir);
}

// --recompute full and selective on the GPU, recorded steps (the recompute is inside the graph) and eager: under --deterministic
// the GPT (with dropout: the second run replays its masks) and the Llama take the steps of --recompute none bit
// for bit.
TEST(CudaLmTrain, RecomputeTakesTheStepsOfNone) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("recompute"), corpus = make_corpus(dir);
  for (const std::string model : {"gpt --gpt-config char --dropout 0.1", "llama --kv-heads 2"}) {
    for (const std::string graph : {"", " --cuda-graph off"}) {
      const std::string run = "train --model " + model + " --layers 2 --heads 4 --width 128 --context 128 --data " +
                              corpus.string() + " --vocab 256 --steps 60 --batch-size 8 --device cuda --seed 1 "
                              "--eval-every 0 --eval-steps 4 --deterministic" + graph + " --checkpoint ";
      const std::string a_ck = (dir / "none.ck").string(), b_ck = (dir / "again.ck").string();
      auto a = run_tandem(run + a_ck);
      for (const std::string policy : {"full", "selective"}) {
      auto b = run_tandem(run + b_ck + " --recompute " + policy);
      ASSERT_EQ(a.status, 0) << a.output;
      ASSERT_EQ(b.status, 0) << b.output;
      if (graph.empty()) {
        EXPECT_FALSE(contains(b.output, "steps run eagerly")) << b.output;
      }
      const auto la = step_losses(a.output), lb = step_losses(b.output);
      ASSERT_FALSE(la.empty()) << a.output;
      EXPECT_EQ(lb, la) << model << graph;
      EXPECT_EQ(tandem::test::final_validation_loss(b.output), tandem::test::final_validation_loss(a.output))
          << model << graph;
      std::map<std::string, std::vector<float>> pa, pb;
      for (auto& [name, t] : tandem::read_checkpoint_tensors(a_ck)) pa[name] = t.to_vector<float>();
      for (auto& [name, t] : tandem::read_checkpoint_tensors(b_ck)) pb[name] = t.to_vector<float>();
      ASSERT_EQ(pa.size(), pb.size());
      for (auto& [name, v] : pa)
        if (name.rfind("param/", 0) == 0) {
          EXPECT_EQ(pb[name], v) << name << " " << model << graph << " " << policy;
        }
      }
    }
  }
  fs::remove_all(dir);
}

// --offload optimizer on the GPU: the host's AdamW steps the run the device's steps, within the rounding of the two
// implementations (the CPU's loop against the GPU's fused kernel), with f32 parameters and bf16 master weights.
TEST(CudaLmTrain, OffloadedOptimizerFollowsTheDevicesSteps) {
  REQUIRE_GPU();
  const fs::path dir = temp_dir("offload"), corpus = make_corpus(dir);
  for (const std::string extra : {"", " --master-weights bf16"}) {
    const std::string run = "train --model llama --kv-heads 2 --layers 2 --heads 4 --width 128 --context 128 --data " +
                            corpus.string() + " --vocab 256 --steps 60 --batch-size 8 --device cuda --seed 1 "
                            "--eval-every 0 --eval-steps 4 --clip-norm 1" + extra;
    auto a = run_tandem(run), b = run_tandem(run + " --offload optimizer");
    ASSERT_EQ(a.status, 0) << a.output;
    ASSERT_EQ(b.status, 0) << b.output;
    const auto la = step_losses(a.output), lb = step_losses(b.output);
    ASSERT_FALSE(la.empty()) << a.output;
    ASSERT_EQ(la.size(), lb.size()) << b.output;
    for (const auto& [step, loss] : la) EXPECT_NEAR(lb.at(step), loss, 0.01 * loss) << "step " << step << extra;
    const double va = tandem::test::final_validation_loss(a.output), vb = tandem::test::final_validation_loss(b.output);
    ASSERT_TRUE(std::isfinite(vb)) << b.output;
    EXPECT_NEAR(vb, va, 0.01 * va) << extra;
  }
  fs::remove_all(dir);
}
