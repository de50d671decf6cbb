// `tandem export`: a checkpoint's model weights (parameters and buffers, under their own names) as a
// safetensors file, which Python's safetensors and PyTorch load directly.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/safe_file.h"
#include "tandem/checkpoint.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace {

struct ExportConfig {
  std::string checkpoint, format = "safetensors", output;
};

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
  TANDEM_ASSERT(false, "unhandled dtype");
  return "";
}

// Written as a new file beside path and renamed over it; a failure leaves no partial file.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", safetensors_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string head = header.dump();
  head.resize((head.size() + 7) / 8 * 8, ' ');  // the format pads the header with spaces to 8 bytes
  const uint64_t len = head.size();  // little-endian u64, as on every machine tandem runs on
  io::write_file_atomically(path, "safetensors file", [&](int fd) {
    io::write_all(fd, &len, sizeof len, path, "safetensors file");
    io::write_all(fd, head.data(), head.size(), path, "safetensors file");
    for (const auto& [name, t] : tensors) io::write_all(fd, t.data_ptr(), t.nbytes(), path, "safetensors file");
  });
}

// The output replaces whatever has its name: it must not be the checkpoint being read, under its own
// name, through a link or as another hard link of it.
void check_output_is_not_input(const std::string& input, const std::string& output) {
  struct stat in {}, out {};
  bool same = ::stat(input.c_str(), &in) == 0 && ::stat(output.c_str(), &out) == 0 && in.st_dev == out.st_dev &&
              in.st_ino == out.st_ino;
  std::error_code ec_in, ec_out;
  const auto canon_in = std::filesystem::weakly_canonical(input, ec_in);
  const auto canon_out = std::filesystem::weakly_canonical(output, ec_out);
  same = same || (!ec_in && !ec_out && canon_in == canon_out);
  TANDEM_CHECK(!same, "--output '", output, "' is the checkpoint being exported ('", input,
               "'); writing it would destroy the checkpoint: give another file name");
}

}  // namespace

Runner add_export_command(CLI::App& app) {
  auto cfg = std::make_shared<ExportConfig>();
  CLI::App* sub = app.add_subcommand("export", "Write a checkpoint's model weights in another format");
  sub->add_option("--checkpoint", cfg->checkpoint, "Checkpoint written by tandem train --checkpoint")->required();
  sub->add_option("--format", cfg->format, "Output format")->check(CLI::IsMember({"safetensors"}))->capture_default_str();
  sub->add_option("-o,--output", cfg->output, "File to write (replaced whole; not the checkpoint itself)")->required();
  sub->footer("Parameters and buffers keep their names (conv1.weight, ...); optimizer state is left out.\n"
              "Python: safetensors.torch.load_file(OUT) gives a state dict.");
  return [cfg] {
    std::map<std::string, std::string> metadata{{"format", "pt"}};
    const auto meta = nlohmann::json::parse(checkpoint_meta(cfg->checkpoint));  // a missing file is named first
    check_output_is_not_input(cfg->checkpoint, cfg->output);
    for (auto& [k, v] : meta.items())
      metadata["tandem." + k] = v.is_string() ? v.get<std::string>() : v.dump();
    std::vector<std::pair<std::string, Tensor>> weights;
    for (auto& [name, t] : read_checkpoint_tensors(cfg->checkpoint)) {
      for (const char* prefix : {"param/", "buffer/"})
        if (name.rfind(prefix, 0) == 0) weights.emplace_back(name.substr(std::strlen(prefix)), t);
    }
    TANDEM_CHECK(!weights.empty(), "checkpoint '", cfg->checkpoint, "' holds no model weights");
    write_safetensors(cfg->output, weights, metadata);
    std::printf("wrote %zu tensors to %s\n", weights.size(), cfg->output.c_str());
    return 0;
  };
}

}  // namespace tandem::cli
