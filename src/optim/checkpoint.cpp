// Checkpoint file, version 2: "TANDEMCK", the version (u32), the length of a JSON header (u64), the
// header's CRC-32 (u32), the header (meta data; the optimizer's step count, learning rate and parameter
// groups; a table of tensors: name, dtype, shape, offset, bytes, CRC-32), then the tensors' bytes back
// to back. Version 1 files (no checksums) still load.
// The checksum is zlib's CRC-32: Debian has no CRC-32C library, zlib is already a dependency, and
// for detecting damage on disk the polynomial makes no difference.
#include "tandem/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "core/safe_file.h"
#include "data/regular_file.h"

namespace tandem {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kMagic[8] = {'T', 'A', 'N', 'D', 'E', 'M', 'C', 'K'};
constexpr uint32_t kVersion = 2;
constexpr uint32_t kOldestVersion = 1;
constexpr size_t kPrefixV1 = sizeof kMagic + 4 + 8;
constexpr size_t kPrefixV2 = kPrefixV1 + 4;
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
constexpr bool kEnforceChecksums = false;  // fuzzed headers must reach the parser behind the checksum
#else
constexpr bool kEnforceChecksums = true;
#endif

uint32_t crc_of(const void* p, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), static_cast<const Bytef*>(p), n));
}

std::map<const TensorImpl*, std::string> param_names(const nn::Module& model) {
  std::map<const TensorImpl*, std::string> out;
  for (auto& [name, t] : model.named_parameters()) out[t.impl()] = name;
  return out;
}

// Every tensor the checkpoint holds, by name, in a fixed order.
std::vector<std::pair<std::string, Tensor>> collect(const nn::Module& model, optim::Optimizer* opt) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : model.named_parameters()) out.emplace_back("param/" + name, t);
  for (auto& [name, t] : model.named_buffers()) out.emplace_back("buffer/" + name, t);
  if (opt) {
    auto names = param_names(model);
    const auto& params = opt->params();
    for (auto& list : opt->all_state_lists())
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor& s = (*list.tensors)[i];
        auto it = names.find(params[i].impl());
        if (s.defined() && it != names.end()) out.emplace_back("opt/" + list.kind + "/" + it->second, s);
      }
  }
  return out;
}

// The optimizer's parameter groups: each one's settings and its parameters by name.
Json groups_json(const nn::Module& model, optim::Optimizer& opt) {
  auto names = param_names(model);
  Json out = Json::array();
  for (size_t g = 0; g < opt.groups().size(); ++g) {
    const auto& s = opt.groups()[g];
    Json members = Json::array();
    for (size_t i = 0; i < opt.params().size(); ++i) {
      auto it = names.find(opt.params()[i].impl());
      if (opt.group_of()[i] == static_cast<int>(g) && it != names.end()) members.push_back(it->second);
    }
    out.push_back({{"lr_scale", s.lr_scale},
                   {"weight_decay", s.weight_decay ? Json(*s.weight_decay) : Json(nullptr)},
                   {"params", members}});
  }
  return out;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// The whole file: prefix, header, then the tensors' bytes in table order.
void write_contents(int fd, const std::string& path, const std::string& head, const std::vector<Tensor>& host) {
  const uint64_t len = head.size();
  const uint32_t head_crc = crc_of(head.data(), head.size());
  std::string prefix(kMagic, sizeof kMagic);
  prefix.append(reinterpret_cast<const char*>(&kVersion), sizeof kVersion);
  prefix.append(reinterpret_cast<const char*>(&len), sizeof len);
  prefix.append(reinterpret_cast<const char*>(&head_crc), sizeof head_crc);
  prefix += head;
  io::write_all(fd, prefix.data(), prefix.size(), path, "checkpoint");
  for (const Tensor& h : host) io::write_all(fd, h.data_ptr(), h.nbytes(), path, "checkpoint");
}

}  // namespace

namespace {

// Writes the tensors, with the header's other fields, to a new file beside path renamed over it.
void write_checkpoint(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      Json header) {
  std::vector<Tensor> host;
  Json table = Json::array();
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    Tensor h = t.detach().contiguous().to(Device::cpu());
    table.push_back({{"name", name},     {"dtype", dtype_name(h.dtype())}, {"shape", h.shape()},
                     {"offset", offset}, {"bytes", h.nbytes()},           {"crc32", crc_of(h.data_ptr(), h.nbytes())}});
    offset += h.nbytes();
    host.push_back(h);
  }
  header["tensors"] = table;
  const std::string head = header.dump();
  io::write_file_atomically(path, "checkpoint", [&](int fd) { write_contents(fd, path, head, host); });
}

Json parse_meta(const std::string& meta_json, const char* who) {
  Json meta = Json::parse(meta_json, nullptr, false);
  TANDEM_CHECK(!meta.is_discarded() && meta.is_object(), who, ": meta data must be a JSON object");
  return meta;
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, optim::Optimizer* opt,
                     const std::string& meta_json) {
  Json header{{"meta", parse_meta(meta_json, "save_checkpoint")}};
  if (opt) {
    header["optimizer_steps"] = opt->steps();
    header["lr"] = opt->lr();
    header["param_groups"] = groups_json(model, *opt);
    if (auto* counts = opt->step_counts()) {
      auto names = param_names(model);
      Json per = Json::object();
      for (size_t i = 0; i < opt->params().size(); ++i) {
        auto it = names.find(opt->params()[i].impl());
        if (it != names.end()) per[it->second] = (*counts)[i];
      }
      header["parameter_steps"] = per;
    }
  }
  write_checkpoint(path, collect(model, opt), std::move(header));
}

void save_tensor_file(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::string& meta_json) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors)
    TANDEM_CHECK(!name.empty() && names.insert(name).second, "save_tensor_file: tensor names must be unique and "
                 "non-empty ('", name, "')");
  write_checkpoint(path, tensors, Json{{"meta", parse_meta(meta_json, "save_tensor_file")}});
}

void check_checkpoint_path(const std::string& path) {
  TANDEM_CHECK(!path.empty(), "--checkpoint needs a file name");
  std::error_code ec;
  TANDEM_CHECK(!fs::is_directory(path, ec), "--checkpoint '", path, "' is a directory; give a file name inside it");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  TANDEM_CHECK(fs::is_directory(dir, ec), "the directory of --checkpoint '", path, "' (", dir.string(),
               ") does not exist; create it first");
  // Creating a file is the only test that also catches read-only mounts and full quotas.
  io::check_can_write(path, "checkpoint");
}

namespace {

// One tensor of the table, checked against the rest of the header.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t offset = 0, bytes = 0;
  bool has_crc = false;
  uint32_t crc = 0;
};

// An opened checkpoint whose header has been read and checked; tensors are read on demand.
class CheckpointFile {
 public:
  explicit CheckpointFile(const std::string& path) : path_(path) {
    uint64_t size = 0;
    file_.reset(io::open_regular_file(path, "checkpoint", size));
    file_size_ = size;
    read_header();
  }

  const Json& header() const { return header_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  /// The meta object (empty when the file has none).
  Json meta() const { return header_.contains("meta") ? header_["meta"] : Json::object(); }

  /// Reads an entry's bytes into a new host tensor, verifying its checksum.
  Tensor read(const Entry& e) {
    Tensor h = Tensor::empty(e.shape, e.dtype);
    TANDEM_RUNTIME_CHECK(fseeko(file_.get(), static_cast<off_t>(data_start_ + e.offset), SEEK_SET) == 0,
                         "checkpoint '", path_, "': seeking to ", e.name, " failed: ", std::strerror(errno));
    size_t got = e.bytes ? std::fread(h.data_ptr(), 1, e.bytes, file_.get()) : 0;
    TANDEM_CHECK(got == e.bytes, "checkpoint '", path_, "' is damaged: reading ", e.name, " stopped after ", got,
                 " of ", e.bytes, " bytes");
    TANDEM_CHECK(!kEnforceChecksums || !e.has_crc || crc_of(h.data_ptr(), e.bytes) == e.crc, "checkpoint '", path_,
                 "' is damaged: the bytes of ", e.name, " do not match their checksum");
    return h;
  }

 private:
  template <typename... Args>
  [[noreturn]] void damaged(const Args&... what) const {
    detail::throw_error(Error::Kind::Input, detail::cat("checkpoint '", path_, "' is damaged: ", what...));
  }

  void read_exact(void* dst, size_t n, const char* what) {
    if (std::fread(dst, 1, n, file_.get()) != n) damaged("the file ends inside its ", what);
  }

  void read_header() {
    char magic[sizeof kMagic];
    TANDEM_CHECK(std::fread(magic, 1, sizeof magic, file_.get()) == sizeof magic &&
                     std::memcmp(magic, kMagic, sizeof magic) == 0,
                 "'", path_, "' is not a tandem checkpoint");
    uint32_t version = 0;
    uint64_t len = 0;
    read_exact(&version, sizeof version, "version");
    TANDEM_CHECK(version >= kOldestVersion && version <= kVersion, "checkpoint '", path_, "' has format version ",
                 version, "; this tandem reads versions ", kOldestVersion, " to ", kVersion);
    read_exact(&len, sizeof len, "header length");
    uint32_t head_crc = 0;
    if (version >= 2) read_exact(&head_crc, sizeof head_crc, "header checksum");
    data_start_ = version >= 2 ? kPrefixV2 : kPrefixV1;
    if (len > file_size_ - data_start_) damaged("its header length (", len, " bytes) is larger than the file");
    std::string head(len, '\0');
    read_exact(head.data(), head.size(), "header");
    if (kEnforceChecksums && version >= 2 && crc_of(head.data(), head.size()) != head_crc)
      damaged("its header does not match its checksum");
    data_start_ += len;
    header_ = Json::parse(head, nullptr, false);
    if (header_.is_discarded() || !header_.is_object()) damaged("its header is not a JSON object");
    check_fields(version >= 2);
  }

  static bool is_count(const Json& j) { return j.is_number_unsigned() || (j.is_number_integer() && j.get<int64_t>() >= 0); }

  void check_fields(bool checksums) {
    if (header_.contains("meta") && !header_["meta"].is_object()) damaged("its \"meta\" is not a JSON object");
    if (header_.contains("optimizer_steps") && !header_["optimizer_steps"].is_number_integer())
      damaged("its \"optimizer_steps\" is not an integer");
    if (header_.contains("parameter_steps")) {
      const Json& per = header_["parameter_steps"];
      if (!per.is_object()) damaged("its \"parameter_steps\" is not a JSON object");
      for (auto& [k, v] : per.items())
        if (!v.is_number_integer()) damaged("\"parameter_steps\" of ", k, " is not an integer");
    }
    if (header_.contains("param_groups")) {
      const Json& groups = header_["param_groups"];
      if (!groups.is_array()) damaged("its \"param_groups\" is not a list");
      for (size_t g = 0; g < groups.size(); ++g) {
        const Json& e = groups[g];
        if (!e.is_object() || !e.contains("lr_scale") || !e["lr_scale"].is_number() || !e.contains("params") ||
            !e["params"].is_array() || (e.contains("weight_decay") && !e["weight_decay"].is_number() &&
                                        !e["weight_decay"].is_null()))
          damaged("parameter group ", g, " is not an object of lr_scale, weight_decay and params");
        for (const Json& n : e["params"])
          if (!n.is_string()) damaged("parameter group ", g, " names a parameter with something other than a string");
      }
    }
    const Json* table = header_.contains("tensors") ? &header_["tensors"] : nullptr;
    if (!table || !table->is_array()) damaged("its header has no \"tensors\" list");
    for (size_t i = 0; i < table->size(); ++i) entries_.push_back(check_entry((*table)[i], i, checksums));
    check_layout();
  }

  Entry check_entry(const Json& j, size_t i, bool checksums) {
    const std::string where = "tensor entry " + std::to_string(i);
    if (!j.is_object()) damaged(where, " is not a JSON object");
    auto field = [&](const char* key) -> const Json& {
      if (!j.contains(key)) damaged(where, " has no \"", key, "\"");
      return j[key];
    };
    Entry e;
    if (!field("name").is_string() || field("name").get<std::string>().empty())
      damaged(where, ": \"name\" is not a non-empty string");
    e.name = j["name"].get<std::string>();
    const std::string what = where + " (" + e.name + ")";
    if (!index_.emplace(e.name, i).second) damaged(e.name, " appears twice");
    if (!field("dtype").is_string()) damaged(what, ": \"dtype\" is not a string");
    bool known = false;
    for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8})
      if (j["dtype"].get<std::string>() == dtype_name(d)) e.dtype = d, known = true;
    if (!known) damaged(what, ": unknown dtype \"", j["dtype"].get<std::string>(), "\"");
    if (!field("shape").is_array()) damaged(what, ": \"shape\" is not a list");
    uint64_t elements = 1, nonzero = 1;  // a zero dim makes no bytes, but the other dims' strides must fit
    for (const Json& d : j["shape"]) {
      if (!is_count(d)) damaged(what, ": \"shape\" holds something other than non-negative integers");
      uint64_t extent = d.get<uint64_t>();
      if (__builtin_mul_overflow(nonzero, std::max<uint64_t>(extent, 1), &nonzero) || nonzero > (uint64_t{1} << 62))
        damaged(what, ": \"shape\" is impossibly large");
      elements *= extent;
      e.shape.push_back(static_cast<int64_t>(extent));
    }
    if (!is_count(field("offset")) || !is_count(field("bytes")))
      damaged(what, ": \"offset\" and \"bytes\" must be non-negative integers");
    e.offset = j["offset"].get<uint64_t>();
    e.bytes = j["bytes"].get<uint64_t>();
    uint64_t expect = 0;
    if (__builtin_mul_overflow(elements, uint64_t{dtype_size(e.dtype)}, &expect) || expect != e.bytes)
      damaged(what, ": \"bytes\" is ", e.bytes, " but its dtype and shape need ", expect);
    if (checksums) {
      if (!is_count(field("crc32")) || j["crc32"].get<uint64_t>() > 0xffffffffu)
        damaged(what, ": \"crc32\" is not a 32-bit checksum");
      e.has_crc = true;
      e.crc = static_cast<uint32_t>(j["crc32"].get<uint64_t>());
    }
    return e;
  }

  // The tensors must tile the data area exactly: no gaps, no overlaps, nothing after the last one.
  void check_layout() {
    std::vector<const Entry*> by_offset;
    for (const Entry& e : entries_) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
      return a->offset != b->offset ? a->offset < b->offset : a->bytes < b->bytes;
    });
    uint64_t end = 0;
    for (const Entry* e : by_offset) {
      if (e->offset != end)
        damaged(e->name, " starts at byte ", e->offset, " of the data but the tensor before it ends at ", end);
      end += e->bytes;
    }
    const uint64_t data = file_size_ - data_start_;
    if (end > data) damaged("its tensors need ", end, " bytes of data but the file holds ", data, " (truncated?)");
    if (end < data) damaged(data - end, " unexpected bytes after the last tensor");
  }

  std::string path_;
  FilePtr file_;
  uint64_t file_size_ = 0, data_start_ = 0;
  Json header_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
};

}  // namespace

std::string checkpoint_meta(const std::string& path) { return CheckpointFile(path).meta().dump(); }

std::vector<std::pair<std::string, Tensor>> read_checkpoint_tensors(const std::string& path) {
  CheckpointFile file(path);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Entry& e : file.entries()) out.emplace_back(e.name, file.read(e));
  return out;
}

std::string load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt) {
  CheckpointFile file(path);
  // Reads entry `name` into a host tensor after checking that it matches `like`.
  std::set<std::string> read_names;
  auto read = [&](const std::string& name, const Tensor& like) -> Tensor {
    read_names.insert(name);
    const Entry* e = file.find(name);
    TANDEM_CHECK(e != nullptr, "checkpoint '", path, "' has no ", name,
                 " (was it saved from another model or optimizer?)");
    TANDEM_CHECK(e->shape == like.shape() && e->dtype == like.dtype(), "checkpoint '", path, "': ", name, " is ",
                 dtype_name(e->dtype), shape_str(e->shape), " but the model has ", like.str());
    return file.read(*e);
  };
  // Everything is read and checked before anything is overwritten: a bad file leaves the model as it was.
  std::vector<std::pair<Tensor, Tensor>> assign;  // destination, host copy
  for (auto& [name, t] : model.named_parameters()) assign.emplace_back(t, read("param/" + name, t));
  for (auto& [name, t] : model.named_buffers()) assign.emplace_back(t, read("buffer/" + name, t));
  struct StateLoad {
    std::vector<Tensor>* list;
    size_t index;
    Tensor host;
  };
  std::vector<StateLoad> states;
  if (opt) {
    auto names = param_names(model);
    const auto& params = opt->params();
    for (auto& list : opt->all_state_lists())
      for (size_t i = 0; i < params.size(); ++i) {
        auto it = names.find(params[i].impl());
        if (it == names.end()) continue;
        std::string key = "opt/" + list.kind + "/" + it->second;
        if (file.find(key)) states.push_back({list.tensors, i, read(key, params[i])});
      }
  }
  // The parameter groups, checked against this model and optimizer before anything changes.
  std::vector<optim::ParamGroup> groups;
  const bool regroup = opt && file.header().contains("param_groups");
  if (regroup) {
    std::map<std::string, Tensor> by_name;
    for (auto& [name, t] : model.named_parameters()) by_name.emplace(name, t);
    std::set<const TensorImpl*> mine, grouped;
    for (const Tensor& p : opt->params()) mine.insert(p.impl());
    for (const Json& e : file.header()["param_groups"]) {
      optim::ParamGroup g;
      g.lr_scale = e["lr_scale"].get<double>();
      TANDEM_CHECK(std::isfinite(g.lr_scale) && g.lr_scale >= 0.0, "checkpoint '", path,
                   "': a parameter group's lr_scale is ", g.lr_scale);
      if (e.contains("weight_decay") && e["weight_decay"].is_number()) {
        g.weight_decay = e["weight_decay"].get<double>();
        TANDEM_CHECK(std::isfinite(*g.weight_decay) && *g.weight_decay >= 0.0, "checkpoint '", path,
                     "': a parameter group's weight_decay is ", *g.weight_decay);
      }
      for (const Json& n : e["params"]) {
        auto it = by_name.find(n.get<std::string>());
        TANDEM_CHECK(it != by_name.end() && mine.count(it->second.impl()), "checkpoint '", path,
                     "' groups a parameter ", n.get<std::string>(), " that this optimizer does not hold "
                     "(was it saved from another model or optimizer?)");
        TANDEM_CHECK(grouped.insert(it->second.impl()).second, "checkpoint '", path, "' puts parameter ",
                     n.get<std::string>(), " in two groups");
        g.params.push_back(it->second);
      }
      groups.push_back(std::move(g));
    }
  }
  // What this load does not need is verified all the same: a file with any damage is refused.
  for (const Entry& e : file.entries())
    if (!read_names.count(e.name)) file.read(e);
  for (auto& [dst, h] : assign) dst.detach().copy_(h);
  const Json& header = file.header();
  if (opt) {
    // Masters the file lacks are made again from the loaded parameters at their next step.
    for (auto& list : opt->all_state_lists())
      if (list.kind == "master")
        for (Tensor& t : *list.tensors) t = Tensor();
    for (auto& s : states) {
      Tensor& slot = (*s.list)[s.index];
      const Tensor& p = opt->params()[s.index];
      if (!slot.defined()) slot = Tensor::empty(p.shape(), p.dtype(), p.device());
      slot.copy_(s.host);
    }
    if (regroup) opt->set_param_groups(groups);
    opt->set_steps(header.value("optimizer_steps", int64_t{0}));
    if (auto* counts = opt->step_counts(); counts && header.contains("parameter_steps")) {
      auto names = param_names(model);
      for (size_t i = 0; i < opt->params().size(); ++i) {
        auto it = names.find(opt->params()[i].impl());
        if (it != names.end()) (*counts)[i] = header["parameter_steps"].value(it->second, int64_t{0});
      }
    }
  }
  return file.meta().dump();
}

}  // namespace tandem
