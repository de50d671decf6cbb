// DistOpt with the optimizer offloaded to the host (offload_optimizer): the host's step gives the parameters
// of the step on the device bit for bit (f32 and bf16 master weights, every --shard stage on one rank, with
// clipping, accumulation and a layer that every other step leaves out); the device then keeps no optimizer
// state; and checkpoints of offloaded runs resume where the uninterrupted run ends, with or without offload.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tandem/autograd.h"
#include "tandem/checkpoint.h"
#include "tandem/device.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem {
namespace {

struct Stack : nn::Module {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  std::shared_ptr<nn::Linear> side;
  Stack(int64_t width, int depth) {
    Generator gen(7);
    for (int i = 0; i < depth; ++i)
      layers.push_back(register_module("l" + std::to_string(i), std::make_shared<nn::Linear>(width, width, gen)));
    side = register_module("side", std::make_shared<nn::Linear>(width, width, gen));
  }
  Tensor forward_step(const Tensor& x, bool use_side) {
    Tensor h = x;
    for (auto& l : layers) h = tanh(l->forward(h));
    if (use_side) h = add(h, side->forward(x));
    return mean(mul(h, h));
  }
  Tensor forward(const Tensor& x) override { return forward_step(x, false); }
};

Tensor batch(int step) {
  Generator gen(100 + static_cast<uint64_t>(step));
  return Tensor::normal({8, 24}, 0.0, 1.0, gen);
}

struct Setting {
  bool offload = false;
  dist::Shard shard = dist::Shard::none;
  DType master = DType::f32;
};

struct Trainee {
  Stack net{24, 3};
  std::shared_ptr<optim::Adam> adam;
  std::unique_ptr<dist::DistOpt> opt;
  explicit Trainee(const Setting& s, bool sync = true) {
    adam = std::make_shared<optim::Adam>(net.parameters(),
                                         optim::AdamOptions{.lr = 3e-3, .weight_decay = 0.1, .decoupled = true});
    dist::DistOptOptions o;
    o.offload_optimizer = s.offload;
    o.shard = s.shard;
    o.master_weights = s.master;
    o.bucket_bytes = size_t(4) << 10;  // several buckets
    o.first_bucket_bytes = size_t(2) << 10;
    opt = std::make_unique<dist::DistOpt>(adam, dist::make_single_communicator(), o);
    if (sync) opt->sync_parameters(net);
  }
  void steps(int from, int to) {
    for (int s = from; s < to; ++s) {
      {
        auto local = opt->no_sync();
        opt->backward_and_sync(net.forward_step(batch(2 * s), s % 2 == 1));
      }
      opt->backward_and_sync(net.forward_step(batch(2 * s + 1), s % 2 == 1));
      opt->clip_grad_norm_in_update(0.05);  // small: it clips
      opt->update();
    }
  }
  std::vector<std::vector<float>> values() {
    std::vector<std::vector<float>> out;
    for (const Tensor& p : net.parameters()) out.push_back(p.to_vector<float>());
    return out;
  }
};

std::string name_of(const Setting& s) {
  return std::string(s.offload ? "offload" : "device") + " shard " + dist::shard_name(s.shard) + " " +
         dtype_name(s.master);
}

}  // namespace

TEST(OffloadOptimizer, TheHostStepGivesTheDevicesParameters) {
  for (DType master : {DType::f32, DType::bf16}) {
    Trainee device(Setting{false, dist::Shard::none, master});
    device.steps(0, 6);
    const auto want = device.values();
    for (dist::Shard shard : {dist::Shard::none, dist::Shard::optimizer, dist::Shard::gradients}) {
      const Setting s{true, shard, master};
      Trainee off(s);
      off.steps(0, 6);
      EXPECT_EQ(off.values(), want) << name_of(s);
      const dist::MemoryReport r = off.opt->memory_report();
      EXPECT_EQ(r.optimizer_state, 0) << name_of(s);
      EXPECT_EQ(r.master_weights, 0) << name_of(s);
      int64_t n = 0;
      for (const Tensor& p : off.net.parameters()) n += p.numel();
      // The host: the values and gradients of every slice and Adam's two moments.
      EXPECT_GE(r.host, 4 * n * static_cast<int64_t>(sizeof(float))) << name_of(s);
      EXPECT_EQ(off.opt->options().shard, shard == dist::Shard::none ? dist::Shard::optimizer : shard);
      EXPECT_FALSE(off.opt->replay_blocker().empty());
    }
  }
}

TEST(OffloadOptimizer, CheckpointsResumeWithAndWithoutOffload) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_offload_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (DType master : {DType::f32, DType::bf16}) {
    Trainee whole(Setting{false, dist::Shard::none, master});
    whole.steps(0, 6);
    const auto want = whole.values();
    for (bool save_offloaded : {true, false}) {
      const std::string ck = (dir / "run.ck").string();
      {
        Trainee first(Setting{save_offloaded, dist::Shard::optimizer, master});
        first.steps(0, 3);
        first.opt->gather_optimizer_state();
        save_checkpoint(ck, first.net, &first.opt->optimizer(), "{}");
        first.opt->release_optimizer_state();
        first.steps(3, 6);  // a checkpoint changes nothing in the run that wrote it
        EXPECT_EQ(first.values(), want) << "saved, offload " << save_offloaded << " " << dtype_name(master);
      }
      for (bool load_offloaded : {true, false}) {
        Trainee again(Setting{load_offloaded, dist::Shard::optimizer, master}, /*sync=*/false);
        load_checkpoint(ck, again.net, &again.opt->optimizer());
        again.opt->sync_parameters(again.net);
        again.steps(3, 6);
        EXPECT_EQ(again.values(), want) << "saved with offload " << save_offloaded << ", resumed with offload "
                                        << load_offloaded << ", " << dtype_name(master);
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace tandem
