// `tandem launch`: forks the ranks of a single-node job, hosts their rendezvous store, relays their
// output, and stops the whole job when one rank fails or the user interrupts it.
#include "tandem/distributed/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "distributed/launch_output.h"
#include "distributed/net.h"
#include "tandem/distributed/store.h"
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
std::vector<std::string> rank_environment(const LaunchOptions& o, int rank, int store_port) {
  static const char* kOwn[] = {"TANDEM_RANK=", "TANDEM_WORLD_SIZE=", "TANDEM_LOCAL_RANK=", "TANDEM_LOCAL_SIZE=",
                               "TANDEM_STORE_ADDR=", "TANDEM_TIMEOUT="};
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    bool own = false;
    for (const char* k : kOwn) own = own || std::strncmp(*e, k, std::strlen(k)) == 0;
    if (!own || (o.timeout_s <= 0 && std::strncmp(*e, "TANDEM_TIMEOUT=", 15) == 0)) env.emplace_back(*e);
  }
  int per_node = o.gpus_per_node > 0 ? o.gpus_per_node : o.nprocs;
  int node = rank / per_node;
  int local_size = std::min(per_node, o.nprocs - node * per_node);
  env.push_back("TANDEM_RANK=" + std::to_string(rank));
  env.push_back("TANDEM_WORLD_SIZE=" + std::to_string(o.nprocs));
  env.push_back("TANDEM_LOCAL_RANK=" + std::to_string(rank % per_node));
  env.push_back("TANDEM_LOCAL_SIZE=" + std::to_string(local_size));
  env.push_back("TANDEM_STORE_ADDR=127.0.0.1:" + std::to_string(store_port));
  if (o.timeout_s > 0) env.push_back("TANDEM_TIMEOUT=" + std::to_string(o.timeout_s));
  if (isatty(STDERR_FILENO)) env.push_back("TANDEM_PROGRESS_TTY=1");  // rank 0 may draw a progress bar
  return env;
}

// Forks one rank with its output on two new pipes (read ends returned, non-blocking).
pid_t spawn(const std::string& path, const std::vector<std::string>& args, const std::vector<std::string>& env,
            int& out_fd, int& err_fd) {
  int out[2], err[2];
  TANDEM_RUNTIME_CHECK(pipe2(out, O_CLOEXEC) == 0, "launch: pipe2 failed: ", net::errno_str(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
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
    dup2(err[1], 2);
    execve(path.c_str(), argv.data(), envp.data());
    const char msg[] = "tandem launch: execve failed for the command\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  int fork_err = errno;
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    TANDEM_RUNTIME_CHECK(false, "launch: fork failed: ", net::errno_str(fork_err));
  }
  setpgid(pid, pid);  // also here, so that the group exists before the launcher may signal it
  net::set_fd_flags(out[0], true);
  net::set_fd_flags(err[0], true);
  out_fd = out[0];
  err_fd = err[0];
  return pid;
}

// ---- supervision

class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, int signal_fd) : o_(o), signal_fd_(signal_fd) {}

  int run(const std::string& path, int store_port);

 private:
  void signal_all(int sig);
  void reap();
  void on_signal(int sig);
  void begin_stop(int sig, double grace_s);
  size_t running() const;

  const LaunchOptions& o_;
  int signal_fd_;
  std::vector<Child> children_;
  std::vector<detail::LineRelay> relays_;
  std::optional<Clock::time_point> kill_at_;  // SIGKILL whatever still runs then
  bool stopping_ = false;
  int failed_rank_ = -1;    // first rank that failed
  int failed_status_ = 0;
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
    // What the rank started in its group goes with it once the job is being stopped.
    if (stopping_) kill(-c.pid, SIGKILL);
    bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (failed && !stopping_ && failed_rank_ < 0) {
      failed_rank_ = c.rank;
      failed_status_ = st;
      begin_stop(SIGTERM, o_.stop_grace_s);
    }
  }
}

void Supervisor::on_signal(int sig) {
  if (sig == SIGCHLD) return reap();
  if (interrupted_by_ != 0) {  // a second Ctrl-C: no more patience
    signal_all(SIGKILL);
    return;
  }
  interrupted_by_ = sig;
  // The ranks get the same signal the launcher got (SIGHUP arrives as SIGTERM).
  begin_stop(sig == SIGHUP ? SIGTERM : sig, o_.interrupt_grace_s);
}

int Supervisor::run(const std::string& path, int store_port) {
  for (int r = 0; r < o_.nprocs; ++r) {
    int out_fd = -1, err_fd = -1;
    pid_t pid;
    try {
      pid = spawn(path, o_.command, rank_environment(o_, r, store_port), out_fd, err_fd);
    } catch (...) {
      begin_stop(SIGKILL, 0);
      while (running()) {
        reap();
        if (running()) usleep(10000);
      }
      throw;
    }
    children_.push_back({r, pid, true, 0});
    relays_.emplace_back(r, out_fd, 1);
    relays_.emplace_back(r, err_fd, 2);
  }

  std::optional<Clock::time_point> drain_until;  // once every rank exited, lingering pipes get this long
  std::vector<pollfd> fds;
  for (;;) {
    reap();
    auto now = Clock::now();
    if (kill_at_ && now >= *kill_at_ && running()) {
      signal_all(SIGKILL);
      kill_at_.reset();
    }
    bool open_pipes = false;
    for (const auto& rl : relays_) open_pipes = open_pipes || rl.fd() >= 0;
    if (!running()) {
      if (!drain_until) drain_until = now + std::chrono::seconds(1);
      if (!open_pipes || now >= *drain_until) break;
    }

    fds.clear();
    fds.push_back({signal_fd_, POLLIN, 0});
    for (const auto& rl : relays_)
      if (rl.fd() >= 0) fds.push_back({rl.fd(), POLLIN, 0});
    int wait_ms = 500;  // also a safety net for a missed wake-up
    auto limit = [&](Clock::time_point t) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
      wait_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, wait_ms));
    };
    if (kill_at_) limit(*kill_at_);
    if (drain_until) limit(*drain_until);
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

  auto others = [&](size_t n) {
    return n == 0 ? std::string() : n == 1 ? std::string("; stopped the other rank")
                                           : "; stopped the other " + std::to_string(n) + " ranks";
  };
  if (interrupted_by_ != 0) {
    std::string msg = "tandem launch: interrupted by " + signal_name(interrupted_by_) + "; stopped " +
                      std::to_string(stopped_) + (stopped_ == 1 ? " rank\n" : " ranks\n");
    net::write_all(2, msg.data(), msg.size());
    return 128 + interrupted_by_;
  }
  if (failed_rank_ >= 0) {
    std::string msg = "tandem launch: rank " + std::to_string(failed_rank_) + " " + describe_status(failed_status_) +
                      others(stopped_) + "\n";
    net::write_all(2, msg.data(), msg.size());
    int code = exit_code_of(failed_status_);
    return code == 0 ? 1 : code;
  }
  return 0;
}

}  // namespace

int launch(const LaunchOptions& o) {
  TANDEM_CHECK(o.nprocs >= 1, "launch: -n must be at least 1, got ", o.nprocs);
  TANDEM_CHECK(o.gpus_per_node >= 0, "launch: --gpus-per-node must be at least 1, got ", o.gpus_per_node);
  TANDEM_CHECK(o.timeout_s >= 0, "launch: --timeout must be a positive number of seconds, got ", o.timeout_s);
  TANDEM_CHECK(o.stop_grace_s >= 0 && o.interrupt_grace_s >= 0, "launch: grace periods must not be negative");
  TANDEM_CHECK(!o.command.empty(), "launch: no command given; put the program to run and its arguments "
               "after --, e.g. `tandem launch -n 2 -- ./train --epochs 3`");
  std::string path = resolve_command(o.command[0]);

  SignalScope signals;
  StoreServer store(0, "127.0.0.1");  // a single-node job: only this machine's ranks connect
  Supervisor sup(o, signals.fd());
  return sup.run(path, store.port());
}

}  // namespace tandem::dist
