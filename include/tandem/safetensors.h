#pragma once
// safetensors files (Hugging Face's tensor format): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the bytes. Read by memory-mapping the file, every
// entry checked against the header and the file's size before any is used; written whole and renamed into
// place. A model saved in several files is read through its index (model.safetensors.index.json).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/tensor.h"

namespace tandem {

/// One tensor of a safetensors file: its name, the dtype the file stores ("F32", "BF16", ...), shape and bytes.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  Shape shape;
  const unsigned char* data = nullptr;  // inside the mapping, valid while the file object lives
  uint64_t nbytes = 0;
};

/// A safetensors file, memory-mapped and checked: the header is JSON of the format's shape, every entry's dtype is
/// one tandem reads (F64, F32, F16, BF16, I64, I32, U8, BOOL as U8), its byte range lies inside the file, holds
/// exactly shape x dtype size bytes and overlaps no other. Throws tandem::Error (Input) naming the file and what
/// is wrong (not a safetensors file, truncated, a bad entry).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  /// The header's __metadata__ (string to string).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The entry as a CPU tensor of `dtype` (converted from the file's; a copy, so it outlives the file).
  Tensor tensor(const SafetensorsEntry& e, DType dtype) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// The safetensors files of a model directory: model.safetensors, or the files model.safetensors.index.json's
/// weight_map names (each tensor looked up in its own file). Throws tandem::Error (Input) naming the directory
/// and what is missing: no model file, an index that is not JSON or names a file that is not there, a tensor the
/// index places in a file that does not hold it.
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::string& dir);
  /// Every tensor name, in file order (index order across files).
  std::vector<std::string> names() const;
  const SafetensorsEntry* find(const std::string& name) const;
  /// find(name) converted to `dtype` on the CPU; throws naming the tensor when it is missing.
  Tensor tensor(const std::string& name, DType dtype) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::pair<const SafetensorsEntry*, const SafetensorsFile*>> order_;
  std::map<std::string, std::pair<const SafetensorsEntry*, const SafetensorsFile*>> by_name_;
};

/// Writes tensors (any device; each written as its own dtype, contiguous) with the given metadata to path, as a
/// new file renamed over path (a failure leaves no partial file).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// "F32" for DType::f32, and so on.
const char* safetensors_dtype(DType t);

}  // namespace tandem
