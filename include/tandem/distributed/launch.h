#pragma once
// `tandem launch`: starts the ranks of a job on this machine and supervises them. On one machine it
// hosts the job's rendezvous store itself; across machines one launcher runs on each (torchrun's
// spelling: --nnodes, --node-rank, --master-addr, --master-port, --nproc-per-node), node 0's launcher
// hosts the store, and the launchers stop (and with --max-restarts, restart) the job together.
#include <string>
#include <vector>

namespace tandem::dist {

struct LaunchOptions {
  int nprocs = 0;                    // -n: ranks in all (0: nproc_per_node x nnodes)
  int nproc_per_node = 0;            // ranks on each machine (0: nprocs / nnodes)
  int nnodes = 1;                    // machines, each running one launcher
  int node_rank = 0;                 // this machine's place among them
  std::string master_addr;           // node 0's address: the store runs there (several machines)
  int master_port = 29500;           // and its port
  std::string job_id;                // the same on every machine (several machines; default from the
                                     // environment: SLURM_JOB_ID.SLURM_STEP_ID or TORCHELASTIC_RUN_ID)
  int max_restarts = 0;              // after a rank fails, start every rank again this many times
  int gpus_per_node = 0;             // one machine only: local rank = rank % gpus_per_node; 0 means all
  double timeout_s = 0;              // passed to the ranks as TANDEM_TIMEOUT when > 0; bounds the launchers'
                                     // own rendezvous (default 300 s)
  std::vector<std::string> command;  // program and its arguments
  double stop_grace_s = 3;           // after SIGTERM (a failed rank), the rest get this long before SIGKILL
  double interrupt_grace_s = 30;     // after a forwarded SIGINT/SIGTERM, the ranks get this long before SIGKILL
                                     // (tandem train stops at its next step boundary and saves its checkpoint)
  bool oversubscribe = false;        // a CPU job may start more ranks on a machine than 4 per core
};

/// Runs the job and returns the launcher's exit status: 0 when every rank exited with 0; else the status
/// of the first rank that failed (128 + signal when it was killed; across machines, the failure every
/// launcher names), or 128 + signal when the launcher was interrupted. Throws tandem::Error (kind Input)
/// for invalid options, a command that cannot run, or more ranks than this machine holds.
int launch(const LaunchOptions& options);

}  // namespace tandem::dist
