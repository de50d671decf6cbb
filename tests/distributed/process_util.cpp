#include "process_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace tandem::test {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool launcher_variable(const std::string& kv) {
  static const char* prefixes[] = {"TANDEM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "SLURM_"};
  static const char* exact[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* p : prefixes)
    if (kv.rfind(p, 0) == 0) return true;
  std::string name = kv.substr(0, kv.find('='));
  for (const char* e : exact)
    if (name == e) return true;
  return false;
}
}  // namespace

Proc::Proc(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e)
    if (!launcher_variable(*e)) envs.emplace_back(*e);
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> av, ev;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  for (const auto& e : envs) ev.push_back(const_cast<char*>(e.c_str()));
  ev.push_back(nullptr);
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  start_ = now_s();
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    dup2(p[1], 1);
    dup2(p[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    execvpe(av[0], av.data(), ev.data());
    _exit(127);
  }
  close(p[1]);
  if (pid_ < 0) throw std::runtime_error("fork failed");
  setpgid(pid_, pid_);
  fd_ = p[0];
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

Proc::~Proc() {
  if (!reaped_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (fd_ >= 0) close(fd_);
}

void Proc::pump(int timeout_ms) {
  if (fd_ < 0) return;
  pollfd pfd{fd_, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) return;
  char buf[65536];
  for (;;) {
    ssize_t r = read(fd_, buf, sizeof buf);
    if (r > 0) {
      out_.append(buf, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      close(fd_);
      fd_ = -1;
    }
    return;
  }
}

bool Proc::read_until(const std::string& needle, int count, double timeout_s) {
  double end = now_s() + timeout_s;
  for (;;) {
    int seen = 0;
    for (size_t at = out_.find(needle); at != std::string::npos; at = out_.find(needle, at + 1)) ++seen;
    if (seen >= count) return true;
    if (now_s() >= end || fd_ < 0) return false;
    pump(50);
  }
}

ProcResult Proc::wait(double timeout_s) {
  ProcResult r;
  double end = start_ + timeout_s;
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid_, &status, WNOHANG);
    if (w == pid_) break;
    if (now_s() >= end) {
      r.timed_out = true;
      kill(-pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    pump(20);
  }
  reaped_ = true;
  r.seconds = now_s() - start_;
  // Drain what the program wrote before it ended (anything it left running has at most a moment).
  double drain_end = now_s() + 2.0;
  while (fd_ >= 0 && now_s() < drain_end) pump(50);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  r.output = out_;
  return r;
}

ProcResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                       double timeout_s) {
  Proc p(argv, env);
  return p.wait(timeout_s);
}

bool in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string s = path;
  size_t start = 0;
  for (;;) {
    size_t colon = s.find(':', start);
    std::string dir = s.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return true;
    if (colon == std::string::npos) return false;
    start = colon + 1;
  }
}

int free_port() {
  // Below the kernel's ephemeral range (32768 and up by default): a port picked there could be taken
  // as the source port of some other test's connection before the server that wants it binds it.
  static unsigned state = static_cast<unsigned>(getpid()) * 2654435761u ^
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    state = state * 1103515245u + 12345u;
    int port = 20000 + static_cast<int>((state >> 8) % 12000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (ok) return port;
  }
  throw std::runtime_error("free_port: no free port in 20000..31999");
}

bool process_exists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

}  // namespace tandem::test
