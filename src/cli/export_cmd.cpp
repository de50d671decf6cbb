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
#include "tandem/safetensors.h"

namespace tandem::cli {

namespace {

struct ExportConfig {
  std::string checkpoint, format = "safetensors", output;
};

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
