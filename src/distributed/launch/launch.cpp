// `tandem launch`: forks the ranks of this machine, relays their output, and stops the whole job when
// one rank fails (anywhere, across machines) or the user interrupts it; with --max-restarts, starts
// every rank again after a failure. The job's store is hosted by this launcher, or across machines by
// node 0's (launch_nodes.cpp).
#include "tandem/distributed/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "distributed/launch/launch_nodes.h"
#include "distributed/launch/launch_output.h"
#include "distributed/rendezvous/net.h"
#include "tandem/device.h"
#include "tandem/error.h"

extern char** environ;

namespace tandem::dist {

namespace {

using Clock = std::chrono::steady_clock;

// ---- the command

// The path execve gets: as given when it names a file, else found in PATH like a shell does.
std::string resolve_command(const std::string& cmd) {
  TANDEM_CHECK(!cmd.empty(), "launch: the command is an empty string");
  auto check_file = [](const std::string& path, const std::string& shown) {
    struct stat st {};
    TANDEM_CHECK(stat(path.c_str(), &st) == 0, "launch: the command '", shown, "' does not exist");
    TANDEM_CHECK(!S_ISDIR(st.st_mode), "launch: the command '", shown, "' is a directory");
    TANDEM_CHECK(access(path.c_str(), X_OK) == 0, "launch: the command '", shown,
                 "' is not executable (chmod +x?)");
  };
  if (cmd.find('/') != std::string::npos) {
    check_file(cmd, cmd);
    return cmd;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  for (;;) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    std::string full = (dir.empty() ? std::string(".") : dir) + "/" + cmd;
    struct stat st {};
    if (stat(full.c_str(), &st) == 0 && !S_ISDIR(st.st_mode) && access(full.c_str(), X_OK) == 0) return full;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  TANDEM_CHECK(false, "launch: the command '", cmd, "' was not found in PATH");
}

// ---- how many ranks this machine holds

// A job of tandem's programs asks for GPUs with --device cuda (or cuda:N); each local rank then
// takes a GPU of its own.
bool asks_for_gpus(const std::vector<std::string>& cmd) {
  for (size_t i = 0; i < cmd.size(); ++i) {
    std::string value;
    if (cmd[i] == "--device" && i + 1 < cmd.size()) value = cmd[i + 1];
    else if (cmd[i].rfind("--device=", 0) == 0) value = cmd[i].substr(9);
    if (value.rfind("cuda", 0) == 0) return true;
  }
  return false;
}

// Without --oversubscribe a CPU job gets at most this many ranks per usable core, and always this many:
// past a few per core every collective waits for ranks that the scheduler has not run yet, and each
// rank holds a process, its threads and connections to every other rank.
constexpr int kRanksPerCore = 4;
constexpr int kMinCpuRanks = 8;

// The cores this process may run on (its affinity mask, which taskset, cgroups' cpusets and Slurm set).
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Refuses, before any process starts, a number of ranks this machine cannot hold: more than its
// GPUs for a GPU job, past the per-core cap for a CPU job (unless --oversubscribe), or past the
// process and open-file limits, which fork and pipe would hit part-way through starting them.
void check_capacity(const LaunchOptions& o, int local) {
  const std::string asked = o.nnodes > 1 ? "--nproc-per-node " + std::to_string(local) : "-n " + std::to_string(local);
  if (asks_for_gpus(o.command)) {
    int gpus = cuda_device_count();
    std::string seen = gpus == 0 ? std::string("no GPU: run the job on the CPU (--device cpu)")
                                 : std::to_string(gpus) + (gpus == 1 ? " (cuda:0)" : " (cuda:0 .. cuda:" +
                                   std::to_string(gpus - 1) + ")") + ": start at most " + std::to_string(gpus) +
                                   " ranks here, or run the job on the CPU (--device cpu)";
    TANDEM_CHECK(local <= gpus, "launch: ", asked, " with --device cuda needs a GPU for each of its ", local, " ranks "
                 "on this machine, but this process sees ", seen);
  } else if (!o.oversubscribe) {
    const int cores = usable_cores();
    const int cap = std::max(kMinCpuRanks, kRanksPerCore * cores);
    TANDEM_CHECK(local <= cap, "launch: ", asked, " is more ranks than this machine runs well: at most ", cap, " CPU ranks "
                 "on ", cores, cores == 1 ? " core" : " cores", " (", kRanksPerCore, " per core, at least ", kMinCpuRanks,
                 "); pass --oversubscribe to start them anyway");
  }
  rlimit procs{};
  if (geteuid() != 0 && getrlimit(RLIMIT_NPROC, &procs) == 0 && procs.rlim_cur != RLIM_INFINITY)
    TANDEM_CHECK(static_cast<rlim_t>(local) < procs.rlim_cur, "launch: ", asked, " is more processes than this user may "
                 "run (ulimit -u: ", procs.rlim_cur, "): raise that limit or start fewer ranks");
  rlimit files{};
  const rlim_t need = 2 * static_cast<rlim_t>(local) + 32;  // the two pipes of each rank, and the launcher's own
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
    TANDEM_CHECK(need <= files.rlim_cur, "launch: ", asked, " needs about ", need, " open files in the launcher (two per "
                 "rank), more than its limit (ulimit -n: ", files.rlim_cur, "): raise that limit or start fewer ranks");
}

// ---- signals: the handler only writes the signal number into a pipe that the event loop polls

int g_signal_pipe = -1;

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe >= 0) (void)!write(g_signal_pipe, &b, 1);
  errno = saved;
}

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// Installs the handlers for the life of the launch and restores the earlier ones afterwards.
class SignalScope {
 public:
  SignalScope() {
    int p[2];
    TANDEM_RUNTIME_CHECK(pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0, "launch: pipe2 failed: ",
                         net::errno_str(errno));
    read_fd_ = p[0];
    write_fd_ = p[1];
    g_signal_pipe = write_fd_;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < std::size(kHandled); ++i) sigaction(kHandled[i], &sa, &old_[i]);
  }
  ~SignalScope() {
    for (size_t i = 0; i < std::size(kHandled); ++i) sigaction(kHandled[i], &old_[i], nullptr);
    g_signal_pipe = -1;
    close(read_fd_);
    close(write_fd_);
  }
  int fd() const { return read_fd_; }

 private:
  int read_fd_ = -1, write_fd_ = -1;
  struct sigaction old_[std::size(kHandled)] {};
};

// ---- the children

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // waitpid status once reaped
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "unknown") + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The environment of one rank: ours, minus the launch variables of any enclosing job, plus its own.
std::vector<std::string> rank_environment(const LaunchOptions& o, int per_node, int local, int round,
                                          const detail::NodeGroup& group) {
  // Across machines the ranks read the user's secret (TANDEM_SECRET_FILE or TANDEM_SECRET) themselves;
  // on one machine they get the launcher's.
  std::vector<std::string> own = {"TANDEM_RANK=", "TANDEM_WORLD_SIZE=", "TANDEM_LOCAL_RANK=", "TANDEM_LOCAL_SIZE=",
                                  "TANDEM_STORE_ADDR=", "TANDEM_JOB_ID=", "TANDEM_RESTART_COUNT="};
  if (o.timeout_s > 0) own.push_back("TANDEM_TIMEOUT=");
  if (!group.multi()) {
    own.push_back("TANDEM_SECRET=");
    own.push_back("TANDEM_SECRET_FILE=");
  }
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    bool drop = false;
    for (const auto& k : own) drop = drop || std::strncmp(*e, k.c_str(), k.size()) == 0;
    if (!drop) env.emplace_back(*e);
  }
  const int rank = o.node_rank * per_node + local;
  const int world = per_node * o.nnodes;
  int local_rank = local, local_size = per_node;
  if (o.gpus_per_node > 0) {  // one machine split into nodes of gpus_per_node ranks
    local_rank = rank % o.gpus_per_node;
    local_size = std::min(o.gpus_per_node, world - rank / o.gpus_per_node * o.gpus_per_node);
  }
  env.push_back("TANDEM_RANK=" + std::to_string(rank));
  env.push_back("TANDEM_WORLD_SIZE=" + std::to_string(world));
  env.push_back("TANDEM_LOCAL_RANK=" + std::to_string(local_rank));
  env.push_back("TANDEM_LOCAL_SIZE=" + std::to_string(local_size));
  env.push_back("TANDEM_STORE_ADDR=" + group.store_addr());
  env.push_back("TANDEM_JOB_ID=" + group.auth().job_id);
  env.push_back("TANDEM_RESTART_COUNT=" + std::to_string(round));
  if (!group.multi() && !group.auth().secret.empty()) env.push_back("TANDEM_SECRET=" + group.auth().secret);
  if (o.timeout_s > 0) env.push_back("TANDEM_TIMEOUT=" + std::to_string(o.timeout_s));
  if (isatty(STDERR_FILENO)) env.push_back("TANDEM_PROGRESS_TTY=1");  // rank 0 may draw a progress bar
  return env;
}

// Whether the launcher's stdout and stderr are one file (a terminal, or one pipe as after 2>&1): then a
// rank's two streams can share one pipe too, and its lines keep the order it wrote them in. (Read from two
// pipes, a header on stderr and the line that follows it on stdout may be relayed the other way round.)
bool one_output_file() {
  struct stat out {}, err {};
  return fstat(1, &out) == 0 && fstat(2, &err) == 0 && out.st_dev == err.st_dev && out.st_ino == err.st_ino;
}

// Forks one rank with its output on two new pipes, or on one for both streams when `merged` (read ends
// returned, non-blocking; err_fd is -1 when merged).
pid_t spawn(const std::string& path, const std::vector<std::string>& args, const std::vector<std::string>& env,
            bool merged, int& out_fd, int& err_fd) {
  int out[2], err[2] = {-1, -1};
  TANDEM_RUNTIME_CHECK(pipe2(out, O_CLOEXEC) == 0, "launch: pipe2 failed: ", net::errno_str(errno));
  if (!merged && pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    close(out[0]);
    close(out[1]);
    TANDEM_RUNTIME_CHECK(false, "launch: pipe2 failed: ", net::errno_str(e));
  }
  // Everything the child needs is built before fork: between fork and exec only async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  // Signals stay blocked across fork until the child has dropped the launcher's handlers: one that
  // arrived in between would otherwise run the handler in the child and write into the launcher's pipe.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  pid_t pid = fork();
  if (pid == 0) {
    // Its own process group: the launcher alone receives the terminal's Ctrl-C and decides what the
    // ranks get, and a signal to the group reaches whatever the rank started.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed outright takes its ranks along
    if (getppid() != parent) _exit(126);
    for (int sig : kHandled) signal(sig, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(merged ? out[1] : err[1], 2);
    execve(path.c_str(), argv.data(), envp.data());
    const char msg[] = "tandem launch: execve failed for the command\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  int fork_err = errno;
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  close(out[1]);
  if (!merged) close(err[1]);
  if (pid < 0) {
    close(out[0]);
    if (!merged) close(err[0]);
    TANDEM_RUNTIME_CHECK(false, "launch: fork failed: ", net::errno_str(fork_err));
  }
  setpgid(pid, pid);  // also here, so that the group exists before the launcher may signal it
  net::set_fd_flags(out[0], true);
  if (!merged) net::set_fd_flags(err[0], true);
  out_fd = out[0];
  err_fd = merged ? -1 : err[0];
  return pid;
}

void say(const std::string& line) {
  std::string msg = "tandem launch: " + line + "\n";
  net::write_all(2, msg.data(), msg.size());
}

// ---- supervision of one attempt

// How an attempt ended on this machine.
struct Outcome {
  bool succeeded = true;
  int exit_code = 0;
  bool final = false;   // no restart: an interrupt, or a launcher lost
  std::string message;  // the launcher's closing line(s)
};

class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, int signal_fd, detail::NodeGroup& group, int round)
      : o_(o), signal_fd_(signal_fd), group_(group), round_(round) {}

  Outcome run(const std::string& path, const std::vector<std::vector<std::string>>& envs, int first_rank);

 private:
  void signal_all(int sig);
  void reap();
  void on_local_failure(const Child& c);
  void on_signal(int sig);
  void begin_stop(int sig, double grace_s);
  size_t running() const;
  void check_others(Clock::time_point now);
  bool failed_here() const { return local_ || named_ || interrupted_by_ != 0; }
  bool ended() const;
  detail::RoundFailure describe_local() const;
  detail::RoundFailure fallback_failure() const;
  Outcome outcome() const;

  const LaunchOptions& o_;
  int signal_fd_;
  detail::NodeGroup& group_;
  int round_;
  std::vector<Child> children_;
  std::vector<detail::LineRelay> relays_;
  std::optional<Clock::time_point> kill_at_;  // SIGKILL whatever still runs then
  std::optional<Clock::time_point> next_check_;
  bool stopping_ = false;
  std::optional<Clock::time_point> done_at_;  // when this machine's ranks had all succeeded
  std::optional<Child> local_;               // the first of this machine's ranks that failed by itself
  // Across machines: the job's failure as every launcher names it, and until it is named, when this
  // launcher learnt that the attempt fails (then waits kBlameGrace for a cause to be claimed) and when
  // it gives up waiting for a named failure to appear.
  std::optional<detail::RoundFailure> named_;
  std::optional<Clock::time_point> failing_since_;
  std::optional<Clock::time_point> name_by_;
  size_t stopped_ = 0;      // ranks still running when the job was stopped
  int interrupted_by_ = 0;  // signal that interrupted the launcher
};

size_t Supervisor::running() const {
  size_t n = 0;
  for (const auto& c : children_) n += c.running ? 1 : 0;
  return n;
}

void Supervisor::signal_all(int sig) {
  for (const auto& c : children_)
    if (c.running) kill(-c.pid, sig);  // the rank's process group (it leads it until reaped)
}

void Supervisor::begin_stop(int sig, double grace_s) {
  if (!stopping_) stopped_ = running();
  stopping_ = true;
  signal_all(sig);
  auto at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
  if (!kill_at_ || at < *kill_at_) kill_at_ = at;
}

void Supervisor::reap() {
  std::vector<Child*> ended;
  for (auto& c : children_) {
    if (!c.running) continue;
    int st = 0;
    pid_t r;
    do {
      r = waitpid(c.pid, &st, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r != c.pid) continue;
    c.running = false;
    c.status = st;
    if (stopping_) {
      kill(-c.pid, SIGKILL);  // what the rank started in its group goes with it once the job is being stopped
    } else {
      ended.push_back(&c);
    }
  }
  // Of ranks that ended together, one killed by a signal is the likelier cause: the others may have
  // failed because it went.
  const Child* first = nullptr;
  for (const Child* c : ended) {
    bool failed = !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
    if (failed && (!first || (WIFSIGNALED(c->status) && !WIFSIGNALED(first->status)))) first = c;
  }
  if (first) on_local_failure(*first);
}

std::string rank_place(const LaunchOptions& o, int rank) {
  return "rank " + std::to_string(rank) + " on node " + std::to_string(o.node_rank) + " (host " + net::host_name() + ")";
}

detail::RoundFailure Supervisor::describe_local() const {
  return {exit_code_of(local_->status), false, rank_place(o_, local_->rank) + " " + describe_status(local_->status),
          o_.node_rank, local_->rank};
}

void Supervisor::on_local_failure(const Child& c) {
  local_ = c;
  begin_stop(SIGTERM, o_.stop_grace_s);
  if (!group_.multi()) return;
  auto now = Clock::now();
  if (WIFSIGNALED(c.status)) {
    // Nothing in the job makes a rank die of a signal that the launcher did not send: a cause.
    group_.claim_failure(round_, describe_local());
    name_by_ = now + detail::kBlameGrace;
  } else {
    group_.note_exit(round_, describe_local());
    if (!failing_since_) failing_since_ = now;
  }
}

void Supervisor::on_signal(int sig) {
  if (sig == SIGCHLD) return reap();
  if (interrupted_by_ != 0) {  // a second Ctrl-C: no more patience
    signal_all(SIGKILL);
    return;
  }
  interrupted_by_ = sig;
  // The ranks get the same signal the launcher got (SIGHUP arrives as SIGTERM), and time to use it: tandem
  // train's ranks agree on a step boundary, stop there together and save their checkpoint.
  if (running())
    say(signal_name(sig) + ": passed to the ranks, which get " + net::format_duration(std::chrono::milliseconds(
            static_cast<int64_t>(o_.interrupt_grace_s * 1000))) + " to stop (tandem train stops at its next step "
        "boundary, saving its --checkpoint); interrupt again to kill them now");
  begin_stop(sig == SIGHUP ? SIGTERM : sig, o_.interrupt_grace_s);
  group_.claim_failure(round_, {128 + sig, true, "the launcher of node " + std::to_string(o_.node_rank) +
                                                     " was interrupted by " + signal_name(sig), o_.node_rank, -1});
}

// Across machines: a failure anywhere stops this machine's ranks, and the launchers agree on which
// failure to name. Asked a few times a second.
void Supervisor::check_others(Clock::time_point now) {
  if (!group_.multi() || named_ || interrupted_by_ != 0 || (next_check_ && now < *next_check_)) return;
  next_check_ = now + std::chrono::milliseconds(100);
  // Before stopping the ranks for a failure elsewhere, a rank of this machine that died meanwhile is
  // reported: its death may be what the others failed of.
  if (auto f = group_.round_failure(round_)) {
    reap();
    named_ = f;
    // An interrupt elsewhere gives this machine's ranks the same time to stop at a step boundary as there.
    const bool interrupt = f->final && f->rank < 0 && f->exit_code > 128;
    if (running()) begin_stop(SIGTERM, interrupt ? o_.interrupt_grace_s : o_.stop_grace_s);
    return;
  }
  if (!failing_since_ && group_.round_failing(round_)) {
    reap();
    if (!failing_since_) failing_since_ = now;
    if (running()) begin_stop(SIGTERM, o_.stop_grace_s);
  }
  // A launcher that died took its ranks along, and the ranks of the other machines fail of it moments
  // later ("connection reset by peer"): its silence is the cause, named before any of their exits.
  group_.watch_launchers();
  const auto quiet = failing_since_ ? detail::kSilentWhileFailing : detail::kSilentLauncher;
  if (!name_by_)
    if (auto gone = group_.silent_launcher(round_, quiet)) {
      reap();
      group_.claim_failure(round_, *gone);
      if (!failing_since_) failing_since_ = now;
      name_by_ = now + detail::kBlameGrace;  // the claim (or an earlier one) is read back meanwhile
      if (running()) begin_stop(SIGTERM, o_.stop_grace_s);
      return;
    }
  if (failing_since_ && !name_by_ && now >= *failing_since_ + detail::kBlameGrace) {
    group_.settle_failure(round_, fallback_failure());
    name_by_ = now + detail::kBlameGrace;
  }
  // A claim whose launcher vanished before it could write it out: name what is known here.
  if (name_by_ && now >= *name_by_) named_ = fallback_failure();
}

detail::RoundFailure Supervisor::fallback_failure() const {
  if (local_) return describe_local();
  return {1, false, "a rank on another node failed, and its launcher did not say which", -1, -1};
}

// The attempt is over on this machine once its ranks ended and, across machines, the failure that
// ended it is named.
bool Supervisor::ended() const {
  if (interrupted_by_ != 0) return true;
  if (!group_.multi()) return local_.has_value();
  return named_.has_value();
}

Outcome Supervisor::run(const std::string& path, const std::vector<std::vector<std::string>>& envs, int first_rank) {
  const bool merged = one_output_file();
  for (size_t i = 0; i < envs.size(); ++i) {
    int out_fd = -1, err_fd = -1;
    pid_t pid;
    try {
      pid = spawn(path, o_.command, envs[i], merged, out_fd, err_fd);
    } catch (...) {
      begin_stop(SIGKILL, 0);
      while (running()) {
        reap();
        if (running()) usleep(10000);
      }
      throw;
    }
    int rank = first_rank + static_cast<int>(i);
    children_.push_back({rank, pid, true, 0});
    relays_.emplace_back(rank, out_fd, 1);
    if (err_fd >= 0) relays_.emplace_back(rank, err_fd, 2);
  }

  std::optional<Clock::time_point> drain_until;  // once every rank exited, lingering pipes get this long
  std::vector<pollfd> fds;
  for (;;) {
    reap();
    auto now = Clock::now();
    check_others(now);
    if (kill_at_ && now >= *kill_at_ && running()) {
      signal_all(SIGKILL);
      kill_at_.reset();
    }
    bool open_pipes = false;
    for (const auto& rl : relays_) open_pipes = open_pipes || rl.fd() >= 0;
    if (!running()) {
      if (!drain_until) drain_until = now + std::chrono::seconds(1);
      bool ended_here = ended();
      if (!failed_here() && !failing_since_ && !done_at_) {
        group_.mark_done(round_);
        done_at_ = now;
      }
      // A machine whose ranks all succeeded waits for the others, since a failure there restarts it
      // too; but not for ever for a launcher that vanished without a word.
      bool others_silent = done_at_ && now - *done_at_ > detail::rendezvous_timeout(o_);
      if (others_silent && group_.multi() && !group_.all_done(round_))
        say("the other machines did not report the end of their ranks within " +
            net::format_duration(detail::rendezvous_timeout(o_)) + "; this machine's ranks all succeeded");
      bool settled = ended_here || others_silent || group_.all_done(round_);
      if (settled && (!open_pipes || now >= *drain_until)) break;
    }

    fds.clear();
    fds.push_back({signal_fd_, POLLIN, 0});
    for (const auto& rl : relays_)
      if (rl.fd() >= 0) fds.push_back({rl.fd(), POLLIN, 0});
    int wait_ms = group_.multi() ? 100 : 500;  // also a safety net for a missed wake-up
    auto limit = [&](Clock::time_point t) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
      wait_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, wait_ms));
    };
    if (kill_at_) limit(*kill_at_);
    if (drain_until && open_pipes) limit(*drain_until);
    int n = poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR)
      TANDEM_RUNTIME_CHECK(false, "launch: poll failed: ", net::errno_str(errno));
    if (n <= 0) continue;
    if (fds[0].revents) {
      unsigned char sigs[64];
      ssize_t k;
      while ((k = read(signal_fd_, sigs, sizeof sigs)) > 0)
        for (ssize_t i = 0; i < k; ++i) on_signal(sigs[i]);
    }
    for (auto& rl : relays_)
      if (rl.fd() >= 0) {
        for (const auto& p : fds)
          if (p.fd == rl.fd() && p.revents) rl.pump();
      }
  }
  for (auto& rl : relays_) rl.finish();

  return outcome();
}

Outcome Supervisor::outcome() const {
  auto others = [](size_t n) {
    return n == 0 ? std::string() : n == 1 ? std::string("; stopped the other rank")
                                           : "; stopped the other " + std::to_string(n) + " ranks";
  };
  auto ranks = [](size_t n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); };
  Outcome out;
  if (interrupted_by_ != 0) {
    out.succeeded = false;
    out.exit_code = 128 + interrupted_by_;
    out.final = true;
    out.message = "interrupted by " + signal_name(interrupted_by_) + "; stopped " + ranks(stopped_);
  } else if (!group_.multi() && local_) {
    out.succeeded = false;
    out.exit_code = exit_code_of(local_->status);
    out.message = "rank " + std::to_string(local_->rank) + " " + describe_status(local_->status) + others(stopped_);
  } else if (named_ || local_) {
    detail::RoundFailure f = named_ ? *named_ : describe_local();
    out.succeeded = false;
    out.exit_code = f.exit_code;
    out.final = f.final;
    out.message = f.what;
    if (local_ && f.node == o_.node_rank && f.rank == local_->rank) {
      out.message += others(stopped_);
    } else {
      if (local_)
        out.message += "; this node's rank " + std::to_string(local_->rank) + " " + describe_status(local_->status) +
                       " after it";
      if (stopped_) out.message += "; stopped this node's " + ranks(stopped_);
    }
  }
  if (!out.succeeded && out.exit_code == 0) out.exit_code = 1;
  return out;
}

// Reads the signals that arrived while no attempt runs (between attempts, or while the launchers
// meet); returns the first that asks the launcher to stop, else 0.
int pending_interrupt(int signal_fd) {
  unsigned char sigs[64];
  ssize_t k;
  int found = 0;
  while ((k = read(signal_fd, sigs, sizeof sigs)) > 0)
    for (ssize_t i = 0; i < k; ++i)
      if (sigs[i] != SIGCHLD && found == 0) found = sigs[i];
  return found;
}


}  // namespace

int launch(const LaunchOptions& o) {
  TANDEM_CHECK(o.nnodes >= 1, "launch: --nnodes must be at least 1, got ", o.nnodes);
  TANDEM_CHECK(o.nprocs >= 0 && o.nproc_per_node >= 0, "launch: -n and --nproc-per-node must be at least 1");
  TANDEM_CHECK(o.nprocs > 0 || o.nproc_per_node > 0, "launch: give the number of ranks: -n N on one machine, or "
               "--nproc-per-node K (with --nnodes for several machines)");
  int per_node = o.nproc_per_node > 0 ? o.nproc_per_node : o.nprocs / o.nnodes;
  TANDEM_CHECK(o.nprocs == 0 || o.nprocs == per_node * o.nnodes, "launch: -n ", o.nprocs,
               o.nproc_per_node > 0 ? " does not equal --nproc-per-node " + std::to_string(o.nproc_per_node) +
                                          " x --nnodes " + std::to_string(o.nnodes)
                                    : " ranks cannot be spread evenly over --nnodes " + std::to_string(o.nnodes),
               "; give --nproc-per-node alone");
  TANDEM_CHECK(per_node >= 1, "launch: -n must be at least 1, got ", o.nprocs);
  TANDEM_CHECK(o.gpus_per_node >= 0, "launch: --gpus-per-node must be at least 1, got ", o.gpus_per_node);
  TANDEM_CHECK(o.gpus_per_node == 0 || o.nnodes == 1, "launch: --gpus-per-node splits the ranks of one machine into "
               "nodes; across machines use --nproc-per-node");
  if (o.nnodes > 1) {
    TANDEM_CHECK(!o.master_addr.empty(), "launch: --nnodes ", o.nnodes, " needs --master-addr, the address of the "
                 "machine with --node-rank 0 (it hosts the job's store)");
    TANDEM_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank ", o.node_rank,
                 " is out of range for --nnodes ", o.nnodes, " (0 .. ", o.nnodes - 1, ")");
    TANDEM_CHECK(o.master_port >= 1 && o.master_port <= 65535, "launch: --master-port ", o.master_port,
                 " is not a TCP port (1..65535)");
  } else {
    TANDEM_CHECK(o.node_rank == 0, "launch: --node-rank ", o.node_rank, " needs --nnodes (the number of machines)");
  }
  TANDEM_CHECK(o.max_restarts >= 0, "launch: --max-restarts must not be negative, got ", o.max_restarts);
  TANDEM_CHECK(o.timeout_s >= 0, "launch: --timeout must be a positive number of seconds, got ", o.timeout_s);
  TANDEM_CHECK(o.stop_grace_s >= 0 && o.interrupt_grace_s >= 0, "launch: grace periods must not be negative");
  TANDEM_CHECK(!o.command.empty(), "launch: no command given; put the program to run and its arguments "
               "after --, e.g. `tandem launch -n 2 -- ./train --epochs 3`");
  check_capacity(o, per_node);
  std::string path = resolve_command(o.command[0]);

  SignalScope signals;
  int interrupt = 0;
  try {
    detail::NodeGroup group(o, per_node, [&] { return pending_interrupt(signals.fd()); });
    for (int round = 0;; ++round) {
      group.start_round(round);
      std::vector<std::vector<std::string>> envs;
      for (int l = 0; l < per_node; ++l) envs.push_back(rank_environment(o, per_node, l, round, group));
      Supervisor sup(o, signals.fd(), group, round);
      Outcome out = sup.run(path, envs, o.node_rank * per_node);
      if (out.succeeded) {
        group.leave();
        return 0;
      }
      say(out.message);
      if (out.final || round >= o.max_restarts) {
        group.leave();
        return out.exit_code;
      }
      say("restarting every rank (restart " + std::to_string(round + 1) + " of " + std::to_string(o.max_restarts) + ")");
    }
  } catch (const detail::LaunchInterrupted& i) {
    interrupt = i.signal;
  }
  say("interrupted by " + signal_name(interrupt) + " before the ranks started");
  return 128 + interrupt;
}

}  // namespace tandem::dist
