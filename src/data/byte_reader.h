#pragma once
// Internal: sequential reading of a data file that may be gzip-compressed, detected from its first
// bytes, with errors that name the file.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <zlib.h>

namespace tandem::data {

/// Reads a raw or gzip-compressed file front to back. Decompression streams straight into the
/// caller's buffer, so a large file is never held twice.
class ByteReader {
 public:
  /// Opens path; throws tandem::Error (Input) naming it when it is missing or unreadable.
  explicit ByteReader(std::string path);
  ~ByteReader();
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  /// Reads up to n bytes into dst; returns fewer only at the end of the data (or where it is cut short).
  size_t read(void* dst, size_t n);
  /// Reads and counts what is left, stopping once more than limit bytes were seen (so trailing
  /// garbage is reported without inflating all of it).
  uint64_t count_remaining(uint64_t limit);
  /// True once the data ended because the file stops inside a gzip member (a truncated download).
  bool cut_short() const { return cut_short_; }
  /// True for a gzip-compressed file.
  bool compressed() const { return gz_; }
  /// Bytes of the file on disk.
  uint64_t file_size() const { return file_size_; }
  /// Most data bytes the file can yield: its size when raw, the deflate expansion limit when gzip.
  uint64_t max_data_bytes() const;
  const std::string& path() const { return path_; }

 private:
  size_t read_raw(unsigned char* dst, size_t n);
  size_t read_gz(unsigned char* dst, size_t n);
  void refill();

  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t file_size_ = 0;
  bool gz_ = false;
  bool eof_ = false;          // the file has no more bytes to give
  bool member_done_ = false;  // the current gzip member ended; another may follow
  bool finished_ = false;     // all data has been delivered
  bool cut_short_ = false;    // the file ended before its last gzip member did
  uint64_t produced_ = 0;     // data bytes delivered so far
  std::vector<unsigned char> in_;
  size_t in_pos_ = 0, in_len_ = 0;  // unread part of in_ (raw mode)
  z_stream zs_{};
  bool zs_ready_ = false;
};

/// The whole content of a raw or gzip-compressed file.
std::vector<uint8_t> read_all(const std::string& path);

}  // namespace tandem::data
