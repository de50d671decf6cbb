#pragma once
// Test helper: runs a program with a controlled environment, capturing its output (stdout and
// stderr merged), with a deadline after which its whole process group is killed.
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace tandem::test {

struct ProcResult {
  int exit_code = -1;   // -1 when killed by a signal
  int term_signal = 0;  // the signal that killed it, or 0
  bool timed_out = false;
  double seconds = 0;
  std::string output;
};

/// A started program. The environment is this process's, minus every variable a launcher sets
/// (TANDEM_*, RANK, WORLD_SIZE, MASTER_*, OMPI_*, PMI_*, SLURM_*, ...), plus `env`.
class Proc {
 public:
  Proc(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Proc();  // kills the process group when still running
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  pid_t pid() const { return pid_; }
  /// Reads output until `count` occurrences of `needle` were seen or `timeout_s` passed; true when seen.
  bool read_until(const std::string& needle, int count, double timeout_s);
  /// Waits for the exit, reading output; kills the group after timeout_s.
  ProcResult wait(double timeout_s);
  /// The output read so far.
  const std::string& output() const { return out_; }

 private:
  void pump(int timeout_ms);
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  double start_ = 0;
};

/// Runs to completion (or the deadline).
ProcResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                       double timeout_s = 60);

/// True when a program of that name is in PATH.
bool in_path(const std::string& name);
/// A TCP port that was free a moment ago, outside the range the kernel hands out to connections.
int free_port();
/// True while a process with this pid exists (zombies included).
bool process_exists(pid_t pid);

}  // namespace tandem::test
