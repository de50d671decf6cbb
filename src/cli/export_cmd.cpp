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
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/pretrained.h"
#include "tandem/safetensors.h"

namespace tandem::cli {

namespace {

struct ExportConfig {
  std::string checkpoint, format = "safetensors", output, dtype = "f32";
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

// A GPT or Llama checkpoint as a Hugging Face directory, with the tokenizer files of the model it started from.
int export_hf(const ExportConfig& cfg) {
  namespace fs = std::filesystem;
  const auto meta = nlohmann::json::parse(checkpoint_meta(cfg.checkpoint));
  const std::string model = meta.value("model", std::string());
  std::unique_ptr<nn::Module> m;
  if (model == "llama" && meta.contains("llama")) {
    m = std::make_unique<nn::Llama>(nn::llama_config_from_json(meta["llama"].dump()));
  } else if (model == "gpt" && meta.contains("gpt")) {
    m = std::make_unique<nn::GPT>(nn::gpt_config_from_json(meta["gpt"].dump()));
  } else {
    TANDEM_CHECK(false, "checkpoint '", cfg.checkpoint, "' holds ", model.empty() ? std::string("no language model") : "the model " + model,
                 "; --format hf exports GPT and Llama checkpoints (--format safetensors writes any model's weights)");
  }
  load_checkpoint(cfg.checkpoint, *m, nullptr);
  const std::string base = meta.contains("hf_config") ? meta["hf_config"].dump() : std::string();
  nn::save_pretrained(*m, cfg.output, base, parse_dtype(cfg.dtype));
  int copied = 0;
  if (meta.contains("init") && meta["init"].is_string()) {
    const fs::path from = meta["init"].get<std::string>();
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
      std::error_code ec;
      if (!fs::is_regular_file(from / f, ec)) continue;
      fs::copy_file(from / f, fs::path(cfg.output) / f, fs::copy_options::overwrite_existing, ec);
      TANDEM_CHECK(!ec, "cannot copy ", (from / f).string(), " into ", cfg.output, ": ", ec.message());
      ++copied;
    }
  }
  std::printf("wrote %s: config.json and model.safetensors (%s)%s\n", cfg.output.c_str(), cfg.dtype.c_str(),
              copied ? (", and " + std::to_string(copied) + " tokenizer file" + (copied == 1 ? "" : "s") + " of " +
                        meta["init"].get<std::string>()).c_str()
                     : "");
  return 0;
}

}  // namespace

Runner add_export_command(CLI::App& app) {
  auto cfg = std::make_shared<ExportConfig>();
  CLI::App* sub = app.add_subcommand("export", "Write a checkpoint's model weights in another format");
  sub->add_option("--checkpoint", cfg->checkpoint, "Checkpoint written by tandem train --checkpoint")->required();
  sub->add_option("--format", cfg->format,
                  "safetensors: one file of the weights under tandem's names; hf: a Hugging Face model directory "
                  "(a GPT or Llama checkpoint) that transformers loads with from_pretrained")
      ->check(CLI::IsMember({"safetensors", "hf"}))
      ->capture_default_str();
  sub->add_option("-o,--output", cfg->output,
                  "File (safetensors: replaced whole; not the checkpoint itself) or directory (hf) to write")
      ->required();
  sub->add_option("--dtype", cfg->dtype, "hf: the weights' type in the files: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  sub->footer("Parameters and buffers keep their names (conv1.weight, ...); optimizer state is left out.\n"
              "Python: safetensors.torch.load_file(OUT) gives a state dict. --format hf writes config.json and\n"
              "model.safetensors under transformers' names (GPT2LMHeadModel, LlamaForCausalLM), and the tokenizer\n"
              "files of the directory the run started from (train --init DIR), when there are some.");
  return [cfg] {
    if (cfg->format == "hf") return export_hf(*cfg);
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
