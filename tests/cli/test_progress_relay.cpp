// Under `tandem launch` rank 0's progress bar reaches the terminal as it is drawn, not after the epoch.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "distributed/launch/launch_output.h"

using tandem::dist::detail::LineRelay;

namespace {

std::string drain(int fd) {
  std::string out;
  char buf[256];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

struct Pipes {
  int child[2], terminal[2];
  Pipes() {
    EXPECT_EQ(pipe2(child, O_NONBLOCK), 0);
    EXPECT_EQ(pipe2(terminal, O_NONBLOCK), 0);
  }
  ~Pipes() {
    close(child[1]);
    close(terminal[0]);
    close(terminal[1]);
  }
  void send(const std::string& s) { ASSERT_EQ(write(child[1], s.data(), s.size()), static_cast<ssize_t>(s.size())); }
};

}  // namespace

TEST(ProgressRelay, RankZeroRedrawsPassThroughAtOnce) {
  Pipes p;
  LineRelay relay(0, p.child[0], p.terminal[1]);
  p.send("\r\033[Kepoch 0 [===>    ] 10/80");
  relay.pump();
  EXPECT_EQ(drain(p.terminal[0]), "\r\033[Kepoch 0 [===>    ] 10/80");
  p.send("\r\033[Kepoch 0 [=====>  ] 40/80");
  relay.pump();
  EXPECT_EQ(drain(p.terminal[0]), "\r\033[Kepoch 0 [=====>  ] 40/80");
  p.send("Starting Epoch 1:\npartial");  // ordinary output is still relayed by whole lines
  relay.pump();
  EXPECT_EQ(drain(p.terminal[0]), "Starting Epoch 1:\n");
}

TEST(ProgressRelay, OtherRanksKeepWholePrefixedLines) {
  Pipes p;
  LineRelay relay(1, p.child[0], p.terminal[1]);
  p.send("\rnot a bar of rank 0");
  relay.pump();
  EXPECT_EQ(drain(p.terminal[0]), "");
  p.send("\n");
  relay.pump();
  EXPECT_EQ(drain(p.terminal[0]), "[rank 1] \rnot a bar of rank 0\n");
}
