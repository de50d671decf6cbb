// TensorBoard event files: CRC-32C, TFRecord framing and the scalar events, read back byte by byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli/tensorboard.h"
#include "tandem/error.h"

namespace fs = std::filesystem;
using tandem::cli::crc32c;
using tandem::cli::TensorBoardWriter;

namespace {

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

uint32_t masked(const std::string& s, size_t at, size_t n) {
  uint32_t c = crc32c(s.data() + at, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_tb_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

}  // namespace

TEST(Crc32c, KnownVectors) {
  // The check value of CRC-32C (RFC 3720's iSCSI polynomial) and a 32-byte vector of zeros.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoard, RecordsAreFramedAndHoldTheScalars) {
  fs::path dir = fresh_dir("framing");
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    w.scalar("train/loss", 0.25, 7);
    w.scalar("eval/accuracy", 0.875, 8);
    w.flush();
    path = w.path();
  }
  EXPECT_NE(fs::path(path).filename().string().find("tfevents"), std::string::npos);
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  for (size_t at = 0; at < all.size();) {
    ASSERT_LE(at + 12, all.size());
    uint64_t len = le(all, at, 8);
    EXPECT_EQ(le(all, at + 8, 4), masked(all, at, 8));
    ASSERT_LE(at + 12 + len + 4, all.size());
    EXPECT_EQ(le(all, at + 12 + len, 4), masked(all, at + 12, len));
    records.push_back(all.substr(at + 12, len));
    at += 12 + len + 4;
  }
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // Event.step (field 2, varint) follows the 9 bytes of wall_time.
  EXPECT_EQ(records[1][9], 0x10);
  EXPECT_EQ(records[1][10], 7);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  float v = 0;
  size_t tag = records[2].find("eval/accuracy");
  ASSERT_NE(tag, std::string::npos);
  ASSERT_EQ(records[2][tag + 13], 0x15);  // simple_value: field 2, 32-bit
  std::memcpy(&v, records[2].data() + tag + 14, 4);
  EXPECT_EQ(v, 0.875f);
  fs::remove_all(dir);
}

TEST(TensorBoard, UnusableDirectoryIsAnInputError) {
  fs::path file = fresh_dir("blocker");
  std::ofstream(file) << "x";
  try {
    TensorBoardWriter w(file.string());
    FAIL() << "expected an error";
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.kind(), tandem::Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  fs::remove(file);
}

TEST(TensorBoard, ALinkPlantedAtTheEventFileNameIsNotFollowed) {
  // The event file's name is predictable (time, host, pid): links wait under the next few seconds' names.
  fs::path dir = fresh_dir("planted");
  fs::create_directories(dir);
  std::ofstream(dir / "victim") << "not yours";
  char host[HOST_NAME_MAX + 1] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto t = now; t < now + 5; ++t)
    fs::create_symlink(dir / "victim", dir / ("events.out.tfevents." + std::to_string(t) + "." + host + "." +
                                              std::to_string(getpid())));
  try {
    TensorBoardWriter w(dir.string());
    w.scalar("train/loss", 0.5, 1);
    w.flush();
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(w.path()))) << w.path();
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.kind(), tandem::Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
  std::ifstream f(dir / "victim");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()), "not yours");
  fs::remove_all(dir);
}
