// Checkpoint file: "TANDEMCK", a version, the length of a JSON header, the header (meta data and a
// table of tensors: name, dtype, shape, offset), then the tensors' bytes.
#include "tandem/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

namespace tandem {

namespace {

constexpr char kMagic[8] = {'T', 'A', 'N', 'D', 'E', 'M', 'C', 'K'};
constexpr uint32_t kVersion = 1;

using Json = nlohmann::json;

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
    for (auto& list : opt->state_lists())
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor& s = (*list.tensors)[i];
        auto it = names.find(params[i].impl());
        if (s.defined() && it != names.end()) out.emplace_back("opt/" + list.kind + "/" + it->second, s);
      }
  }
  return out;
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, optim::Optimizer* opt,
                     const std::string& meta_json) {
  Json meta = Json::parse(meta_json, nullptr, false);
  TANDEM_CHECK(!meta.is_discarded() && meta.is_object(), "save_checkpoint: meta data must be a JSON object");
  auto tensors = collect(model, opt);
  std::vector<Tensor> host;
  Json table = Json::array();
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    Tensor h = t.detach().contiguous().to(Device::cpu());
    table.push_back({{"name", name}, {"dtype", dtype_name(h.dtype())}, {"shape", h.shape()}, {"offset", offset},
                     {"bytes", h.nbytes()}});
    offset += h.nbytes();
    host.push_back(h);
  }
  Json header{{"meta", meta}, {"tensors", table}};
  if (opt) {
    header["optimizer_steps"] = opt->steps();
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
  std::string head = header.dump();
  std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TANDEM_CHECK(f.good(), "cannot write the checkpoint '", tmp, "' (does its directory exist and is it writable?)");
    uint64_t len = head.size();
    f.write(kMagic, sizeof kMagic);
    f.write(reinterpret_cast<const char*>(&kVersion), sizeof kVersion);
    f.write(reinterpret_cast<const char*>(&len), sizeof len);
    f.write(head.data(), static_cast<std::streamsize>(head.size()));
    for (const Tensor& h : host) f.write(static_cast<const char*>(h.data_ptr()), static_cast<std::streamsize>(h.nbytes()));
    f.flush();
    TANDEM_RUNTIME_CHECK(f.good(), "writing the checkpoint '", tmp, "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  TANDEM_RUNTIME_CHECK(!ec, "cannot move the checkpoint '", tmp, "' to '", path, "': ", ec.message());
}

namespace {
// Opens a checkpoint and reads its header; leaves f at the first tensor byte.
Json read_header(const std::string& path, std::ifstream& f, uint64_t& data_start) {
  f.open(path, std::ios::binary);
  TANDEM_CHECK(f.good(), "cannot open the checkpoint '", path, "'");
  char magic[8];
  uint32_t version = 0;
  uint64_t len = 0;
  f.read(magic, sizeof magic);
  TANDEM_CHECK(f.good() && std::memcmp(magic, kMagic, sizeof magic) == 0, "'", path, "' is not a tandem checkpoint");
  f.read(reinterpret_cast<char*>(&version), sizeof version);
  f.read(reinterpret_cast<char*>(&len), sizeof len);
  TANDEM_CHECK(f.good() && version == kVersion, "checkpoint '", path, "' has format version ", version,
               "; this tandem reads version ", kVersion);
  TANDEM_CHECK(len <= std::filesystem::file_size(path), "checkpoint '", path,
               "' is damaged (header larger than the file)");
  std::string head(len, '\0');
  f.read(head.data(), static_cast<std::streamsize>(len));
  Json header = Json::parse(head, nullptr, false);
  TANDEM_CHECK(f.good() && !header.is_discarded() && header.contains("tensors"), "checkpoint '", path,
               "' is damaged (unreadable header)");
  data_start = sizeof magic + sizeof version + sizeof len + len;
  return header;
}
}  // namespace

std::string checkpoint_meta(const std::string& path) {
  std::ifstream f;
  uint64_t data_start = 0;
  return read_header(path, f, data_start).value("meta", Json::object()).dump();
}

std::string load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt) {
  std::ifstream f;
  uint64_t data_start = 0;
  Json header = read_header(path, f, data_start);
  const auto file_size = std::filesystem::file_size(path);

  std::map<std::string, Json> table;
  for (const Json& e : header["tensors"]) table[e.at("name").get<std::string>()] = e;
  // Reads entry `name` into a host tensor after checking that it matches `like`.
  auto read = [&](const std::string& name, const Tensor& like) -> Tensor {
    auto it = table.find(name);
    TANDEM_CHECK(it != table.end(), "checkpoint '", path, "' has no ", name,
                 " (was it saved from another model or optimizer?)");
    const Json& e = it->second;
    Shape shape = e.at("shape").get<Shape>();
    DType dt = parse_dtype(e.at("dtype").get<std::string>());
    TANDEM_CHECK(shape == like.shape() && dt == like.dtype(), "checkpoint '", path, "': ", name, " is ",
                 dtype_name(dt), shape_str(shape), " but the model has ", like.str());
    uint64_t off = e.at("offset").get<uint64_t>(), bytes = e.at("bytes").get<uint64_t>();
    TANDEM_CHECK(bytes == like.nbytes() && data_start + off + bytes <= file_size, "checkpoint '", path,
                 "' is damaged (", name, " runs past the end of the file)");
    Tensor h = Tensor::empty(shape, dt);
    f.seekg(static_cast<std::streamoff>(data_start + off));
    f.read(static_cast<char*>(h.data_ptr()), static_cast<std::streamsize>(bytes));
    TANDEM_CHECK(f.good(), "checkpoint '", path, "': reading ", name, " failed");
    return h;
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
    for (auto& list : opt->state_lists())
      for (size_t i = 0; i < params.size(); ++i) {
        auto it = names.find(params[i].impl());
        if (it == names.end()) continue;
        std::string key = "opt/" + list.kind + "/" + it->second;
        if (table.count(key)) states.push_back({list.tensors, i, read(key, params[i])});
      }
  }
  for (auto& [dst, h] : assign) dst.detach().copy_(h);
  if (opt) {
    for (auto& s : states) {
      Tensor& slot = (*s.list)[s.index];
      const Tensor& p = opt->params()[s.index];
      if (!slot.defined()) slot = Tensor::empty(p.shape(), p.dtype(), p.device());
      slot.copy_(s.host);
    }
    opt->set_steps(header.value("optimizer_steps", int64_t{0}));
    if (auto* counts = opt->step_counts(); counts && header.contains("parameter_steps")) {
      auto names = param_names(model);
      for (size_t i = 0; i < opt->params().size(); ++i) {
        auto it = names.find(opt->params()[i].impl());
        if (it != names.end()) (*counts)[i] = header["parameter_steps"].value(it->second, int64_t{0});
      }
    }
  }
  return header.value("meta", Json::object()).dump();
}

}  // namespace tandem
