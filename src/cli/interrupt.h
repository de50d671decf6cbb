#pragma once
// Internal: Ctrl-C (SIGINT) and SIGTERM during `tandem train`. The first signal asks the run to stop at
// its next step boundary, where every rank stops together and --checkpoint is saved; a second one ends
// the process at once (the signal's default action), saving nothing.
#include <string>

#include "tandem/device.h"
#include "tandem/distributed/communicator.h"

namespace tandem::cli {

/// Installs the handlers of SIGINT and SIGTERM for its lifetime (the earlier ones come back after).
/// On the first signal the process that reports (`lead`) says at once what happens next: `plan`, e.g.
/// "saving the checkpoint 'ck' there".
class InterruptScope {
 public:
  InterruptScope(bool lead, const std::string& plan);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  /// The first signal this process received while a scope was installed; 0 while none.
  static int received();
};

/// Whether the job stops at a step boundary, decided alike on every rank. At each boundary every rank
/// all-reduces which signals it received (two i32 counts on the communicator's device) and reads the
/// sums of the previous boundary's all-reduce, which are done by then on a device that runs a step ahead
/// of the host: every rank reads the same sums at the same boundary, one step after the signal, and no
/// step waits for the device. The check is made by the host between steps, outside any recorded one.
/// One rank: its own signal, at once, without a collective. Once a stop is agreed it stays agreed.
class StopAgreement {
 public:
  StopAgreement(dist::Communicator& comm, Device device);
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  /// Every rank calls it at every step boundary: the signal that stops the job here (SIGINT when any
  /// rank got one, else SIGTERM), or 0.
  int at_boundary();
  /// At a boundary where the job waits anyway (the end of an epoch): the agreement of this moment,
  /// without the lag.
  int now();
  /// Completes the outstanding all-reduce (every rank, at the same point) before the run goes on.
  void finish();

 private:
  int reduce_counts(int sigint, int sigterm);  // blocking

  dist::Communicator& comm_;
  Device device_;
  Tensor flags_;         // the counts posted at the last boundary
  dist::WorkPtr pending_;  // their all-reduce
  int agreed_ = 0;
};

/// "SIGINT", "SIGTERM".
std::string stop_signal_name(int sig);

}  // namespace tandem::cli
