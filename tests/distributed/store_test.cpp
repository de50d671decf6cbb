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
  char c;
  EXPECT_EQ(read(fd, &c, 1), 0);  // the server hangs up on it
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

}  // namespace
