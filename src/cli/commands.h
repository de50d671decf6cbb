#pragma once
// Internal: the `tandem` executable's subcommands. Each add_* registers its subcommand on the app
// and returns the function that runs it once the command line is parsed (its exit status).
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "tandem/device.h"
#include "tandem/distributed/bootstrap.h"

namespace tandem::cli {

using Runner = std::function<int()>;

Runner add_train_command(CLI::App& app);
Runner add_launch_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_eval_command(CLI::App& app);
Runner add_export_command(CLI::App& app);
Runner add_plot_command(CLI::App& app);
Runner add_data_command(CLI::App& app);
Runner add_generate_command(CLI::App& app);

/// CPU threads for one of local_size ranks on this machine: an equal share of the cores.
int default_threads_per_rank(int local_size);

struct SessionConfig;

/// The check of every floating-point flag: a finite number in [lo, hi]. CLI::Range lets NaN through
/// (each comparison with it is false), and a NaN read as "not positive" would switch a setting off.
CLI::Validator finite_in(double lo, double hi);

/// How ranks synchronise, under `group` in the help: -d/--dist-option, -s/--spars,
/// --no-error-feedback, --clip, --sync-bn, --rank, --half-dtype, --bucket-mb, --first-bucket-mb.
void add_sync_options(CLI::App& app, SessionConfig& cfg, const std::string& group);

/// Refuses flags that would do nothing for the model and optimizer chosen (--hidden without --model mlp,
/// --beta1/--beta2 with sgd, --momentum/--nesterov with adam or adamw), and warns (on rank 0) about the
/// synchronisation flags that the -d option ignores (-s/--spars, --half-dtype, --no-error-feedback).
/// `app` is the subcommand whose options were parsed.
void check_flags_apply(const CLI::App& app, const std::string& model, const std::string& optimizer,
                       const std::string& dist_option);

/// --cuda-graph on|off: whether steps on a GPU are recorded once and replayed (SessionConfig::cuda_graph).
void add_cuda_graph_option(CLI::App& app, bool& on);

/// The device named on the command line, checked; under a launcher, plain "cuda" means this rank's
/// GPU on its node (cuda:local_rank), or cuda:0 when CUDA_VISIBLE_DEVICES names a single GPU.
Device device_for_rank(const std::string& spec, const dist::DistEnv& env);

/// The CUDA device index plain "cuda" means for a rank: its local rank, or 0 when
/// `visible_devices` (CUDA_VISIBLE_DEVICES, may be null) names a single GPU.
int cuda_index_for_rank(int local_rank, const char* visible_devices);

}  // namespace tandem::cli
