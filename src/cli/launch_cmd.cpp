// `tandem launch`: starts a multi-process job on this machine.
#include <memory>

#include "cli/commands.h"
#include "tandem/distributed/launch.h"

namespace tandem::cli {

Runner add_launch_command(CLI::App& app) {
  auto opts = std::make_shared<dist::LaunchOptions>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start a multi-process job on this machine: N copies of a command, one per rank, joined through a "
      "rendezvous store hosted by the launcher");
  sub->add_option("-n,--nprocs", opts->nprocs, "Number of processes (ranks) to start, at least 1")->required();
  sub->add_option("--gpus-per-node", opts->gpus_per_node,
                  "Ranks per node: a rank's local rank (its GPU index) is rank % G; default N");
  sub->add_option("--timeout", opts->timeout_s,
                  "Seconds a rank waits for the others when joining and in each collective before failing "
                  "(given to the ranks as TANDEM_TIMEOUT; default: the program's own, 300 s)");
  sub->add_option("command", opts->command, "The program to run and its arguments (after --)");
  sub->footer(
      "Each rank gets TANDEM_RANK, TANDEM_WORLD_SIZE, TANDEM_LOCAL_RANK, TANDEM_LOCAL_SIZE and TANDEM_STORE_ADDR.\n"
      "Rank 0's output is passed through; other ranks' lines are prefixed with [rank N].\n"
      "If a rank fails, the others are stopped and the launcher exits with that rank's status.\n"
      "Ctrl-C is forwarded to the ranks; a second Ctrl-C kills them.\n\n"
      "Example:\n"
      "  tandem launch -n 4 -- tandem train --model cnn --dataset mnist --device cuda\n"
      "  tandem launch -n 2 --timeout 60 -- ./my_program --epochs 3");
  return [opts] { return dist::launch(*opts); };
}

}  // namespace tandem::cli
