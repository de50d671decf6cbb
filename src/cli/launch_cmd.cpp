// `tandem launch`: starts the ranks of a job on this machine, or this machine's share of a job that
// spans several (torchrun's spelling).
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "tandem/distributed/launch.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace {

// Other launchers' flags that users bring along: each gets the message that says what tandem wants.
void reject_foreign_flag(const std::string& flag) {
  if (flag == "-H" || flag == "--host" || flag == "--hosts" || flag == "-hosts" || flag == "--hostfile" ||
      flag == "-hostfile" || flag == "--machinefile" || flag == "-machinefile")
    TANDEM_CHECK(false, "launch: ", flag, " is a host list of mpirun or horovodrun; tandem launch starts the ranks of "
                 "the machine it runs on. Across machines run it on each one: tandem launch --nnodes N --node-rank R "
                 "--master-addr HOST --nproc-per-node K -- CMD (or use mpiexec with your host file)");
  if (flag == "-N" || flag == "--npernode" || flag == "-npernode")
    TANDEM_CHECK(false, "launch: ", flag, " is mpirun's; tandem launch spells it --nproc-per-node K");
  TANDEM_CHECK(false, "launch: unknown option ", flag, " (tandem launch --help lists its options; the program to run "
               "and its own options go after --)");
}

}  // namespace

Runner add_launch_command(CLI::App& app) {
  auto opts = std::make_shared<dist::LaunchOptions>();
  auto nprocs = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start the ranks of a job: N copies of a command on this machine, joined through a rendezvous store that "
      "the launcher hosts; across machines, one launcher on each");
  // Everything from the program's name on is the command, with or without a -- before it; an option
  // this launcher does not know stops the parse, so that the check below can say what it is.
  sub->positionals_at_end();
  sub->prefix_command();
  sub->add_option("-n,--nprocs", *nprocs, "Number of ranks in all (one machine: the processes to start)");
  sub->add_option("--nproc-per-node,--nproc_per_node", opts->nproc_per_node, "Ranks on each machine");
  sub->add_option("--nnodes", opts->nnodes, "Machines, each running one tandem launch (default 1)");
  sub->add_option("--node-rank,--node_rank", opts->node_rank, "This machine's place among them, 0 .. nnodes-1");
  sub->add_option("--master-addr,--master_addr", opts->master_addr,
                  "Address of the machine with --node-rank 0, which hosts the job's store (several machines)");
  sub->add_option("--master-port,--master_port", opts->master_port, "Its port (default 29500)");
  sub->add_option("--job-id,--rdzv-id,--rdzv_id", opts->job_id,
                  "The job's name, the same on every machine, so that two jobs never mix (default: the Slurm job "
                  "and step, or TORCHELASTIC_RUN_ID)");
  sub->add_option("--max-restarts,--max_restarts", opts->max_restarts,
                  "After a rank fails, start every rank again up to this many times (they resume from their "
                  "--checkpoint); default 0");
  sub->add_option("--gpus-per-node", opts->gpus_per_node,
                  "One machine: ranks per node, so a rank's local rank (its GPU index) is rank % G; default N");
  sub->add_option("--timeout", opts->timeout_s,
                  "Seconds a rank waits for the others when joining and in each collective before failing "
                  "(given to the ranks as TANDEM_TIMEOUT; default: the program's own, 300 s)")
      ->check(finite_in(0.0, 1e6));
  sub->add_flag("--oversubscribe", opts->oversubscribe,
               "A CPU job may start more ranks on this machine than 4 per usable core (at least 8 are always "
               "allowed)");
  sub->add_option("command", opts->command, "The program to run and its arguments (best after --)");
  sub->footer(
      "Each rank gets TANDEM_RANK, TANDEM_WORLD_SIZE, TANDEM_LOCAL_RANK, TANDEM_LOCAL_SIZE, TANDEM_STORE_ADDR,\n"
      "TANDEM_JOB_ID, TANDEM_RESTART_COUNT and the job's secret. Rank 0's output is passed through; other ranks'\n"
      "lines are prefixed with [rank N]. If a rank fails, every rank of the job is stopped (on every machine)\n"
      "and the launcher exits with that rank's status, unless --max-restarts allows another attempt.\n"
      "Across machines every launcher names the same failure, the first: a rank killed by a signal is named\n"
      "over ranks that exit with an error status within 2 s of it (they likely failed because it went), and\n"
      "when node 0's launcher (which hosts the store) is gone, the others stop at once and say so.\n"
      "Ctrl-C is forwarded to the ranks, which get 30 s to stop (tandem train stops at its next step boundary,\n"
      "every rank at the same one, saving its --checkpoint); a second Ctrl-C kills them.\n"
      "Before starting anything the launcher refuses more ranks than this machine holds: for a command with\n"
      "--device cuda, more than the GPUs this process sees; for a CPU job, more than 4 per usable core (at least\n"
      "8; --oversubscribe lifts this), or more than the process and open-file limits (ulimit -u, -n) allow.\n\n"
      "Examples:\n"
      "  tandem launch -n 4 -- tandem train --model cnn --dataset mnist --device cuda\n"
      "  tandem launch -n 2 --timeout 60 -- ./my_program --epochs 3\n"
      "  # two machines, two ranks each; run on both (R = 0 on node0, 1 on the other):\n"
      "  TANDEM_SECRET_FILE=~/.tandem-secret tandem launch --nnodes 2 --node-rank R --master-addr node0 \\\n"
      "      --master-port 29500 --nproc-per-node 2 -- tandem train --checkpoint ck.bin --resume");
  return [opts, nprocs, sub] {
    // What the parse left over starts with an option this launcher does not know.
    std::vector<std::string> rest = sub->remaining();
    std::erase(rest, "--");
    if (!rest.empty()) reject_foreign_flag(rest[0]);
    TANDEM_CHECK(nprocs->rfind("p", 0) != 0, "launch: -np is mpirun's spelling; tandem launch takes -n N (or "
                 "--nproc-per-node K, with --nnodes for several machines)");
    if (!nprocs->empty()) {
      try {
        size_t used = 0;
        opts->nprocs = std::stoi(*nprocs, &used);
        TANDEM_CHECK(used == nprocs->size(), "");
      } catch (const std::exception&) {
        TANDEM_CHECK(false, "launch: -n '", *nprocs, "' is not a number of ranks");
      }
      TANDEM_CHECK(opts->nprocs >= 1, "launch: -n must be at least 1, got ", opts->nprocs);
    }
    if (!opts->command.empty() && opts->command[0].size() > 1 && opts->command[0][0] == '-')
      reject_foreign_flag(opts->command[0]);  // after --: still not a program
    if (opts->nnodes > 1 && opts->job_id.empty()) {
      const char* job = std::getenv("SLURM_JOB_ID");
      const char* step = std::getenv("SLURM_STEP_ID");
      const char* run = std::getenv("TORCHELASTIC_RUN_ID");
      if (job && step) opts->job_id = std::string(job) + "." + step;
      else if (run) opts->job_id = run;
    }
    return dist::launch(*opts);
  };
}

}  // namespace tandem::cli
