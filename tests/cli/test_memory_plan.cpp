// The memory plan's parts against the library they describe: its parameters are the models' (names, shapes,
// order), its state between steps is what DistOpt keeps (measured through the CPU allocator, every --shard on one
// rank), a recompute policy maps to the activations it keeps, and the table, the budget and the flags that fit
// say what they should. MemoryPlanCli.* measure whole steps against the plan.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "cli/memory_plan.h"
#include "cli/session.h"
#include "tandem/device.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/ops.h"
#include "text_util.h"

using namespace tandem;
using namespace tandem::cli;

namespace {

nn::GptConfig tiny_gpt() {
  nn::GptConfig g;
  g.layers = 2, g.heads = 4, g.width = 64, g.context = 32, g.vocab = 200;
  return g;
}

nn::LlamaConfig tiny_llama() {
  nn::LlamaConfig l;
  l.layers = 2, l.width = 64, l.heads = 4, l.kv_heads = 2, l.mlp_hidden = 96, l.vocab = 150, l.context = 32;
  l.rope_scaling = {};
  return l;
}

MemoryPlanSettings gpt_settings(const nn::GptConfig& g, int64_t batch) {
  MemoryPlanSettings s;
  s.model = "gpt";
  s.gpt = g;
  s.batch = batch;
  s.context = g.context;
  return s;
}

MemoryPlanSettings llama_settings(const nn::LlamaConfig& l, int64_t batch) {
  MemoryPlanSettings s;
  s.model = "llama";
  s.llama = l;
  s.batch = batch;
  s.context = l.context;
  return s;
}

// "name [a, b]" lines of a parameter list.
std::string listing(const std::vector<std::pair<std::string, Shape>>& ps) {
  std::ostringstream o;
  for (const auto& [name, shape] : ps) o << name << " " << shape_str(shape) << "\n";
  return o.str();
}

std::string planned_listing(const MemoryPlanSettings& s) {
  std::vector<std::pair<std::string, Shape>> v;
  for (const PlannedParam& p : planned_parameters(s)) v.push_back({p.name, p.shape});
  return listing(v);
}

std::string model_listing(nn::Module& m) {
  std::vector<std::pair<std::string, Shape>> v;
  for (const auto& [name, t] : m.named_parameters()) v.push_back({name, t.shape()});
  return listing(v);
}

}  // namespace

TEST(MemoryPlan, ItsParametersAreTheModels) {
  for (bool bias : {true, false}) {
    nn::GptConfig g = tiny_gpt();
    g.bias = bias;
    nn::GPT model(g);
    EXPECT_EQ(planned_listing(gpt_settings(g, 1)), model_listing(model)) << "bias " << bias;
  }
  for (int variant = 0; variant < 3; ++variant) {
    nn::LlamaConfig l = tiny_llama();
    l.tied = variant != 1;
    l.attention_bias = variant == 2;
    l.mlp_bias = variant == 2;
    nn::Llama model(l);
    EXPECT_EQ(planned_listing(llama_settings(l, 1)), model_listing(model)) << "variant " << variant;
  }
}

// What a rank keeps between steps, measured: the model built, DistOpt around AdamW as the tandem program makes
// them (released gradients), three steps taken; in use after the last against the plan's figure.
TEST(MemoryPlan, StateBetweenStepsIsWhatDistOptKeeps) {
  for (const char* shard : {"none", "optimizer", "gradients", "parameters"}) {
    for (bool llama : {false, true}) {
      SessionConfig cfg;
      cfg.model = llama ? "llama" : "gpt";
      cfg.optimizer = "adamw";
      cfg.shard = shard;
      cfg.threads = 1;
      MemoryPlanSettings ps = llama ? llama_settings(tiny_llama(), 2) : gpt_settings(tiny_gpt(), 2);
      const size_t start = memory_stats(Device::cpu()).in_use;
      int64_t measured = 0;
      {
        Session s(cfg);
        const MemoryPlanSettings from = s.memory_plan_settings();
        ps.world = from.world;
        ps.shard = from.shard;
        ps.bucket_bytes = from.bucket_bytes;
        ps.first_bucket_bytes = from.first_bucket_bytes;
        ps.release_gradients = from.release_gradients;
        nn::ModelConfig mc;
        if (llama) mc.llama = ps.llama; else mc.gpt = ps.gpt;
        s.build_model(mc);
        s.sync_model();
        Generator gen(3);
        std::vector<int32_t> tok(static_cast<size_t>(ps.batch * ps.context));
        for (auto& t : tok) t = static_cast<int32_t>(gen.next_below(100));
        const Tensor x = Tensor::from_vector(tok, {ps.batch, ps.context});
        const Tensor y = Tensor::from_vector(tok, {ps.batch, ps.context});
        for (int i = 0; i < 3; ++i) s.train_step(x, y);
        // The session's own small tensors and the batch are in the plan's figure as well.
        measured = static_cast<int64_t>(memory_stats(Device::cpu()).in_use - start);
      }
      const MemoryPlan plan = plan_memory(ps);
      EXPECT_NEAR(static_cast<double>(plan.between_steps), static_cast<double>(measured), 0.01 * measured + 8192)
          << cfg.model << " --shard " << shard;
    }
  }
}

TEST(MemoryPlan, ARecomputePolicyMapsToTheActivationsItKeeps) {
  EXPECT_EQ(nn::parse_recompute("none"), RecomputePolicy::none);
  EXPECT_EQ(nn::parse_recompute("full"), RecomputePolicy::full);
  EXPECT_EQ(nn::parse_recompute("selective"), RecomputePolicy::selective);
  EXPECT_STREQ(nn::recompute_name(RecomputePolicy::full), "full");
  EXPECT_THROW(nn::parse_recompute("some"), Error);
  for (bool llama : {false, true}) {
    MemoryPlanSettings s = llama ? llama_settings(tiny_llama(), 4) : gpt_settings(tiny_gpt(), 4);
    const MemoryPlan none = plan_memory(s);
    s.recompute = RecomputePolicy::full;
    const MemoryPlan full = plan_memory(s);
    // Full recompute keeps each block's input and the head's tensors: the stream [B, T, width] in f32 per block
    // and the final norm's input, beside the loss's two gradients (of its input and of the output weight).
    const int64_t width = 64, n = 4 * 32, vocab = llama ? 150 : 200, layers = 2;
    const int64_t stream = n * width * 4;
    const int64_t head = stream + (llama ? 1 : 2) * n * 4 + n * width * 4 + vocab * width * 4 + 512;
    EXPECT_EQ(full.activations, layers * stream + head) << (llama ? "llama" : "gpt");
    EXPECT_GT(none.activations, 3 * full.activations) << (llama ? "llama" : "gpt");
    EXPECT_LT(full.peak, none.peak);
    EXPECT_EQ(full.between_steps, none.between_steps);
    // Selective keeps none's tensors less each block's two norm outputs (f32 [B T, width] here) and, in a Llama,
    // its SwiGLU output (f32 [B T, mlp_hidden]).
    s.recompute = RecomputePolicy::selective;
    const MemoryPlan selective = plan_memory(s);
    const int64_t freed = 2 * stream + (llama ? n * 96 * 4 : 0);
    EXPECT_EQ(selective.activations, none.activations - layers * freed) << (llama ? "llama" : "gpt");
    EXPECT_LT(selective.peak, none.peak);
    EXPECT_GT(selective.peak, full.peak);
  }
}

// --offload optimizer: the step is sharded (each rank its slices, as --shard optimizer plans it) and the optimizer's
// state leaves the device for the host, with the slices' values and gradients (f32 each): on a GPU the device's
// figures drop by the state, the host's rise by the state and two slices; on the CPU (the host is the device) the
// state stays in the count. The table says where the optimizer went.
TEST(MemoryPlan, OffloadMovesTheOptimizersStateToTheHost) {
  for (bool cuda : {false, true}) {
    MemoryPlanSettings s = llama_settings(tiny_llama(), 4);
    if (cuda) {
      s.device = Device::cuda(0);
      s.precision = Precision::bf16;
    }
    s.shard = dist::Shard::optimizer;
    const MemoryPlan sharded = plan_memory(s);
    s.shard = dist::Shard::none;
    s.offload_optimizer = true;
    const MemoryPlan off = plan_memory(s);
    const std::string what = cuda ? "cuda" : "cpu";
    ASSERT_GT(sharded.optimizer_state, 0) << what;
    EXPECT_EQ(off.optimizer_state, 0) << what;
    EXPECT_EQ(off.host_state, 2 * sharded.optimizer_state) << what << ": AdamW's two moments and two slices";
    if (cuda) {
      EXPECT_EQ(off.between_steps, sharded.between_steps - sharded.optimizer_state) << what;
      EXPECT_GE(off.host, off.host_state) << what;
      EXPECT_LT(off.peak, sharded.peak) << what;
    } else {
      EXPECT_EQ(off.between_steps, sharded.between_steps - sharded.optimizer_state + off.host_state) << what;
    }
    const std::string table = memory_table(off, s, 0, what);
    EXPECT_NE(table.find("on the host"), std::string::npos) << table;
    if (cuda) EXPECT_NE(table.find("the offloaded optimizer's"), std::string::npos) << table;
  }
}

// On a GPU, a run that fits only with its state on the host is offered the offload that fits: the optimizer's, or
// where that is not enough the parameters' slices too (with full recompute when that is needed as well).
TEST(MemoryPlan, OffloadIsOfferedWhereOnlyItFits) {
  MemoryPlanSettings s = llama_settings(tiny_llama(), 4);
  s.device = Device::cuda(0);
  s.precision = Precision::bf16;
  auto peak_with = [&](bool optimizer, bool parameters, bool full) {
    MemoryPlanSettings c = s;
    c.offload_optimizer = optimizer;
    c.offload_parameters = parameters;
    if (full) c.recompute = RecomputePolicy::full;
    return plan_memory(c).peak;
  };
  const int64_t opt_full = peak_with(true, false, true), params_full = peak_with(true, true, true);
  ASSERT_LT(params_full, opt_full);
  // Between the two: only the parameters' offload (with recompute) fits.
  const int64_t budget = (opt_full + params_full) / 2;
  bool offered = false;
  for (const std::string& f : fitting_flags(s, budget, true)) {
    if (!tandem::test::contains(f, "--offload")) continue;
    offered = true;
    EXPECT_TRUE(tandem::test::contains(f, "--offload parameters")) << f;
  }
  EXPECT_TRUE(offered);
  // Where the optimizer's offload fits, it is the one offered.
  bool optimizer = false;
  for (const std::string& f : fitting_flags(s, peak_with(true, false, false), true))
    optimizer = optimizer || f == "--offload optimizer";
  EXPECT_TRUE(optimizer);
}

TEST(MemoryPlan, TheTableIsAFewLinesWithThePeakAndWhereItIs) {
  MemoryPlanSettings s = gpt_settings(tiny_gpt(), 4);
  const MemoryPlan p = plan_memory(s);
  const std::string t = memory_table(p, s, int64_t(8) << 30, "cpu");
  std::istringstream in(t);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) EXPECT_EQ(line.rfind("tandem: ", 0), 0u) << line;
  EXPECT_EQ(lines, 3) << t;
  const std::vector<std::string> parts = {"weights", "gradients",     "optimizer",        "activations",
                                          "workspace", "peak",         "8.00 GiB",         "4 x 32 tokens",
                                          "--recompute none", p.peak_at, format_bytes(p.peak)};
  for (const std::string& part : parts)
    EXPECT_TRUE(tandem::test::contains(t, part)) << part << " not in\n" << t;
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 << 20), "3.0 MiB");
}

TEST(MemoryPlan, TheFlagsOfferedFitTheBudget) {
  MemoryPlanSettings s = gpt_settings(tiny_gpt(), 8);
  const MemoryPlan none = plan_memory(s);
  MemoryPlanSettings r = s;
  r.recompute = RecomputePolicy::full;
  const int64_t full_peak = plan_memory(r).peak;
  ASSERT_LT(full_peak, none.peak);
  // Between the two peaks: recompute fits, and so does a smaller micro-batch (the step's tokens kept).
  const int64_t budget = (full_peak + none.peak) / 2;
  const std::vector<std::string> flags = fitting_flags(s, budget, true);
  ASSERT_FALSE(flags.empty());
  EXPECT_EQ(flags.front(), "--recompute full");
  bool batch = false;
  for (const std::string& f : flags)
    if (f.rfind("--batch-size ", 0) == 0) {
      batch = true;
      EXPECT_TRUE(tandem::test::contains(f, "--total-batch-tokens " + std::to_string(8 * 32))) << f;
      MemoryPlanSettings c = s;
      c.batch = std::stoll(f.substr(13));
      c.accumulate = 8 / c.batch;
      EXPECT_LE(plan_memory(c).peak, budget) << f;
    }
  EXPECT_TRUE(batch);
  // More ranks under --shard parameters, where nothing on one rank fits.
  const std::vector<std::string> sharded = fitting_flags(s, plan_memory(r).between_steps, true);
  for (const std::string& f : sharded) EXPECT_TRUE(tandem::test::contains(f, "ranks")) << f;
  // Nothing fits a budget below what building the model holds.
  EXPECT_TRUE(fitting_flags(s, 1024, true).empty());
}

TEST(MemoryPlan, TheBudgetIsTheLimitGivenOrWhatTheHostHas) {
  ::setenv("TANDEM_MEMORY_LIMIT_MIB", "12.5", 1);
  EXPECT_EQ(usable_memory(Device::cpu(), 1), int64_t(25) << 19);
  ::setenv("TANDEM_MEMORY_LIMIT_MIB", "lots", 1);
  EXPECT_THROW(usable_memory(Device::cpu(), 1), Error);
  ::unsetenv("TANDEM_MEMORY_LIMIT_MIB");
  const DeviceMemory m = device_memory(Device::cpu());
  ASSERT_GT(m.free, 0u);
  EXPECT_GE(m.total + memory_stats(Device::cpu()).cached, m.free);
  // Two ranks on the host share it.
  EXPECT_LT(usable_memory(Device::cpu(), 2), usable_memory(Device::cpu(), 1));
}
