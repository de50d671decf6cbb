#pragma once
// Internal: TensorBoard event files (what `--tensorboard DIR` writes). The format is TFRecord framing
// (length, masked CRC-32C of the length, data, masked CRC-32C of the data) around Event protobufs
// holding scalar summaries; the few protobuf fields needed are encoded here directly.
#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem::cli {

/// CRC-32C (Castagnoli), the checksum TFRecord framing uses.
uint32_t crc32c(const void* data, size_t n);

/// Appends scalar events to a new event file in a directory that TensorBoard can be pointed at.
class TensorBoardWriter {
 public:
  /// Creates dir when missing and a new file `events.out.tfevents.<time>.<host>.<pid>` in it;
  /// throws tandem::Error (Input) when that is impossible or anything (a file, a link) has that name.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// Records value under tag (e.g. "train/loss") at step.
  void scalar(const std::string& tag, double value, int64_t step);
  /// Pushes what was written to the file, so that a running TensorBoard sees it.
  void flush();
  /// The event file's path.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tandem::cli
