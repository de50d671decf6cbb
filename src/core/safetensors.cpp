// safetensors files: memory-mapped reading with every entry checked, sharded models through their index,
// atomic writing.
#include "tandem/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/safe_file.h"
#include "tandem/error.h"

namespace tandem {

namespace {

using Json = nlohmann::json;

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw Error(Error::Kind::Input, "safetensors file '" + path + "': " + why);
}

size_t dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64") return 8;
  if (d == "F32" || d == "I32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  if (d == "U8" || d == "BOOL") return 1;
  return 0;
}

DType dtype_of(const std::string& d) {
  if (d == "F64") return DType::f64;
  if (d == "F32") return DType::f32;
  if (d == "F16") return DType::f16;
  if (d == "BF16") return DType::bf16;
  if (d == "I64") return DType::i64;
  if (d == "I32") return DType::i32;
  return DType::u8;
}

}  // namespace

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  return "F32";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  io::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) bad(path, std::string("cannot be opened (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) bad(path, "is not a regular file");
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) bad(path, "is " + std::to_string(size_) + " bytes long: too short for the 8-byte header length");
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    bad(path, std::string("cannot be mapped (") + std::strerror(errno) + ")");
  }
  const auto* bytes = static_cast<const unsigned char*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len == 0 || header_len > size_ - 8)
    bad(path, "its header length " + std::to_string(header_len) + " does not fit the file's " + std::to_string(size_) +
                  " bytes (truncated, or not a safetensors file)");
  Json header;
  try {
    header = Json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const Json::exception& e) {
    bad(path, std::string("its header is not JSON (") + e.what() + "): not a safetensors file?");
  }
  if (!header.is_object()) bad(path, "its header is not a JSON object");
  const uint64_t data_start = 8 + header_len, data_size = size_ - data_start;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      if (e.is_object())
        for (const auto& [k, v] : e.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    SafetensorsEntry entry;
    entry.name = name;
    try {
      entry.dtype = e.at("dtype").get<std::string>();
      for (const Json& d : e.at("shape")) {
        const int64_t n = d.get<int64_t>();
        if (n < 0) bad(path, "tensor '" + name + "' has a negative dimension");
        entry.shape.push_back(n);
      }
      const Json& off = e.at("data_offsets");
      if (!off.is_array() || off.size() != 2) bad(path, "tensor '" + name + "' has malformed data_offsets");
      const uint64_t a = off[0].get<uint64_t>(), b = off[1].get<uint64_t>();
      if (a > b || b > data_size)
        bad(path, "tensor '" + name + "' lies at bytes " + std::to_string(a) + " to " + std::to_string(b) +
                      " of a data section of " + std::to_string(data_size) + " (a truncated file?)");
      const size_t esize = dtype_bytes(entry.dtype);
      if (esize == 0) bad(path, "tensor '" + name + "' has the dtype " + entry.dtype + ", which tandem does not read");
      uint64_t numel = 1;
      for (int64_t n : entry.shape) numel *= static_cast<uint64_t>(n);
      if (numel * esize != b - a)
        bad(path, "tensor '" + name + "' of shape " + shape_str(entry.shape) + " and dtype " + entry.dtype + " needs " +
                      std::to_string(numel * esize) + " bytes but its range holds " + std::to_string(b - a));
      entry.data = bytes + data_start + a;
      entry.nbytes = b - a;
      if (b > a) ranges.emplace_back(a, b);
    } catch (const Json::exception& ex) {
      bad(path, "tensor '" + name + "' has a malformed entry (" + ex.what() + ")");
    }
    entries_.push_back(std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) bad(path, "two tensors' byte ranges overlap");
  // The header's order is JSON's (sorted by name); file order is by offset.
  std::sort(entries_.begin(), entries_.end(),
            [](const SafetensorsEntry& x, const SafetensorsEntry& y) { return x.data < y.data || (x.data == y.data && x.name < y.name); });
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& e, DType dtype) const {
  Tensor raw = Tensor::empty(e.shape, dtype_of(e.dtype), Device::cpu());
  if (e.nbytes) std::memcpy(raw.data_ptr(), e.data, e.nbytes);
  return raw.dtype() == dtype ? raw : raw.to(dtype);
}

SafetensorsModel::SafetensorsModel(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir), single = d / "model.safetensors", index = d / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::is_directory(d, ec))
    throw Error(Error::Kind::Input, "'" + dir + "' is not a directory (a Hugging Face model directory holds config.json "
                                    "and model.safetensors)");
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    Json j;
    try {
      j = Json::parse(in);
    } catch (const Json::exception& e) {
      throw Error(Error::Kind::Input, "'" + index.string() + "' is not JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(Error::Kind::Input, "'" + index.string() + "' has no weight_map object");
    std::map<std::string, const SafetensorsFile*> opened;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw Error(Error::Kind::Input, "'" + index.string() + "' maps '" + name + "' to " + file.dump());
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == "." || f == "..")
        throw Error(Error::Kind::Input, "'" + index.string() + "' names the file '" + f + "' outside the model directory");
      if (!opened.count(f)) {
        if (!fs::exists(d / f, ec))
          throw Error(Error::Kind::Input, "'" + index.string() + "' places tensor '" + name + "' in '" + f +
                                              "', which is not in " + dir + " (an incomplete download?)");
        files_.push_back(std::make_unique<SafetensorsFile>((d / f).string()));
        opened[f] = files_.back().get();
      }
      const SafetensorsFile* sf = opened[f];
      const SafetensorsEntry* e = sf->find(name);
      if (!e)
        throw Error(Error::Kind::Input, "'" + index.string() + "' places tensor '" + name + "' in '" + f +
                                            "', which does not hold it");
      by_name_[name] = {e, sf};
    }
    for (const auto& f : files_)
      for (const SafetensorsEntry& e : f->entries())
        if (by_name_.count(e.name)) order_.push_back(by_name_[e.name]);
    return;
  }
  if (!fs::exists(single, ec))
    throw Error(Error::Kind::Input, "'" + dir + "' holds neither model.safetensors nor model.safetensors.index.json");
  files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
  for (const SafetensorsEntry& e : files_[0]->entries()) {
    by_name_[e.name] = {&e, files_[0].get()};
    order_.push_back({&e, files_[0].get()});
  }
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (const auto& [e, f] : order_) out.push_back(e->name);
  return out;
}

const SafetensorsEntry* SafetensorsModel::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second.first;
}

Tensor SafetensorsModel::tensor(const std::string& name, DType dtype) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    throw Error(Error::Kind::Input, "the model in '" + dir_ + "' has no tensor '" + name + "'");
  return it->second.second->tensor(*it->second.first, dtype);
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  uint64_t offset = 0;
  std::vector<Tensor> host;
  for (const auto& [name, t] : tensors) {
    TANDEM_CHECK(!header.contains(name), "write_safetensors: the tensor name '", name, "' appears twice");
    host.push_back(t.detach().contiguous().cpu());
    const uint64_t n = host.back().nbytes();
    header[name] = {{"dtype", safetensors_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string head = header.dump();
  head.resize((head.size() + 7) / 8 * 8, ' ');  // the format pads the header with spaces to 8 bytes
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(head.size()) >> (8 * i)) & 0xff);
  io::write_file_atomically(path, "safetensors file", [&](int fd) {
    io::write_all(fd, len, sizeof len, path, "safetensors file");
    io::write_all(fd, head.data(), head.size(), path, "safetensors file");
    for (const Tensor& t : host) io::write_all(fd, t.data_ptr(), t.nbytes(), path, "safetensors file");
  });
}

}  // namespace tandem
