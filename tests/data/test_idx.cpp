// The IDX reader on well-formed and damaged files, raw and gzip-compressed.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>

#include "data_test_util.h"
#include "tandem/data/dataset.h"

namespace tandem::data {
namespace {

using testutil::Bytes;
using testutil::expect_input_error;
using testutil::TempDir;

TEST(ReadIdx, RawImagesKeepDimsAndBytes) {
  TempDir dir;
  Bytes data = testutil::noise(5 * 4 * 3, 1);
  std::string path = dir.file("imgs-idx3-ubyte");
  testutil::write_file(path, testutil::idx_bytes({5, 4, 3}, data));
  Tensor t = read_idx(path);
  EXPECT_EQ(t.dtype(), DType::u8);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.shape(), (Shape{5, 4, 3}));
  EXPECT_EQ(t.to_vector<uint8_t>(), data);
}

TEST(ReadIdx, RawLabelsOneDim) {
  TempDir dir;
  Bytes data = {3, 1, 4, 1, 5, 9, 2, 6};
  std::string path = dir.file("labels");
  testutil::write_file(path, testutil::idx_bytes({8}, data));
  Tensor t = read_idx(path);
  EXPECT_EQ(t.shape(), (Shape{8}));
  EXPECT_EQ(t.to_vector<uint8_t>(), data);
}

TEST(ReadIdx, GzipDetectedFromContentNotName) {
  TempDir dir;
  // Larger than the reader's 1 MiB input buffer and incompressible, so the stream spans many refills.
  Bytes data = testutil::noise(3 * 1000 * 1000, 2);
  std::string path = dir.file("no-gz-suffix");
  testutil::write_file(path, testutil::gzip(testutil::idx_bytes({3000, 1000}, data)));
  Tensor t = read_idx(path);
  EXPECT_EQ(t.shape(), (Shape{3000, 1000}));
  EXPECT_EQ(t.to_vector<uint8_t>(), data);
}

TEST(ReadIdx, CompressibleGzip) {
  TempDir dir;
  Bytes data(60 * 28 * 28);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i / 28) % 7 * 30);
  std::string path = dir.file("x.gz");
  testutil::write_file(path, testutil::gzip(testutil::idx_bytes({60, 28, 28}, data), 9));
  EXPECT_EQ(read_idx(path).to_vector<uint8_t>(), data);
}

TEST(ReadIdx, ConcatenatedGzipMembers) {
  TempDir dir;
  Bytes data = testutil::noise(4 * 1000, 3);
  Bytes whole = testutil::idx_bytes({4, 1000}, data);
  Bytes first(whole.begin(), whole.begin() + 1234), second(whole.begin() + 1234, whole.end());
  Bytes gz = testutil::gzip(first);
  Bytes gz2 = testutil::gzip(second);
  gz.insert(gz.end(), gz2.begin(), gz2.end());
  std::string path = dir.file("multi.gz");
  testutil::write_file(path, gz);
  EXPECT_EQ(read_idx(path).to_vector<uint8_t>(), data);
}

TEST(ReadIdx, MissingFileIsNamed) {
  TempDir dir;
  std::string path = dir.file("absent-idx1-ubyte");
  expect_input_error([&] { read_idx(path); }, {path, "does not exist"});
}

TEST(ReadIdx, DirectoryInsteadOfFile) {
  TempDir dir;
  expect_input_error([&] { read_idx(dir.path()); }, {dir.path(), "directory"});
}

TEST(ReadIdx, TruncatedRawReportsExpectedAndFound) {
  TempDir dir;
  Bytes file = testutil::idx_bytes({10, 28, 28}, testutil::noise(10 * 28 * 28, 4));
  file.resize(file.size() - 100);
  std::string path = dir.file("short");
  testutil::write_file(path, file);
  // 16 header bytes + 7840 data bytes were announced; 100 are missing.
  expect_input_error([&] { read_idx(path); }, {path, "truncated", "7840", std::to_string(16 + 7840 - 100)});
}

TEST(ReadIdx, TruncatedHeader) {
  TempDir dir;
  Bytes file = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0};
  std::string path = dir.file("hdr");
  testutil::write_file(path, file);
  expect_input_error([&] { read_idx(path); }, {path, "truncated", "header"});
}

TEST(ReadIdx, EmptyFile) {
  TempDir dir;
  std::string path = dir.file("empty");
  testutil::write_file(path, {});
  expect_input_error([&] { read_idx(path); }, {path, "truncated"});
}

TEST(ReadIdx, TruncatedGzipStream) {
  TempDir dir;
  Bytes gz = testutil::gzip(testutil::idx_bytes({100, 100}, testutil::noise(10000, 5)));
  gz.resize(gz.size() / 2);
  std::string path = dir.file("cut.gz");
  testutil::write_file(path, gz);
  expect_input_error([&] { read_idx(path); }, {path, "truncated", "need 10000 bytes", "cut short"});
}

TEST(ReadIdx, GzipMissingItsTrailer) {
  TempDir dir;
  Bytes gz = testutil::gzip(testutil::idx_bytes({100}, testutil::noise(100, 8)));
  gz.resize(gz.size() - 8);  // CRC-32 and length gone, every data byte still there
  std::string path = dir.file("no-trailer.gz");
  testutil::write_file(path, gz);
  expect_input_error([&] { read_idx(path); }, {path, "truncated", "cut short"});
}

TEST(ReadIdx, GzipWithShortPayloadReportsBytes) {
  TempDir dir;
  // A complete gzip stream whose IDX content is shorter than its header says.
  Bytes file = testutil::idx_bytes({10, 10}, testutil::noise(60, 6));
  std::string path = dir.file("short-payload.gz");
  testutil::write_file(path, testutil::gzip(file));
  expect_input_error([&] { read_idx(path); }, {path, "truncated", "100", "found 60"});
}

TEST(ReadIdx, CorruptGzip) {
  TempDir dir;
  Bytes gz = testutil::gzip(testutil::idx_bytes({100, 100}, testutil::noise(10000, 7)));
  for (size_t i = gz.size() / 3; i < gz.size() / 3 + 64; ++i) gz[i] ^= 0x5a;
  std::string path = dir.file("bad.gz");
  testutil::write_file(path, gz);
  expect_input_error([&] { read_idx(path); }, {path, "corrupt"});
}

TEST(ReadIdx, CorruptGzipChecksum) {
  TempDir dir;
  Bytes gz = testutil::gzip(testutil::idx_bytes({16}, Bytes(16, 1)));
  gz[gz.size() - 6] ^= 0xff;  // inside the CRC-32 of the trailer
  std::string path = dir.file("crc.gz");
  testutil::write_file(path, gz);
  expect_input_error([&] { read_idx(path); }, {path, "corrupt"});
}

TEST(ReadIdx, WrongMagic) {
  TempDir dir;
  Bytes file = testutil::idx_bytes({4}, {1, 2, 3, 4});
  file[0] = 0x12;
  std::string path = dir.file("magic");
  testutil::write_file(path, file);
  expect_input_error([&] { read_idx(path); }, {path, "wrong magic number", "0x12000801"});
}

TEST(ReadIdx, UnsupportedElementType) {
  TempDir dir;
  Bytes file = testutil::idx_bytes({4}, {1, 2, 3, 4});
  file[2] = 0x0d;  // float
  std::string path = dir.file("floats");
  testutil::write_file(path, file);
  expect_input_error([&] { read_idx(path); }, {path, "0x0d", "unsigned bytes"});
}

TEST(ReadIdx, TrailingBytes) {
  TempDir dir;
  Bytes file = testutil::idx_bytes({4}, {1, 2, 3, 4});
  file.push_back(9);
  file.push_back(9);
  std::string path = dir.file("long");
  testutil::write_file(path, file);
  expect_input_error([&] { read_idx(path); }, {path, "2 unexpected bytes"});
}

TEST(ReadIdx, ImpossibleDimsInGzipRejectedBeforeAllocation) {
  TempDir dir;
  Bytes file = testutil::idx_bytes({0xffffffffu, 0xffffffffu}, {1, 2, 3});
  std::string path = dir.file("huge.gz");
  testutil::write_file(path, testutil::gzip(file));
  expect_input_error([&] { read_idx(path); }, {path, "[4294967295, 4294967295]"});
}


TEST(ReadIdx, FifoIsRefusedWithoutBlocking) {
  TempDir dir;
  std::string path = dir.file("train-labels-idx1-ubyte");
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  auto t0 = std::chrono::steady_clock::now();
  expect_input_error([&] { read_idx(path); }, {path, "not a regular file", "FIFO"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(ReadIdx, DeviceIsRefused) {
  expect_input_error([&] { read_idx("/dev/zero"); }, {"/dev/zero", "not a regular file", "device"});
}

TEST(ReadIdx, GzipTrailingDataIsNotInflatedInFull) {
  // 4 announced bytes, then 16 MiB of zeros that deflate into about 16 KiB: the reader stops after
  // probing 1 MiB of them rather than inflate a thousand times the file's size.
  TempDir dir;
  Bytes file = testutil::idx_bytes({4}, {1, 2, 3, 4});
  file.resize(file.size() + (size_t{16} << 20), 0);
  std::string path = dir.file("bomb.gz");
  testutil::write_file(path, testutil::gzip(file, 9));
  expect_input_error([&] { read_idx(path); }, {path, "more than 1048576 unexpected bytes"});
}


TEST(ReadIdx, ZeroDimBesideHugeDimsIsRefused) {
  // No data bytes, but strides of 2^92 elements: found by fuzzing.
  TempDir dir;
  std::string path = dir.file("zero");
  testutil::write_file(path, testutil::idx_bytes({0, 0x56565656u, 0x56565656u, 0x56565656u}, {}));
  expect_input_error([&] { read_idx(path); }, {path, "dims"});
}

}  // namespace
}  // namespace tandem::data
