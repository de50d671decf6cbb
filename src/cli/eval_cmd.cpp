// `tandem eval`: the test accuracy of a saved model, in one process.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tandem/autograd.h"
#include "tandem/checkpoint.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"

namespace tandem::cli {

namespace {

struct EvalConfig {
  std::string checkpoint, data_dir, device = "cpu";
  int64_t batch_size = 256, limit_test = 0;
  int threads = 0;
};

// A meta field of the expected type, or an error that says the file was not written by tandem train.
template <typename T>
T meta_field(const nlohmann::json& meta, const char* key, const std::string& path) {
  TANDEM_CHECK(meta.contains(key), "checkpoint '", path, "' does not say its ", key,
               " (was it written by tandem train?)");
  try {
    return meta[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    TANDEM_CHECK(false, "checkpoint '", path, "': its ", key, " has the wrong type");
    throw;
  }
}

int run_eval(const EvalConfig& cfg) {
  auto meta = nlohmann::json::parse(checkpoint_meta(cfg.checkpoint));
  const auto model_name = meta_field<std::string>(meta, "model", cfg.checkpoint);
  TANDEM_CHECK(!nn::is_language_model(model_name), "checkpoint '", cfg.checkpoint, "' holds the language model ",
               model_name, ": tandem eval measures image classifiers' accuracy; a language model's validation loss is ",
               "reported by tandem train (--eval-every)");
  const auto dataset = meta_field<std::string>(meta, "dataset", cfg.checkpoint);
  if (cfg.threads > 0) set_num_threads(cfg.threads);
  Device device = Device::parse(cfg.device);
  check_device(device);

  data::Dataset test = data::load_dataset(dataset, cfg.data_dir, false);
  if (cfg.limit_test > 0 && cfg.limit_test < test.size()) {
    test.images = test.images.narrow(0, 0, cfg.limit_test);
    test.labels = test.labels.narrow(0, 0, cfg.limit_test);
  }
  nn::ModelConfig mc;
  mc.in_channels = test.images.size(1);
  mc.height = test.images.size(2);
  mc.width = test.images.size(3);
  mc.num_classes = test.num_classes;
  if (meta.contains("hidden")) mc.hidden = meta_field<std::vector<int64_t>>(meta, "hidden", cfg.checkpoint);
  nn::ModulePtr model = nn::make_model(model_name, mc);
  load_checkpoint(cfg.checkpoint, *model, nullptr);
  model->to(device);
  model->eval();

  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.shuffle = false;
  lo.device = device;
  data::DataLoader loader(test, lo);
  loader.start_epoch(0);
  NoGradGuard no_grad;
  int64_t correct = 0;
  data::Batch batch;
  while (loader.next(batch)) correct += count_correct(model->forward(batch.x), batch.y).to(Device::cpu()).item<int64_t>();
  const double acc = static_cast<double>(correct) / static_cast<double>(test.size());
  // A run stopped inside an epoch (Ctrl-C) saved its point there.
  std::string when = meta.contains("epoch") ? ", after epoch " + meta["epoch"].dump() : "";
  if (meta.contains("partial_epoch") && meta["partial_epoch"].is_object())
    when = ", inside epoch " + meta["partial_epoch"].value("epoch", nlohmann::json()).dump() + " after batch " +
           meta["partial_epoch"].value("batches", nlohmann::json()).dump();
  std::printf("Evaluation accuracy = %f (%s, %lld test samples of %s%s)\n", acc, model_name.c_str(),
              static_cast<long long>(test.size()), dataset.c_str(), when.c_str());
  return 0;
}

}  // namespace

Runner add_eval_command(CLI::App& app) {
  auto cfg = std::make_shared<EvalConfig>();
  CLI::App* sub = app.add_subcommand("eval", "Print the test accuracy of a model saved by tandem train --checkpoint");
  sub->add_option("--checkpoint", cfg->checkpoint, "Checkpoint file")->required();
  sub->add_option("--data-dir", cfg->data_dir, "Directory of the data set the model was trained on (default: its usual place)");
  sub->add_option("--device", cfg->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("-b,--batch-size", cfg->batch_size, "Samples per forward pass")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub->add_option("--limit-test", cfg->limit_test, "Use only the first N test samples (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_option("--threads", cfg->threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 4096));
  return [cfg] { return run_eval(*cfg); };
}

}  // namespace tandem::cli
