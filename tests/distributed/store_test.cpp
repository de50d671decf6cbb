// The rendezvous store: server and client in this process.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tandem/distributed/store.h"
#include "tandem/error.h"

using namespace tandem;
using namespace tandem::dist;
using namespace std::chrono_literals;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Store, SetGetTryGetCheckErase) {
  StoreServer server(0, "127.0.0.1");
  Store store("127.0.0.1", server.port(), 5s);
  EXPECT_FALSE(store.try_get("a").has_value());
  EXPECT_FALSE(store.check({"a"}));
  store.set("a", "one");
  store.set("b", std::string("\0two\0", 5));
  EXPECT_EQ(store.get("a"), "one");
  EXPECT_EQ(store.get("b"), std::string("\0two\0", 5));
  EXPECT_EQ(store.try_get("a").value(), "one");
  EXPECT_TRUE(store.check({"a", "b"}));
  EXPECT_FALSE(store.check({"a", "c"}));
  store.set("a", "replaced");
  EXPECT_EQ(store.get("a"), "replaced");
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.erase("a"));
  EXPECT_FALSE(store.try_get("a").has_value());
  EXPECT_EQ(store.address(), "127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(store.local_address(), "127.0.0.1");
}

TEST(Store, AddCountsAndRejectsNonIntegers) {
  StoreServer server(0, "127.0.0.1");
  Store store("127.0.0.1", server.port(), 5s);
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -2), 3);
  EXPECT_EQ(store.add("n", 0), 3);
  EXPECT_EQ(store.get("n"), "3");
  store.set("text", "abc");
  EXPECT_NE(error_of([&] { store.add("text", 1); }).find("not an integer"), std::string::npos);
}

TEST(Store, AddIsAtomicAcrossClients) {
  StoreServer server(0, "127.0.0.1");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      Store store("127.0.0.1", server.port(), 5s);
      for (int i = 0; i < 250; ++i) store.add("counter", 1);
    });
  for (auto& t : threads) t.join();
  Store store("127.0.0.1", server.port(), 5s);
  EXPECT_EQ(store.add("counter", 0), 1000);
}

TEST(Store, GetWaitsUntilAnotherClientSets) {
  StoreServer server(0, "127.0.0.1");
  Store waiter("127.0.0.1", server.port(), 5s);
  auto start = std::chrono::steady_clock::now();
  std::thread setter([&] {
    Store s("127.0.0.1", server.port(), 5s);
    std::this_thread::sleep_for(150ms);
    s.set("late", "here");
  });
  EXPECT_EQ(waiter.get("late"), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 140ms);
  setter.join();
}

TEST(Store, SeveralClientsWaitOnOneKey) {
  StoreServer server(0, "127.0.0.1");
  std::atomic<int> got{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&] {
      Store s("127.0.0.1", server.port(), 5s);
      if (s.get("go") == "now") ++got;
    });
  std::this_thread::sleep_for(100ms);
  Store setter("127.0.0.1", server.port(), 5s);
  setter.add("go_count", 1);  // an unrelated key wakes nobody
  setter.set("go", "now");
  for (auto& t : threads) t.join();
  EXPECT_EQ(got.load(), 3);
}

TEST(Store, GetTimeoutSaysWhatIsMissing) {
  StoreServer server(0, "127.0.0.1");
  Store store("127.0.0.1", server.port(), 5s);
  auto start = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { store.get("join/1", 300ms, "rank 1 did not join"); });
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_NE(msg.find("rank 1 did not join within 300 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'join/1'"), std::string::npos) << msg;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 3s);

  store.set_timeout(200ms);
  msg = error_of([&] { store.get("nobody/sets/this"); });
  EXPECT_NE(msg.find("timed out after 200 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'nobody/sets/this'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(store.address()), std::string::npos) << msg;

  // The client recovers from the abandoned wait: the late reply must not be taken for the next one.
  store.set_timeout(5s);
  store.set("nobody/sets/this", "now it does");
  store.set("x", "1");
  EXPECT_EQ(store.get("x"), "1");
  EXPECT_EQ(store.get("nobody/sets/this"), "now it does");
}

TEST(Store, LargeValuesSurvivePartialReadsAndWrites) {
  StoreServer server(0, "127.0.0.1");
  Store a("127.0.0.1", server.port(), 10s);
  Store b("127.0.0.1", server.port(), 10s);
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131) ^ (i >> 9));
  std::thread writer([&] { a.set("big", big); });
  std::string got = b.get("big");
  writer.join();
  EXPECT_TRUE(got == big);
}

TEST(Store, ConnectFailureNamesTheAddress) {
  int port;
  {
    StoreServer probe(0, "127.0.0.1");
    port = probe.port();
  }  // closed again: nobody listens there now
  auto start = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { Store s("127.0.0.1", port, 400ms); });
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("within 400 ms"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(Store, ClientWaitsForALateServer) {
  int port;
  {
    StoreServer probe(0, "127.0.0.1");
    port = probe.port();
  }
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    server = std::make_unique<StoreServer>(port, "127.0.0.1");
  });
  Store store("127.0.0.1", port, 5s);  // retries while nobody listens
  starter.join();
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

TEST(Store, ServerReportsABusyPort) {
  StoreServer first(0, "127.0.0.1");
  std::string msg = error_of([&] { StoreServer second(first.port(), "127.0.0.1"); });
  EXPECT_NE(msg.find(std::to_string(first.port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot listen"), std::string::npos) << msg;
}

TEST(Store, ServerSurvivesAGarbageClient) {
  StoreServer server(0, "127.0.0.1");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const char junk[] = "\xff\xff\xff\xffGET / HTTP/1.1\r\n\r\n";
  ASSERT_GT(write(fd, junk, sizeof junk), 0);
  // The server says why, then hangs up on it.
  std::string said;
  char buf[256];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
  EXPECT_NE(said.find("larger than this store takes"), std::string::npos) << said;
  close(fd);
  Store store("127.0.0.1", server.port(), 5s);
  store.set("still", "working");
  EXPECT_EQ(store.get("still"), "working");
}

TEST(Store, ARequestSentJustBeforeClosingIsApplied) {
  StoreServer server(0, "127.0.0.1");
  {
    Store quick("127.0.0.1", server.port(), 5s);
    quick.set("left", "behind");
  }
  Store store("127.0.0.1", server.port(), 5s);
  EXPECT_EQ(store.get("left"), "behind");
}

// ---- who may use a store

const std::string kSecret = "a secret of twenty bytes";

StoreServerOptions options(const std::string& job, const std::string& secret, std::vector<std::string>* log = nullptr) {
  StoreServerOptions o;
  o.auth = {job, secret};
  if (log) o.log = [log](const std::string& line) { log->push_back(line); };
  return o;
}

// The error of connecting with `auth`, and how long it took to come.
std::pair<std::string, double> refusal(int port, const StoreAuth& auth) {
  auto start = std::chrono::steady_clock::now();
  std::string msg = error_of([&] { Store s("127.0.0.1", port, 20s, auth); });
  return {msg, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

TEST(StoreAuth, TheJobsSecretLetsIn) {
  StoreServer server(options("job", kSecret));
  Store store("127.0.0.1", server.port(), 5s, {"job", kSecret});
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

TEST(StoreAuth, AWrongOrMissingSecretIsRefusedAtOnce) {
  std::vector<std::string> log;
  StoreServer server(options("job", kSecret, &log));
  // Refusals are not retried: each comes well within the 20 s the client would wait for a server.
  auto [wrong, t1] = refusal(server.port(), {"job", "another secret, also long"});
  EXPECT_NE(wrong.find("does not know this job's secret"), std::string::npos) << wrong;
  EXPECT_LT(t1, 3);
  auto [none, t2] = refusal(server.port(), {"job", ""});
  EXPECT_NE(none.find("asks for the job's secret and this process has none"), std::string::npos) << none;
  EXPECT_LT(t2, 3);

  StoreServer open(options("job", ""));
  auto [extra, t3] = refusal(open.port(), {"job", kSecret});
  EXPECT_NE(extra.find("does not ask for the job's secret, but this process has one"), std::string::npos) << extra;
  EXPECT_LT(t3, 3);
}

TEST(StoreAuth, AClientOfAnotherJobIsTurnedAway) {
  std::vector<std::string> log;
  StoreServer server(options("A", "", &log));
  auto [msg, took] = refusal(server.port(), {"B", ""});
  EXPECT_NE(msg.find("this store serves job 'A', not job 'B'"), std::string::npos) << msg;
  EXPECT_LT(took, 3);
  Store store("127.0.0.1", server.port(), 5s, {"A", ""});
  store.set("k", "v");
  std::this_thread::sleep_for(50ms);  // the server thread logs
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log[0].find("turned away a client from 127.0.0.1:"), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("of job 'B': this store serves job 'A'"), std::string::npos) << log[0];
}

TEST(StoreLimits, AFullStoreRefusesMoreAndSaysSo) {
  std::vector<std::string> log;
  StoreServerOptions o = options("", "", &log);
  o.limits.max_stored_bytes = 1000;
  StoreServer server(o);
  Store store("127.0.0.1", server.port(), 5s);
  store.set("small", std::string(500, 's'));
  std::string msg = error_of([&] { store.set("big", std::string(600, 'b')); });
  EXPECT_NE(msg.find("the store is full: it holds at most 1000 bytes"), std::string::npos) << msg;
  store.set("small", std::string(900, 's'));  // replacing a value counts only the difference
  EXPECT_TRUE(store.erase("small"));
  store.set("big", std::string(600, 'b'));  // room again
  EXPECT_EQ(store.get("big").size(), 600u);
  std::this_thread::sleep_for(50ms);
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log[0].find("refused to store key 'big'"), std::string::npos) << log[0];
}

TEST(StoreLimits, TheClientRefusesToSendAnOversizedValue) {
  StoreServer server(0, "127.0.0.1");
  Store store("127.0.0.1", server.port(), 5s);
  std::string msg = error_of([&] { store.set("huge", std::string(17 << 20, 'h')); });
  EXPECT_NE(msg.find("larger than the store takes (16 MiB)"), std::string::npos) << msg;
  store.set("k", "v");  // the connection is still good
  EXPECT_EQ(store.get("k"), "v");
}

TEST(StoreLimits, InconsistentLimitsAreRejected) {
  StoreServerOptions o;
  o.limits.max_connection_bytes = 1024;  // less than one largest frame
  EXPECT_NE(error_of([&] { StoreServer s(o); }).find("inconsistent limits"), std::string::npos);
}

}  // namespace

