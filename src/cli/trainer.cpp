// The training loop: data, model, optimizer, per-epoch report in the guide's format.
#include "cli/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/progress.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

data::Dataset limited(data::Dataset ds, int64_t limit) {
  if (limit > 0 && limit < ds.size()) {
    ds.images = ds.images.narrow(0, 0, limit);
    ds.labels = ds.labels.narrow(0, 0, limit);
  }
  return ds;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, std::vector<Tensor> params) {
  if (cfg.optimizer == "adam") {
    optim::AdamOptions o;
    o.lr = cfg.lr;
    o.weight_decay = cfg.weight_decay;
    return std::make_unique<optim::Adam>(std::move(params), o);
  }
  optim::SgdOptions o;
  o.lr = cfg.lr;
  o.momentum = cfg.momentum;
  o.weight_decay = cfg.weight_decay;
  o.nesterov = cfg.nesterov;
  return std::make_unique<optim::SGD>(std::move(params), o);
}

// Running sums kept on the device so that a training step never waits for the host.
struct EpochTotals {
  Tensor loss_sum;     // f32 scalar
  Tensor correct;      // i64 scalar
  int64_t samples = 0;

  explicit EpochTotals(Device d) : loss_sum(Tensor::zeros({}, DType::f32, d)), correct(Tensor::zeros({}, DType::i64, d)) {}
  void add(const Tensor& loss, const Tensor& logits, const Tensor& labels) {
    backend::Backend& b = backend::backend_for(loss_sum.device());
    b.axpy(1.0, loss, loss_sum);
    if (logits.defined()) {
      Tensor c = count_correct(logits, labels);
      b.binary(backend::Binary::Add, correct, c, correct);
    }
    samples += labels.size(0);
  }
};

}  // namespace

int run_training(const TrainConfig& cfg) {
  set_num_threads(cfg.threads);
  Device device = Device::parse(cfg.device);
  check_device(device);

  data::Dataset train_set = limited(data::load_dataset(cfg.dataset, cfg.data_dir, true), cfg.limit_train);
  data::Dataset test_set = limited(data::load_dataset(cfg.dataset, cfg.data_dir, false), cfg.limit_test);

  nn::ModelConfig mc;
  mc.in_channels = train_set.images.size(1);
  mc.height = train_set.images.size(2);
  mc.width = train_set.images.size(3);
  mc.num_classes = train_set.num_classes;
  mc.hidden = cfg.hidden;
  mc.seed = cfg.seed;
  nn::ModulePtr model = nn::make_model(cfg.model, mc);
  model->to(device);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(cfg, model->parameters());

  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.seed = cfg.seed;
  lo.device = device;
  data::DataLoader train_loader(train_set, lo);
  lo.shuffle = false;
  data::DataLoader test_loader(test_set, lo);

  std::fprintf(stderr, "tandem: %s (%lld parameters) on %s: %lld training / %lld test samples, batch %lld, %s%s\n",
               cfg.model.c_str(), static_cast<long long>(model->num_parameters()), cfg.dataset.c_str(),
               static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
               static_cast<long long>(cfg.batch_size), device.str().c_str(),
               device.is_cpu() ? (", " + std::to_string(num_threads()) + " threads").c_str() : "");
  bool progress = cfg.progress == "on" || (cfg.progress == "auto" && isatty(STDERR_FILENO));
  std::ofstream metrics;
  if (!cfg.metrics_path.empty()) {
    metrics.open(cfg.metrics_path, std::ios::app);
    TANDEM_CHECK(metrics.good(), "cannot open the metrics file '", cfg.metrics_path, "' for writing");
  }

  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::printf("Starting Epoch %d:\n", epoch);
    std::fflush(stdout);
    auto t0 = Clock::now();

    model->train(true);
    EpochTotals train(device);
    train_loader.start_epoch(epoch);
    ProgressBar bar(progress, train_loader.batches_per_epoch(), "epoch " + std::to_string(epoch));
    data::Batch batch;
    int64_t step = 0;
    while (train_loader.next(batch)) {
      Tensor logits = model->forward(batch.x);
      Tensor loss = softmax_cross_entropy(logits, batch.y);
      opt->zero_grad();
      backward(loss);
      opt->step();
      train.add(loss.detach(), logits.detach(), batch.y);
      bar.update(++step, train.samples);
    }
    bar.finish();
    synchronize(device);
    double train_s = seconds_since(t0);

    auto t1 = Clock::now();
    model->eval();
    EpochTotals test(device);
    {
      NoGradGuard no_grad;
      test_loader.start_epoch(0);
      while (test_loader.next(batch)) {
        Tensor logits = model->forward(batch.x);
        backend::Backend& b = backend::backend_for(device);
        Tensor c = count_correct(logits, batch.y);
        b.binary(backend::Binary::Add, test.correct, c, test.correct);
        test.samples += batch.y.size(0);
      }
    }
    double loss_sum = train.loss_sum.item<double>();
    double train_acc = static_cast<double>(train.correct.item<int64_t>()) / std::max<int64_t>(train.samples, 1);
    double eval_acc = static_cast<double>(test.correct.item<int64_t>()) / std::max<int64_t>(test.samples, 1);
    double eval_s = seconds_since(t1);
    double epoch_s = seconds_since(t0);

    std::printf("Training loss = %f, training accuracy = %f\n", loss_sum, train_acc);
    std::printf("Evaluation accuracy = %f, Elapsed Time = %fs\n", eval_acc, epoch_s);
    std::fflush(stdout);
    if (metrics.is_open()) {
      nlohmann::json j{{"epoch", epoch},
                       {"train_loss", loss_sum},
                       {"train_acc", train_acc},
                       {"eval_acc", eval_acc},
                       {"epoch_s", epoch_s},
                       {"train_s", train_s},
                       {"eval_s", eval_s},
                       {"train_samples", train.samples},
                       {"train_images_per_s", train.samples / train_s},
                       {"model", cfg.model},
                       {"dataset", cfg.dataset},
                       {"device", device.str()},
                       {"batch_size", cfg.batch_size}};
      metrics << j.dump() << "\n";
      metrics.flush();
    }
  }
  return 0;
}

}  // namespace tandem::cli
