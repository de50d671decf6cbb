#include "cli/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/safe_file.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace {

// Reflected CRC-32C table, polynomial 0x82F63B78, built at compile time.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? 0x82F63B78u : 0u);
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_table();

// TFRecord stores checksums "masked" so that a CRC of data holding CRCs stays well distributed.
uint32_t masked_crc(const void* p, size_t n) {
  uint32_t c = crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}

// Protobuf field keys: (field number << 3) | wire type (0 varint, 1 64-bit, 2 bytes, 5 32-bit).
void put_bytes_field(std::string& s, int field, const std::string& bytes) {
  put_varint(s, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(s, bytes.size());
  s += bytes;
}

// An Event message: wall_time (1, double), step (2, int64), then one more field already encoded.
std::string event(double wall_time, int64_t step, const std::string& rest) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, 8);
  put_varint(e, 1 << 3 | 1);
  put_le(e, bits, 8);
  put_varint(e, 2 << 3 | 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e + rest;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TANDEM_CHECK(std::filesystem::is_directory(dir, ec), "--tensorboard '", dir, "' is not a directory and cannot be created",
               ec ? ": " + ec.message() : std::string());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // TensorBoard finds event files by the "tfevents" in their name; the pid keeps ranks' files apart.
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
                                         "." + host + "." + std::to_string(getpid())))
              .string();
  // Created exclusively: a link planted at this predictable name is refused, never written through.
  io::UniqueFd fd = io::create_new_file(path_, "TensorBoard event file");
  file_ = fdopen(fd.get(), "wb");
  TANDEM_RUNTIME_CHECK(file_ != nullptr, "cannot write the TensorBoard event file '", path_, "': ",
                       std::strerror(errno));
  fd.release();
  std::string version;
  put_bytes_field(version, 3, "brain.Event:2");  // file_version: what readers check first
  write_record(event(now_seconds(), 0, version));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v;  // Summary.Value: tag (1), simple_value (2, float)
  put_bytes_field(v, 1, tag);
  float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  put_varint(v, 2 << 3 | 5);
  put_le(v, bits, 4);
  std::string summary;  // Summary: value (1)
  put_bytes_field(summary, 1, v);
  std::string rest;  // Event.summary (5)
  put_bytes_field(rest, 5, summary);
  write_record(event(now_seconds(), step, rest));
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  put_le(rec, data.size(), 8);
  put_le(rec, masked_crc(rec.data(), 8), 4);
  rec += data;
  put_le(rec, masked_crc(data.data(), data.size()), 4);
  // Write errors stick to the stream and are reported by the next flush.
  std::fwrite(rec.data(), 1, rec.size(), file_);
}

void TensorBoardWriter::flush() {
  TANDEM_RUNTIME_CHECK(std::fflush(file_) == 0 && !std::ferror(file_), "writing the TensorBoard event file '", path_,
                       "' failed: ", std::strerror(errno));
}

}  // namespace tandem::cli
