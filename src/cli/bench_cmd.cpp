// `tandem bench`: training-step throughput on synthetic data, and the all-reduce sweep.
#include <chrono>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/bench_allreduce.h"
#include "cli/commands.h"
#include "cli/lm_report.h"
#include "cli/lm_trainer.h"
#include "cli/session.h"
#include "tandem/nn/models.h"
#include "tandem/precision.h"
#include "tandem/random.h"

namespace tandem::cli {

namespace {

struct TrainBenchConfig : SessionConfig {
  int64_t batch_size = 64;
  int steps = 300;
  int warmup = 20;
  int64_t channels = 1, height = 28, width = 28, classes = 10;
  bool profile = false;  // mark the timed steps for a profiler
  bool plan_only = false;  // language models: print the memory plan and its RESULT, build nothing
  LmTrainConfig lm;      // language models: the shape (gpt_config, layers, heads, width, context, vocab)
};

// A language model's benchmark takes bench/gpt2_peer.py's settings where no flag says otherwise: 32
// sequences of the model's context, 30 timed steps after 10, bf16 on a GPU, AdamW (0.9, 0.95) at 6e-4 with
// weight decay 0.1 and the gradients' norm clipped to 1.
constexpr int64_t kLmBenchBatch = 32;
constexpr int kLmBenchSteps = 30, kLmBenchWarmup = 10;

// Sum of the absolute parameter values: to verify that training steps really changed them.
double param_checksum(nn::Module& m) {
  double s = 0;
  for (const Tensor& p : m.parameters())
    for (float v : p.to_vector<float>()) s += std::fabs(static_cast<double>(v));
  return s;
}

// The same of a session's model, whose parameters --shard parameters keeps in blocks between steps: gathered
// whole for the sum (every rank takes part), and freed again.
double param_checksum(Session& s) {
  s.opt().gather_parameters();
  const double sum = param_checksum(s.model());
  s.opt().release_parameters(/*keep=*/false);
  return sum;
}

// The planned figures beside the measured ones in a RESULT.
nlohmann::json plan_json(const MemoryPlan& p) {
  return {{"weights", p.weights},
          {"weight_copies", p.weight_copies},
          {"master_weights", p.master_weights},
          {"gradients", p.gradients},
          {"optimizer_state", p.optimizer_state},
          {"between_steps", p.between_steps},
          {"activations", p.activations},
          {"workspace", p.workspace},
          {"peak", p.peak},
          {"peak_at", p.peak_at}};
}

// What DistOpt keeps per rank (its memory report) and the --shard it ran with.
void add_memory(nlohmann::json& j, Session& s) {
  const dist::MemoryReport m = s.opt().memory_report();
  j["shard"] = dist::shard_name(s.opt().options().shard);
  j["state_bytes_per_rank"] = {{"parameters", m.parameters},
                               {"gradients", m.gradients},
                               {"optimizer_state", m.optimizer_state},
                               {"host", m.host},
                               {"master_weights", m.master_weights},
                               {"total", m.total()}};
}

int run_train_bench(const TrainBenchConfig& cfg) {
  Session s(cfg);
  nn::ModelConfig mc;
  mc.in_channels = cfg.channels;
  mc.height = cfg.height;
  mc.width = cfg.width;
  mc.num_classes = cfg.classes;
  s.build_model(mc);
  apply_recompute(s, cfg.lm.recompute);
  std::vector<dist::AgreementField> fields = s.agreement_fields();
  fields.push_back({"--recompute", cfg.lm.recompute});
  fields.push_back({"--batch-size", std::to_string(cfg.batch_size)});
  fields.push_back({"--steps", std::to_string(cfg.steps)});
  fields.push_back({"--warmup", std::to_string(cfg.warmup)});
  fields.push_back({"input shape (--image, --channels, --classes)", std::to_string(cfg.channels) + "x" +
                                                                       std::to_string(cfg.height) + "x" +
                                                                       std::to_string(cfg.width) + ", " +
                                                                       std::to_string(cfg.classes) + " classes"});
  dist::check_agreement(fields);
  s.sync_model();

  // Synthetic data, different on every rank, as in the PyTorch peer script.
  Generator gen(1234 + static_cast<uint64_t>(s.rank()));
  Tensor x = Tensor::normal({cfg.batch_size, cfg.channels, cfg.height, cfg.width}, 0.0, 1.0, gen, DType::f32,
                            s.device());
  std::vector<int32_t> labels(static_cast<size_t>(cfg.batch_size));
  for (auto& l : labels) l = static_cast<int32_t>(gen.next_below(static_cast<uint64_t>(cfg.classes)));
  Tensor y = Tensor::from_vector(labels, {cfg.batch_size}, s.device());

  double before = param_checksum(s.model());
  for (int i = 0; i < cfg.warmup; ++i) s.train_step(x, y);
  synchronize(s.device());
  s.comm().barrier();
  s.opt().reset_stats();
  reset_peak_memory(s.device());
  if (cfg.profile) profile_range(s.device(), true);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < cfg.steps; ++i) s.train_step(x, y);
  synchronize(s.device());
  if (cfg.profile) profile_range(s.device(), false);
  s.comm().barrier();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double after = param_checksum(s.model());
  TANDEM_RUNTIME_CHECK(std::isfinite(after) && after != before,
                       "benchmark steps did not change the parameters: the measurement would be meaningless");
  const dist::CommStats& st = s.opt().stats();
  if (s.lead()) {
    nlohmann::json j{{"system", "tandem"},
                     {"model", cfg.model},
                     {"device", s.device().str()},
                     {"world", s.world()},
                     {"batch_per_rank", cfg.batch_size},
                     {"dist_option", s.sync().method},
                     {"precision", precision_name(s.precision())},
                     {"steps", cfg.steps},
                     {"parameters", s.model().num_parameters()},
                     {"images_per_s", std::round(cfg.batch_size * s.world() * cfg.steps / dt)},
                     {"ms_per_step", dt / cfg.steps * 1e3},
                     {"bytes_sent_per_step", st.bytes_sent / std::max<int64_t>(st.steps, 1)},
                     {"comm_wait_s_per_step", st.wait_seconds / std::max<int64_t>(st.steps, 1)},
                     {"cuda_graph", s.replays() > 0},
                     {"recompute", cfg.lm.recompute},
                     {"params_changed", true}};
    add_memory(j, s);
    if (s.device().is_cpu()) j["threads"] = num_threads();
    if (s.device().is_cuda()) {
      // Tensors held at once, as torch.cuda.max_memory_allocated counts them: the device allocator's peak
      // since the warm-up plus the recorded step's own (its memory is kept apart); and what the
      // recordings reserve in all (their tensors' blocks, which replays reuse).
      const MemoryStats m = memory_stats(s.device());
      j["peak_memory_mib"] = std::round(static_cast<double>(m.peak_in_use + m.graphs_peak_in_use) / 1048576.0);
      j["recorded_reserved_mib"] = std::round(static_cast<double>(m.graphs) / 1048576.0);
    }
    std::printf("RESULT %s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

// Training steps of a language model on random tokens (different on every rank), as bench/gpt2_peer.py
// times them: tokens/s, ms per step, the achieved FLOP/s and MFU from the model's FLOPs per token, and
// the peak memory.
int run_lm_train_bench(const TrainBenchConfig& cfg) {
  Session s(cfg);
  const bool llama = cfg.model == "llama";
  nn::GptConfig shape;
  nn::LlamaConfig lshape;
  nn::ModelConfig mc;
  if (llama) {
    lshape = lm_llama_shape(cfg.lm, -1, LmDataSpecs{});
    mc.llama = lshape;
    shape.context = lshape.context;
    shape.vocab = lshape.vocab;
  } else {
    shape = lm_model_shape(cfg.lm, -1);
    mc.gpt = shape;
  }
  const int64_t T = shape.context, B = cfg.batch_size;
  // The memory plan, before anything of the model is allocated.
  MemoryPlan plan;
  const bool planned = llama || cfg.model == "gpt";
  if (planned) {
    MemoryPlanSettings ps = s.memory_plan_settings();
    ps.model = cfg.model;
    if (llama) ps.llama = lshape; else ps.gpt = shape;
    ps.batch = B;
    ps.context = T;
    ps.recompute = nn::parse_recompute(cfg.lm.recompute);
    if (cfg.plan_only) {
      plan = s.plan_memory_or_refuse(ps, false, /*check=*/false);
      const int64_t budget = s.memory_budget();
      if (s.lead()) {
        nlohmann::json j{{"system", "tandem"},
                         {"model", cfg.model},
                         {"device", s.device().str()},
                         {"world", s.world()},
                         {"batch_per_rank", B},
                         {"context", T},
                         {"precision", precision_name(s.precision())},
                         {"recompute", cfg.lm.recompute},
                         {"shard", cfg.shard},
                         {"parameters", llama ? nn::llama_num_parameters(lshape) : nn::gpt_num_parameters(shape)},
                         {"planned", plan_json(plan)},
                         {"planned_peak_bytes", plan.peak},
                         {"planned_peak_mib", std::round(static_cast<double>(plan.peak) / 1048576.0 * 10) / 10},
                         {"available_bytes", budget},
                         {"fits", budget == 0 || plan.peak <= budget}};
        if (llama) j["llama"] = nlohmann::json::parse(nn::llama_config_to_json(lshape));
        else j["gpt"] = gpt_shape_json(shape);
        std::printf("RESULT %s\n", j.dump().c_str());
        std::fflush(stdout);
      }
      return 0;
    }
    plan = s.plan_memory_or_refuse(ps, /*total_batch_tokens=*/false);
  } else {
    TANDEM_CHECK(!cfg.plan_only, "--plan-only plans --model gpt or llama");
  }
  s.build_model(mc);
  apply_recompute(s, cfg.lm.recompute);
  std::vector<dist::AgreementField> fields = s.agreement_fields();
  fields.push_back({"--recompute", cfg.lm.recompute});
  fields.push_back({"--batch-size", std::to_string(B)});
  fields.push_back({"--steps", std::to_string(cfg.steps)});
  fields.push_back({"--warmup", std::to_string(cfg.warmup)});
  fields.push_back({"model shape (--gpt-config / --llama-config, --layers, --heads, --width, --context, --vocab)",
                    llama ? nn::llama_config_to_json(lshape) : gpt_shape_json(shape).dump()});
  dist::check_agreement(fields);
  s.sync_model();

  // Tokens below GPT-2's 50257 (the peer's range), or the vocabulary when it is smaller.
  Generator gen(1234 + static_cast<uint64_t>(s.rank()));
  const uint64_t range = static_cast<uint64_t>(std::min<int64_t>(shape.vocab, 50257));
  auto tokens = [&] {
    std::vector<int32_t> v(static_cast<size_t>(B * T));
    for (auto& t : v) t = static_cast<int32_t>(gen.next_below(range));
    return Tensor::from_vector(v, {B, T}, s.device());
  };
  Tensor x = tokens(), y = tokens();

  double before = param_checksum(s);
  StepResult r;
  for (int i = 0; i < cfg.warmup; ++i) r = s.train_step(x, y);
  synchronize(s.device());
  s.comm().barrier();
  s.opt().reset_stats();
  reset_peak_memory(s.device());
  if (cfg.profile) profile_range(s.device(), true);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < cfg.steps; ++i) r = s.train_step(x, y);
  synchronize(s.device());
  if (cfg.profile) profile_range(s.device(), false);
  s.comm().barrier();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MemoryStats measured = memory_stats(s.device());  // before the checksum gathers anything
  const double loss = r.loss.item<double>();
  double after = param_checksum(s);
  TANDEM_RUNTIME_CHECK(std::isfinite(after) && after != before && std::isfinite(loss),
                       "benchmark steps did not change the parameters (or the loss is not finite): the measurement "
                       "would be meaningless");
  if (!s.lead()) return 0;
  const double tokens_per_s = static_cast<double>(B * T * s.world() * cfg.steps) / dt;
  const double fpt = s.model().flops_per_token(T);
  const double peak = peak_flops(device_name(s.device()), s.precision());
  const dist::CommStats& st = s.opt().stats();
  nlohmann::json j{{"system", "tandem"},
                   {"model", cfg.model},
                   {"device", s.device().str()},
                   {"device_name", device_name(s.device())},
                   {"world", s.world()},
                   {"batch_per_rank", B},
                   {"context", T},
                   {"vocab", shape.vocab},
                   {"dist_option", s.sync().method},
                   {"precision", precision_name(s.precision())},
                   {"optimizer", cfg.optimizer},
                   {"recompute", cfg.lm.recompute},
                   {"offload", dist::offload_name(s.opt().options())},
                   {"steps", cfg.steps},
                   {"warmup", cfg.warmup},
                   {"parameters", s.model().num_parameters()},
                   {"tokens_per_s", std::round(tokens_per_s)},
                   {"ms_per_step", dt / cfg.steps * 1e3},
                   {"flops_per_token", fpt},
                   {"loss", loss},
                   {"bytes_sent_per_step", st.bytes_sent / std::max<int64_t>(st.steps, 1)},
                   {"cuda_graph", s.replays() > 0},
                   {"params_changed", true}};
  add_memory(j, s);
  if (cfg.model == "gpt") j["gpt"] = gpt_shape_json(shape);
  if (llama) j["llama"] = nlohmann::json::parse(nn::llama_config_to_json(lshape));
  if (fpt > 0) j["tflops"] = tokens_per_s / s.world() * fpt / 1e12;  // achieved, per device
  if (const double m = mfu(tokens_per_s / s.world(), fpt, peak); m > 0) j["mfu"] = m;
  if (s.device().is_cpu()) j["threads"] = num_threads();
  // Tensors held at once over the timed steps (the recorded step's own counted), beside the plan's peak.
  const int64_t peak_bytes = static_cast<int64_t>(measured.peak_in_use + measured.graphs_peak_in_use);
  j["peak_memory_mib"] = std::round(static_cast<double>(peak_bytes) / 1048576.0);
  j["peak_memory_bytes"] = peak_bytes;
  if (planned) {
    j["recompute"] = cfg.lm.recompute;
    j["planned"] = plan_json(plan);
    j["planned_peak_bytes"] = plan.peak;
    j["planned_peak_mib"] = std::round(static_cast<double>(plan.peak) / 1048576.0 * 10) / 10;
  }
  std::printf("RESULT %s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: training throughput, all-reduce bandwidth");
  bench->require_subcommand(1);

  auto tc = std::make_shared<TrainBenchConfig>();
  CLI::App* train = bench->add_subcommand("train", "Time full training steps (forward, backward, update) on "
                                                   "synthetic data; prints RESULT {json}");
  train->add_option("--model", tc->model,
                    "cnn, mlp or resnet18/34/50/101/152, or a language model (bigram, gpt) on random tokens")
      ->check(CLI::IsMember(nn::model_names()))
      ->capture_default_str();
  train->add_option("-b,--batch-size", tc->batch_size,
                    "Samples per step per rank (language models: sequences, default " + std::to_string(kLmBenchBatch) +
                        ")")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  train->add_option("--steps", tc->steps,
                    "Timed steps (language models: default " + std::to_string(kLmBenchSteps) + ")")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  train->add_option("--warmup", tc->warmup,
                    "Untimed steps first (language models: default " + std::to_string(kLmBenchWarmup) + ")")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  const char* lmg = "Language models (--model bigram, gpt or llama)";
  // Language models' and ResNets' alike.
  train->add_option("--recompute", tc->lm.recompute, "gpt, llama, resnet*: activation recompute, none, selective (gpt, "
                    "llama: norm and activation outputs made again in backward) or full (every transformer block, "
                    "or a ResNet's residual block, run again)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  std::vector<CLI::Option*> lm_only = {
      train->add_option("--gpt-config", tc->lm.gpt_config, "gpt: gpt2 (124M), gpt2-medium (350M) or char")
          ->check(CLI::IsMember(nn::gpt_config_names()))
          ->capture_default_str(),
      train->add_option("--llama-config", tc->lm.llama_config, "llama: llama-1b, llama-3b or llama-8b (context 2048)")
          ->check(CLI::IsMember(nn::llama_config_names()))
          ->capture_default_str(),
      train->add_option("--kv-heads", tc->lm.kv_heads, "llama: key-value heads (default: the configuration's)")
          ->check(CLI::Range(int64_t{1}, int64_t{4096})),
      train->add_option("--mlp-hidden", tc->lm.mlp_hidden, "llama: the MLP's hidden width (default: the configuration's)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 22)),
      train->add_flag("--untied", tc->lm.untied, "llama: an output layer of its own"),
      train->add_flag("--no-memory-check", [tc](int64_t) { tc->memory_check = false; },
                      "gpt, llama: run even when the memory plan printed at start says the step does not fit the "
                      "device (TANDEM_MEMORY_LIMIT_MIB=N plans for N MiB instead of its free memory; docs/memory.md)"),
      train->add_flag("--plan-only", tc->plan_only,
                      "gpt, llama: print the memory plan and a RESULT of its figures (\"fits\": whether it fits the "
                      "device) without building the model (bench/max_model.sh asks it)"),
      train->add_option("--layers", tc->lm.layers, "gpt: transformer blocks (default: the configuration's)")
          ->check(CLI::Range(int64_t{1}, int64_t{4096})),
      train->add_option("--heads", tc->lm.heads, "gpt: attention heads (default: the configuration's)")
          ->check(CLI::Range(int64_t{1}, int64_t{4096})),
      train->add_option("--width", tc->lm.width, "gpt: the embedding width (default: the configuration's)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 20)),
      train->add_option("--dropout", tc->lm.dropout, "gpt: dropout (default: the configuration's)")
          ->check(finite_in(0.0, 0.999)),
      train->add_option("--context", tc->lm.context, "Tokens per sequence (default: the model's; bigram 256)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 20)),
      train->add_option("--vocab", tc->lm.vocab, "Vocabulary (default: gpt, llama, the configuration's; bigram 256)")
          ->check(CLI::Range(int64_t{2}, int64_t{1} << 24)),
  };
  for (CLI::Option* o : lm_only) o->group(lmg);
  train->add_option("--device", tc->device, "cpu, cuda or cuda:N")->capture_default_str();
  train->add_option("--hidden", tc->hidden, "mlp hidden sizes")->delimiter(',');
  train->add_option("--image", tc->height, "Input height and width")->check(CLI::Range(int64_t{16}, int64_t{4096}))
      ->each([tc](const std::string& v) { tc->width = std::stoll(v); });
  train->add_option("--channels", tc->channels, "Input channels")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  train->add_option("--classes", tc->classes, "Classes")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  train->add_option("--threads", tc->threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 4096));
  train->add_option("--precision", tc->precision,
                    "f32 (exact), tf32, bf16 or f16 (mixed precision); default tf32 on CUDA, f32 on the CPU")
      ->check(CLI::IsMember({"f32", "tf32", "bf16", "f16"}));
  add_cuda_graph_option(*train, tc->cuda_graph);
  add_sync_options(*train, *tc, "Distributed (under tandem launch, mpiexec or torchrun)");
  train->add_flag("--profile", tc->profile,
                  "Record only the timed steps under a profiler started with --profile-from-start off (ncu)");

  auto ac = std::make_shared<AllReduceBenchConfig>();
  CLI::App* ar = bench->add_subcommand("allreduce", "All-reduce sweep through tandem's communicator, with a "
                                                    "correctness check at every size (and raw NCCL beside it)");
  add_allreduce_options(*ar, *ac);

  return [bench, train, tc, ac, lm_only] {
    if (train->parsed()) {
      if (!nn::is_language_model(tc->model)) {
        for (CLI::Option* o : lm_only)
          TANDEM_CHECK(o->count() == 0, o->get_name(), " is for language models (--model bigram, gpt)");
        check_flags_apply(*train, tc->model, tc->optimizer, tc->dist_option);
        return run_train_bench(*tc);
      }
      for (const char* name : {"--image", "--channels", "--classes", "--hidden"})
        TANDEM_CHECK(train->get_option(name)->count() == 0, name, " is for image models; --model ", tc->model,
                     " is a language model (it takes --context, --vocab and, for gpt, --gpt-config)");
      if (tc->model == "bigram")
        for (const char* name : {"--gpt-config", "--layers", "--heads", "--width", "--dropout"})
          TANDEM_CHECK(train->get_option(name)->count() == 0, name, " shapes --model gpt; bigram is one vocab x vocab ",
                       "table (it takes --vocab and --context)");
      TrainBenchConfig c = *tc;
      auto given = [train](const char* name) { return train->get_option(name)->count() > 0; };
      if (!given("--batch-size")) c.batch_size = kLmBenchBatch;
      if (!given("--steps")) c.steps = kLmBenchSteps;
      if (!given("--warmup")) c.warmup = kLmBenchWarmup;
      if (c.precision.empty() && Device::parse(c.device).is_cuda()) c.precision = "bf16";
      const LmTrainConfig d;
      c.optimizer = d.optimizer;
      c.lr = d.lr;
      c.beta1 = d.beta1;
      c.beta2 = d.beta2;
      c.weight_decay = d.weight_decay;
      c.clip_norm = d.clip_norm;
      c.lm.model = c.model;
      check_flags_apply(*train, c.model, c.optimizer, c.dist_option);
      return run_lm_train_bench(c);
    }
    return run_allreduce_bench(*ac);
  };
}

}  // namespace tandem::cli
