// What the subcommands that start ranks share: threads per rank, the device of a rank, and the options
// for recording steps and for how ranks synchronise.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cli/commands.h"
#include "cli/session.h"
#include "tandem/distributed/dist_opt.h"

namespace tandem::cli {
int default_threads_per_rank(int local_size) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_size));
}

int cuda_index_for_rank(int local_rank, const char* visible_devices) {
  // srun --gpus-per-task and similar launchers give each rank one GPU of its own through
  // CUDA_VISIBLE_DEVICES; that GPU is then device 0 of the rank.
  const bool one_visible = visible_devices && *visible_devices && !std::strchr(visible_devices, ',');
  return one_visible ? 0 : local_rank;
}

Device device_for_rank(const std::string& spec, const dist::DistEnv& env) {
  Device device = Device::parse(spec);
  if (device.is_cuda() && spec == "cuda")
    device = Device::cuda(cuda_index_for_rank(env.local_rank, std::getenv("CUDA_VISIBLE_DEVICES")));
  check_device(device);
  return device;
}

CLI::Validator finite_in(double lo, double hi) {
  auto show = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const std::string range = "[" + show(lo) + ", " + show(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& input) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(input, v)) return "'" + input + "' is not a number";
        if (!std::isfinite(v)) return input + " is not a finite number; give one in " + range;
        if (v < lo || v > hi) return input + " is outside " + range;
        return "";
      },
      "FLOAT in " + range);
}

void check_flags_apply(const CLI::App& app, const std::string& model, const std::string& optimizer,
                       const std::string& dist_option) {
  auto given = [&](const char* name) {
    const CLI::Option* o = app.get_option_no_throw(name);
    return o && o->count() > 0;
  };
  TANDEM_CHECK(!given("--hidden") || model == "mlp", "--hidden sets the hidden layers of --model mlp; --model ", model,
               " has none, so it would do nothing: leave it out, or use --model mlp");
  const bool sgd = optimizer == "sgd";
  for (const char* name : {"--beta1", "--beta2"})
    TANDEM_CHECK(!given(name) || !sgd, name, " sets adam and adamw; --optimizer sgd has none, so it would do nothing");
  for (const char* name : {"--momentum", "--nesterov"})
    TANDEM_CHECK(!given(name) || sgd, name, " sets sgd; --optimizer ", optimizer, " has none, so it would do "
                 "nothing (adam and adamw take --beta1 and --beta2)");
  // A sweep over -d with one set of flags is common (benchmarks): the flags a method ignores are warned about.
  const std::string method = dist::parse_sync_method(dist_option);
  const bool sparse = method == "sparseTopK" || method == "sparseThreshold";
  std::vector<std::string> idle;
  if (given("--spars") && !sparse) idle.push_back("-s/--spars (sparseTopK, sparseThreshold)");
  if (given("--half-dtype") && method != "half") idle.push_back("--half-dtype (half)");
  if (given("--no-error-feedback") && !sparse && method != "powerSGD")
    idle.push_back("--no-error-feedback (sparseTopK, sparseThreshold, powerSGD)");
  if (!idle.empty() && dist::detect_env().rank == 0) {
    std::string list;
    for (const std::string& f : idle) list += (list.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "tandem: warning: -d %s ignores %s\n", method.c_str(), list.c_str());
  }
}

void add_cuda_graph_option(CLI::App& app, bool& on) {
  app.add_option_function<std::string>(
         "--cuda-graph", [&on](const std::string& v) { on = v == "on"; },
         "on: after a few eager steps of one batch shape, record the step once (a CUDA graph) and replay it; "
         "steps that cannot be recorded run eagerly, saying why (default on)")
      ->check(CLI::IsMember({"on", "off"}));
}

void add_sync_options(CLI::App& app, SessionConfig& cfg, const std::string& group) {
  app.add_option("-d,--dist-option", cfg.dist_option,
                 "How ranks synchronise: plain (f32 gradients), half (f16 gradients), partialUpdate (local steps, "
                 "one chunk of the parameters averaged per step), sparseTopK, sparseThreshold, powerSGD (low-rank "
                 "gradients)")
      ->group(group)
      ->capture_default_str();
  app.add_option("-s,--spars", cfg.spars,
                 "sparseTopK: fraction of each bucket's gradients sent; sparseThreshold: magnitude threshold")
      ->group(group)
      ->check(finite_in(0.0, 1e30))
      ->capture_default_str();
  app.add_flag("!--no-error-feedback", cfg.error_feedback,
               "Sparse modes and powerSGD: drop what was not sent instead of adding it to the next step's gradient")
      ->group(group);
  app.add_option("--clip", cfg.clip, "half: clip each gradient value into [-clip, clip] before sending (0: off)")
      ->group(group)
      ->check(finite_in(0.0, 1e30));
  app.add_flag("--sync-bn", cfg.sync_bn,
               "Batch-norm statistics over the global batch (every rank's samples) instead of each rank's own")
      ->group(group);
  app.add_option("--rank", cfg.low_rank, "powerSGD: rank of each gradient matrix's approximation (default 2)")
      ->group(group)
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--half-dtype", cfg.half_dtype, "half: the 16-bit type sent, f16 or bf16")
      ->group(group)
      ->check(CLI::IsMember({"f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--shard", cfg.shard,
                 "Sharded state (ZeRO): none; optimizer (each rank keeps the optimizer's state for its 1/N of the "
                 "parameters; same traffic); gradients (and only its 1/N of the averaged gradients); parameters (and only "
                 "its 1/N of the parameters between uses: each layer group, a block of the model, is gathered whole "
                 "for its forward and again for its backward; 1.5 times the traffic). With -d plain or half")
      ->group(group)
      ->check(CLI::IsMember({"none", "optimizer", "gradients", "parameters", "0", "1", "2", "3"}))
      ->capture_default_str();
  app.add_option("--offload", cfg.offload,
                 "optimizer: the optimizer's state and the f32 values it steps (the masters under --master-weights) live "
                 "in host memory and its step runs on the CPU; each step copies this rank's averaged gradients to the "
                 "host and the stepped values back (the state is cut across ranks as --shard optimizer cuts it; steps "
                 "run eagerly). parameters: that, and --shard parameters' slices of the parameters kept in host memory "
                 "between uses too, each layer group's copied to the device as its gather starts (f32 parameters; "
                 "--shard none becomes parameters). none: on the device")
      ->group(group)
      ->check(CLI::IsMember({"none", "optimizer", "parameters"}))
      ->capture_default_str();
  app.add_option("--master-weights", cfg.master_weights,
                 "Mixed-precision master weights: the parameters hold bf16 or f16 values and the optimizer steps f32 "
                 "masters of them, kept (and checkpointed) as its state, sharded with it under --shard; none: the "
                 "parameters are f32")
      ->group(group)
      ->check(CLI::IsMember({"none", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--bucket-mb", cfg.bucket_mb, "Gradient bytes per all-reduce, in MiB")
      ->group(group)
      ->check(finite_in(0.001, 4096.0))
      ->capture_default_str();
  app.add_option("--first-bucket-mb", cfg.first_bucket_mb, "Size of the first (earliest) bucket, in MiB")
      ->group(group)
      ->check(finite_in(0.001, 4096.0))
      ->capture_default_str();
  app.add_flag("--per-rank-optimizer-settings", cfg.per_rank_optimizer_settings,
               "Let --lr, --momentum and --weight-decay differ between ranks (only warned about; the replicas then "
               "drift apart). Without it, ranks started with different values stop at start-up")
      ->group(group);
}

}  // namespace tandem::cli
