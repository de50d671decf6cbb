// The rendezvous store against broken and hostile clients, each played by hand over a raw socket
// against a store server in a process of its own (dist_worker store_server), so that a server that
// crashes, spins or grows shows as such instead of taking the test with it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "process_util.h"
#include "store_wire.h"
#include "tandem/distributed/store.h"
#include "text_util.h"

using tandem::test::Proc;
using tandem::test::RawClient;
namespace proto = tandem::dist::proto;
using namespace std::chrono_literals;

namespace {

const std::string kWorker = TANDEM_DIST_WORKER;

using tandem::test::contains;

// A store server process; `limits` are shell commands run first (ulimit ...), `args` go to the worker.
class ServerProc {
 public:
  explicit ServerProc(const std::vector<std::string>& args = {}, const std::string& limits = "") {
    std::string cmd = limits + (limits.empty() ? "" : "; ") + "exec " + kWorker + " store_server";
    for (const auto& a : args) cmd += " '" + a + "'";
    proc_ = std::make_unique<Proc>(std::vector<std::string>{"sh", "-c", cmd});
    if (proc_->read_until("\n", 1, 10)) {
      size_t at = proc_->output().find("port=");
      if (at != std::string::npos) port_ = std::atoi(proc_->output().c_str() + at + 5);
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return proc_->pid(); }
  /// What the server logged so far (reads what is pending for up to `wait_s`).
  std::string log(double wait_s = 0.3) {
    proc_->read_until("\x01never", 1, wait_s);
    return proc_->output();
  }
  /// CPU seconds the server has used (user + system).
  double cpu_seconds() const {
    std::ifstream f("/proc/" + std::to_string(pid()) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::istringstream in(s.substr(s.rfind(')') + 2));
    std::string field;
    long long utime = 0, stime = 0;
    for (int i = 3; in >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) {
        stime = std::stoll(field);
        break;
      }
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  /// False once the server died (a zombie still counts as dead).
  bool running() const {
    std::ifstream f("/proc/" + std::to_string(pid()) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t close = s.rfind(')');
    return close != std::string::npos && close + 2 < s.size() && s[close + 2] != 'Z';
  }
  /// Resident memory in MiB.
  double rss_mib() const {
    std::ifstream f("/proc/" + std::to_string(pid()) + "/status");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    return -1;
  }

 private:
  std::unique_ptr<Proc> proc_;
  int port_ = 0;
};

// AddressSanitizer keeps freed memory in quarantine, so the server's resident size says little about
// what it holds there; the bytes it accepted still bound it.
#ifdef __SANITIZE_ADDRESS__
constexpr bool kResidentSizeMeaningful = false;
#else
constexpr bool kResidentSizeMeaningful = true;
#endif

// Whether the server still answers: a fresh client of job `job` reads key back (open store).
bool answers(int port, const std::string& key, const std::string& want, const std::string& job = "") {
  RawClient c(port);
  if (!c.connected()) return false;
  c.hello(job);
  if (!c.send_frame(proto::kGet, {key})) return false;
  auto r = c.read_frame(5);
  return r && r->first == proto::kOk && r->second.size() == 1 && r->second[0] == want;
}

TEST(StoreHostile, ChainedParkedGetsDoNotOverflowTheStack) {
  // Client i waits for key i and has the set of key i+1 queued behind its get: one set of key 0 then
  // wakes every client in turn. A server that runs a woken client's next request from inside the
  // wake-up recurses once per client; with a 512 KiB stack (less the libraries' thread-local storage,
  // which lives there too) a thousand clients are too deep for it.
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_max < 2048) GTEST_SKIP() << "needs 2048 file descriptors; the hard limit is " << rl.rlim_max;
  rl.rlim_cur = 2048;
  setrlimit(RLIMIT_NOFILE, &rl);  // this process holds one end of each connection
  ServerProc server({}, "ulimit -s 512; ulimit -n 2048");
  ASSERT_GT(server.port(), 0) << server.log();
  const int n = 1000;
  auto key = [](int i) { return std::string("k").append(std::to_string(i)); };
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(clients.back()->connected()) << "client " << i;
    ASSERT_TRUE(clients.back()->send_bytes(
        proto::encode(proto::kHello, {proto::kVersion, "", std::string(proto::kNonceBytes, 'n')}) +
        proto::encode(proto::kGet, {key(i)}) + proto::encode(proto::kSet, {key(i + 1), "v"})));
  }
  std::this_thread::sleep_for(200ms);  // every get is parked before the chain starts
  RawClient trigger(server.port());
  trigger.hello();
  ASSERT_TRUE(trigger.send_frame(proto::kSet, {"k0", "v"}));
  EXPECT_TRUE(answers(server.port(), key(n), "v")) << server.log();
  EXPECT_TRUE(server.running()) << server.log();
}

TEST(StoreHostile, ARequestLargerThanTheLimitIsRefused) {
  ServerProc server;
  ASSERT_GT(server.port(), 0) << server.log();
  const double rss_at_start = server.rss_mib();
  // Before the handshake a client may send only small frames.
  RawClient early(server.port());
  std::string header;
  proto::put_u32(header, 64 << 10);
  early.send_bytes(header + std::string(1000, 'x'));
  EXPECT_TRUE(early.closed_by_server(3));

  // After it, a frame larger than the limit (16 MiB) is refused before the server buffers it.
  RawClient big(server.port());
  big.hello();
  header.clear();
  proto::put_u32(header, 100u << 20);
  bool all_sent = big.send_bytes(header);
  std::string chunk(1 << 20, 'x');
  for (int i = 0; i < 40 && all_sent; ++i) all_sent = big.send_bytes(chunk);
  EXPECT_FALSE(all_sent) << "the server took " << big.sent() << " bytes of a 100 MiB request";
  EXPECT_TRUE(contains(server.log(), "it sent a request of 100 MiB, more than the limit of 16 MiB")) << server.log();
  if (kResidentSizeMeaningful) {
    EXPECT_LT(server.rss_mib() - rss_at_start, 20);
  }
  RawClient c(server.port());
  c.hello();
  c.send_frame(proto::kSet, {"still", "here"});
  EXPECT_TRUE(answers(server.port(), "still", "here")) << server.log();
}

TEST(StoreHostile, AParkedConnectionCannotMakeTheServerGrow) {
  ServerProc server;
  ASSERT_GT(server.port(), 0) << server.log();
  const double rss_at_start = server.rss_mib();
  RawClient c(server.port());
  c.hello();
  ASSERT_TRUE(c.send_frame(proto::kGet, {"never/set"}));  // parks the connection
  // Then requests keep coming without end: the server must stop reading them (the client's sends
  // stall), not keep them all.
  std::string frame = proto::encode(proto::kSet, {"junk", std::string(1 << 20, 'j')});
  bool ok = true;
  for (int i = 0; i < 96 && ok; ++i) ok = c.send_bytes(frame);
  EXPECT_FALSE(ok) << "the server buffered " << c.sent() << " bytes for a waiting connection";
  EXPECT_LT(c.sent(), size_t{64} << 20);
  // 32 MiB received and unanswered is the limit; the buffer may hold up to twice that while it grows.
  if (kResidentSizeMeaningful) {
    EXPECT_LT(server.rss_mib() - rss_at_start, 80);
  }
  EXPECT_TRUE(contains(server.log(), "stopped reading from")) << server.log();
  RawClient other(server.port());
  other.hello();
  other.send_frame(proto::kSet, {"k", "v"});
  EXPECT_TRUE(answers(server.port(), "k", "v")) << server.log();
}

TEST(StoreHostile, ClientsThatNeverAuthenticateAreDropped) {
  ServerProc server({"--handshake-ms", "300"});
  ASSERT_GT(server.port(), 0) << server.log();
  RawClient idle(server.port());
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(idle.closed_by_server(5));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_TRUE(contains(server.log(), "no handshake within 300 ms")) << server.log();
}

TEST(StoreHostile, AFullServerMakesRoomForProvenClients) {
  ServerProc server({"--max-connections", "4", "--handshake-ms", "60000"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<RawClient>(server.port()));
  std::this_thread::sleep_for(100ms);
  // A real client still gets in: the oldest connection that never proved itself gives way.
  tandem::dist::Store store("127.0.0.1", server.port(), 5s);
  store.set("k", "v");
  EXPECT_TRUE(idle[0]->closed_by_server(3));
  EXPECT_TRUE(contains(server.log(), "dropped the oldest that had not finished its handshake")) << server.log();
  // Once every slot holds a proven client, newcomers are turned away.
  std::vector<std::unique_ptr<RawClient>> proven;
  for (int i = 0; i < 3; ++i) {
    proven.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(proven.back()->hello().has_value());
  }
  RawClient late(server.port());
  EXPECT_TRUE(late.closed_by_server(3));
  EXPECT_TRUE(contains(server.log(), "turned away a connection")) << server.log();
  EXPECT_EQ(store.get("k"), "v");
}

TEST(StoreHostile, RunningOutOfDescriptorsDoesNotSpin) {
  // With 32 descriptors the server cannot accept 60 clients; it must wait, not retry at full speed.
  ServerProc server({}, "ulimit -n 32");
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 60; ++i) clients.push_back(std::make_unique<RawClient>(server.port()));
  std::this_thread::sleep_for(300ms);
  double before = server.cpu_seconds();
  std::this_thread::sleep_for(1s);
  double used = server.cpu_seconds() - before;
  EXPECT_LT(used, 0.2) << "the server used " << used << " s of CPU in 1 s while out of descriptors";
  EXPECT_TRUE(contains(server.log(), "cannot accept connections")) << server.log();
  EXPECT_TRUE(contains(server.log(), "ulimit -n")) << server.log();
  clients.clear();  // once descriptors are free again, it serves
  std::this_thread::sleep_for(400ms);
  RawClient c(server.port());
  c.hello();
  c.send_frame(proto::kSet, {"k", "v"});
  EXPECT_TRUE(answers(server.port(), "k", "v")) << server.log();
}

TEST(StoreHostile, WithoutTheSecretNothingCanBeReadOrWritten) {
  const std::string secret = "0123456789abcdef0123";
  ServerProc server({"--job", "job7", "--secret", secret});
  ASSERT_GT(server.port(), 0) << server.log();
  tandem::dist::Store store("127.0.0.1", server.port(), 5s, {"job7", secret});
  store.set("tandem/r0/group/0/join/0", "pid=1234");

  // A client that skips the proof gets nothing, and is hung up on.
  RawClient skip(server.port());
  auto hello = skip.hello("job7");
  ASSERT_TRUE(hello.has_value());
  skip.send_frame(proto::kTryGet, {"tandem/r0/group/0/join/0"});
  auto r = skip.read_frame(3);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first, proto::kError);
  for (const auto& f : r->second) EXPECT_FALSE(contains(f, "pid=1234"));
  EXPECT_TRUE(skip.closed_by_server(3));

  // A wrong proof, or no job id, is refused too; nothing they send is stored.
  RawClient wrong(server.port());
  wrong.hello("job7");
  wrong.send_frame(proto::kAuth, {std::string(32, 'p')});
  wrong.send_frame(proto::kSet, {"tandem/r0/group/0/abort", "forged"});
  EXPECT_TRUE(wrong.closed_by_server(3));
  RawClient other_job(server.port());
  auto reply = other_job.hello("");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->first, proto::kError);
  other_job.send_frame(proto::kSet, {"tandem/r0/group/0/abort", "forged"});
  EXPECT_TRUE(other_job.closed_by_server(3));
  EXPECT_FALSE(store.try_get("tandem/r0/group/0/abort").has_value());
  std::string log = server.log();
  EXPECT_TRUE(contains(log, "does not know the job's secret")) << log;
  EXPECT_TRUE(contains(log, "this store serves job 'job7'")) << log;
}

}  // namespace
