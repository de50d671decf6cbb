#pragma once
// `tandem launch`: starts the processes of a single-node job and supervises them.
#include <string>
#include <vector>

namespace tandem::dist {

struct LaunchOptions {
  int nprocs = 1;                    // processes (ranks) to start
  int gpus_per_node = 0;             // ranks per node: local rank = rank % gpus_per_node; 0 means nprocs
  double timeout_s = 0;              // passed to the ranks as TANDEM_TIMEOUT when > 0
  std::vector<std::string> command;  // program and its arguments
  double stop_grace_s = 3;           // after SIGTERM (a failed rank), the rest get this long before SIGKILL
  double interrupt_grace_s = 5;      // after a forwarded SIGINT/SIGTERM, the ranks get this long before SIGKILL
};

/// Runs the job and returns the launcher's exit status: 0 when every rank exited with 0; else the status
/// of the first rank that failed (128 + signal when it was killed), or 128 + signal when the launcher
/// was interrupted. Throws tandem::Error (kind Input) for invalid options or a command that cannot run.
int launch(const LaunchOptions& options);

}  // namespace tandem::dist
