// Ctrl-C and SIGTERM in `tandem train`: a handler that only records the signal (and says once what
// follows), and the agreement of every rank on the step boundary where the job stops.
#include "cli/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace tandem::cli {

namespace {

volatile sig_atomic_t g_received = 0;
// The line the first signal prints, built before the handler is installed (the handler only writes it).
char g_line[1024];
size_t g_line_size = 0;
struct sigaction g_old_int {}, g_old_term {};

extern "C" void on_stop_signal(int sig) {
  if (g_received != 0) {
    // The second signal: its default action, now (it is blocked until this handler returns).
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_received = sig;
  if (g_line_size > 0) (void)!write(STDERR_FILENO, g_line, g_line_size);
}

// The signal the job stops for, from how many ranks got each: SIGINT (Ctrl-C) over SIGTERM.
int decide(int sigint, int sigterm) { return sigint > 0 ? SIGINT : sigterm > 0 ? SIGTERM : 0; }

}  // namespace

std::string stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal " + std::to_string(sig);
}

InterruptScope::InterruptScope(bool lead, const std::string& plan) {
  g_received = 0;
  g_line_size = 0;
  if (lead) {
    const std::string line = "\ntandem: interrupted: stopping at the next step boundary, " + plan +
                             " (interrupt again to stop at once, saving nothing)\n";
    g_line_size = std::min(line.size(), sizeof g_line);
    std::memcpy(g_line, line.data(), g_line_size);
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a rank waiting in a collective goes on waiting: its peers reach the boundary too
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptScope::~InterruptScope() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int InterruptScope::received() { return g_received; }

StopAgreement::StopAgreement(dist::Communicator& comm, Device device) : comm_(comm), device_(device) {}

StopAgreement::~StopAgreement() {
  try {
    if (pending_) pending_->wait();
  } catch (...) {
    // a failed collective is reported by whatever failed first
  }
}

int StopAgreement::at_boundary() {
  if (agreed_ != 0) return agreed_;
  const int sig = InterruptScope::received();
  if (comm_.size() == 1) return agreed_ = sig;
  // The previous boundary's sums: the same on every rank.
  if (pending_) {
    pending_->wait();
    pending_.reset();
    const std::vector<int32_t> c = flags_.to_vector<int32_t>();
    agreed_ = decide(c[0], c[1]);
    if (agreed_ != 0) return agreed_;
  }
  flags_ = Tensor::from_vector(std::vector<int32_t>{sig == SIGINT ? 1 : 0, sig == SIGTERM ? 1 : 0}, {2}, device_);
  pending_ = comm_.all_reduce(flags_);
  return 0;
}

int StopAgreement::now() {
  finish();
  if (agreed_ != 0) return agreed_;
  const int sig = InterruptScope::received();
  if (comm_.size() == 1) return agreed_ = sig;
  return agreed_ = reduce_counts(sig == SIGINT ? 1 : 0, sig == SIGTERM ? 1 : 0);
}

void StopAgreement::finish() {
  if (!pending_) return;
  pending_->wait();
  pending_.reset();
  const std::vector<int32_t> c = flags_.to_vector<int32_t>();
  if (agreed_ == 0) agreed_ = decide(c[0], c[1]);
}

int StopAgreement::reduce_counts(int sigint, int sigterm) {
  Tensor t = Tensor::from_vector(std::vector<int32_t>{sigint, sigterm}, {2}, device_);
  comm_.all_reduce(t)->wait();
  const std::vector<int32_t> c = t.to_vector<int32_t>();
  return decide(c[0], c[1]);
}

}  // namespace tandem::cli
