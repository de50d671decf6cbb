// `tandem train`: the phases of a training run, in the order they run. A single process runs the
// same code with a one-rank communicator.
#include "cli/trainer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/progress.h"
#include "tandem/checkpoint.h"
#include "tandem/ops.h"

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

// Per-batch figures recorded on the device, one slot per batch, so that a step never waits for the
// host; they are summed and reduced over ranks once, at the end of the pass.
class Tally {
 public:
  Tally(int64_t batches, Device d)
      : capacity_(std::max<int64_t>(batches, 1)),
        loss_(Tensor::zeros({capacity_}, DType::f32, d)),
        correct_(Tensor::zeros({capacity_}, DType::f32, d)) {}

  void add(const Tensor* loss, const Tensor& logits, const Tensor& labels) {
    TANDEM_ASSERT(n_ < capacity_, "more batches than the loader announced");
    if (loss) loss_.narrow(0, n_, 1).copy_(loss->view({1}));
    correct_.narrow(0, n_, 1).copy_(count_correct(logits, labels).view({1}));
    samples_ += labels.size(0);
    ++n_;
  }
  int64_t samples() const { return samples_; }

  /// Sums over batches and ranks: {loss, correct, samples}.
  std::array<double, 3> reduce(dist::Communicator& comm) {
    NoGradGuard no_grad;
    Tensor loss = sum(loss_).view({1});
    Tensor counts = Tensor::empty({2}, DType::i64, loss_.device());
    counts.narrow(0, 0, 1).copy_(sum(correct_).view({1}));  // exact: whole numbers below 2^24
    counts.narrow(0, 1, 1).copy_(Tensor::full({1}, static_cast<double>(samples_), DType::i64));
    comm.all_reduce(loss)->wait();
    comm.all_reduce(counts)->wait();
    std::vector<int64_t> c = counts.to_vector<int64_t>();
    return {loss.item<double>(), static_cast<double>(c[0]), static_cast<double>(c[1])};
  }

 private:
  int64_t capacity_;
  Tensor loss_, correct_;
  int64_t n_ = 0, samples_ = 0;
};

}  // namespace

Trainer::Trainer(const TrainConfig& cfg) : cfg_(cfg) {}
Trainer::~Trainer() = default;

int Trainer::run() {
  setup();
  for (int epoch = first_epoch_; epoch < cfg_.epochs; ++epoch) {
    auto t0 = Clock::now();
    EpochStats train = train_epoch(epoch);
    EvalStats eval = evaluate();
    double epoch_s = seconds_since(t0);
    TANDEM_RUNTIME_CHECK(std::isfinite(train.loss), "the training loss became ", train.loss, " in epoch ", epoch,
                         "; lower --lr (or check the data)");
    report(epoch, train, eval, epoch_s);
    save_checkpoint(epoch, eval);
  }
  return 0;
}

void Trainer::setup() {
  session_ = std::make_unique<Session>(cfg_);
  Session& s = *session_;
  train_set_ = limited(data::load_dataset(cfg_.dataset, cfg_.data_dir, true), cfg_.limit_train);
  test_set_ = limited(data::load_dataset(cfg_.dataset, cfg_.data_dir, false), cfg_.limit_test);
  TANDEM_CHECK(train_set_.size() >= s.world() && test_set_.size() >= s.world(), "the data set is too small for ",
               s.world(), " ranks");
  nn::ModelConfig mc;
  mc.in_channels = train_set_.images.size(1);
  mc.height = train_set_.images.size(2);
  mc.width = train_set_.images.size(3);
  mc.num_classes = train_set_.num_classes;
  s.build_model(mc);

  if (cfg_.resume && std::filesystem::exists(cfg_.checkpoint)) {
    auto meta = nlohmann::json::parse(checkpoint_meta(cfg_.checkpoint));
    const std::pair<const char*, const std::string*> must_match[] = {
        {"model", &cfg_.model}, {"dataset", &cfg_.dataset}, {"optimizer", &cfg_.optimizer}};
    for (auto [key, value] : must_match)
      TANDEM_CHECK(meta.value(key, std::string()) == *value, "checkpoint '", cfg_.checkpoint, "' was saved with --",
                   key, " ", meta.value(key, std::string("?")), "; resume with the same value or use another --checkpoint");
    load_checkpoint(cfg_.checkpoint, s.model(), &s.opt().optimizer());
    first_epoch_ = meta.value("epoch", -1) + 1;
    if (s.lead()) std::fprintf(stderr, "tandem: resuming from '%s' at epoch %d\n", cfg_.checkpoint.c_str(), first_epoch_);
  } else if (cfg_.resume && s.lead()) {
    std::fprintf(stderr, "tandem: no checkpoint at '%s' yet: starting at epoch 0\n", cfg_.checkpoint.c_str());
  }
  s.sync_model();

  data::LoaderOptions lo;
  lo.batch_size = cfg_.batch_size;
  lo.seed = cfg_.seed;
  lo.device = s.device();
  lo.rank = s.rank();
  lo.world_size = s.world();
  train_loader_ = std::make_unique<data::DataLoader>(train_set_, lo);
  lo.shuffle = false;
  test_loader_ = std::make_unique<data::DataLoader>(test_set_, lo);

  if (s.lead()) {
    std::fprintf(stderr, "tandem: %s (%lld parameters) on %s: %lld training / %lld test samples, batch %lld per rank, %s\n",
                 cfg_.model.c_str(), static_cast<long long>(s.model().num_parameters()), cfg_.dataset.c_str(),
                 static_cast<long long>(train_set_.size()), static_cast<long long>(test_set_.size()),
                 static_cast<long long>(cfg_.batch_size), s.where().c_str());
    if (!cfg_.metrics_path.empty()) {
      metrics_.open(cfg_.metrics_path, std::ios::app);
      TANDEM_CHECK(metrics_.good(), "cannot open the metrics file '", cfg_.metrics_path, "' for writing");
    }
  }
}

EpochStats Trainer::train_epoch(int epoch) {
  Session& s = *session_;
  if (s.lead()) {
    std::printf("Starting Epoch %d:\n", epoch);
    std::fflush(stdout);
  }
  auto t0 = Clock::now();
  s.opt().reset_stats();
  s.model().train(true);
  train_loader_->start_epoch(epoch);
  Tally tally(train_loader_->batches_per_epoch(), s.device());
  bool progress = s.lead() && (cfg_.progress == "on" || (cfg_.progress == "auto" && isatty(STDERR_FILENO)));
  ProgressBar bar(progress, train_loader_->batches_per_epoch(), "epoch " + std::to_string(epoch));
  // Partial mode lets replicas differ between full averages, and every mode lets batch-norm
  // statistics differ between evaluations: those are compared after each epoch's averages.
  const bool check_steps = cfg_.check_consistency > 0 && !s.partial();
  // With --accumulate N, every N micro-batches make one step (the epoch's last step may have fewer);
  // each micro-batch's loss is weighted by 1/(micro-batches in its step), so the step applies the
  // mean gradient over its samples, as one batch of them would.
  const int64_t batches = train_loader_->batches_per_epoch(), n = cfg_.accumulate;
  data::Batch batch;
  int64_t i = 0;
  while (train_loader_->next(batch)) {
    const int64_t first = i / n * n, in_step = std::min(n, batches - first);
    const bool last = i - first == in_step - 1;
    StepResult r = s.forward_backward(batch.x, batch.y, 1.0 / static_cast<double>(in_step), last);
    tally.add(&r.loss, r.logits, batch.y);
    if (last) {
      s.apply_update();
      ++global_step_;
      if (check_steps && global_step_ % cfg_.check_consistency == 0) s.opt().check_consistency(/*include_buffers=*/false);
    }
    bar.update(++i, tally.samples() * s.world());
  }
  TANDEM_ASSERT(i == batches, "the loader gave ", i, " batches of the ", batches, " announced");
  bar.finish();
  synchronize(s.device());
  EpochStats st;
  st.seconds = seconds_since(t0);
  st.comm = s.opt().stats();
  auto totals = tally.reduce(s.comm());
  st.loss = totals[0];
  st.correct = totals[1];
  st.samples = totals[2];
  return st;
}

EvalStats Trainer::evaluate() {
  Session& s = *session_;
  auto t0 = Clock::now();
  // Ranks evaluate one model: partial mode averages the parameters, every mode the buffers.
  if (s.partial())
    s.opt().average_parameters();
  else
    s.opt().average_buffers();
  if (cfg_.check_consistency > 0) s.opt().check_consistency();
  s.model().eval();
  Tally tally(test_loader_->batches_per_epoch(), s.device());
  {
    NoGradGuard no_grad;
    data::Batch batch;
    test_loader_->start_epoch(0);
    PrecisionScope scope(s.precision());
    while (test_loader_->next(batch)) tally.add(nullptr, s.model().forward(batch.x), batch.y);
  }
  auto totals = tally.reduce(s.comm());
  EvalStats ev;
  ev.correct = totals[1];
  ev.samples = totals[2];
  ev.seconds = seconds_since(t0);
  return ev;
}

void Trainer::report(int epoch, const EpochStats& train, const EvalStats& eval, double epoch_s) {
  Session& s = *session_;
  if (!s.lead()) return;
  double train_acc = train.correct / std::max(train.samples, 1.0), eval_acc = eval.correct / std::max(eval.samples, 1.0);
  const dist::CommStats& c = train.comm;
  std::printf("Training loss = %f, training accuracy = %f\n", train.loss, train_acc);
  std::printf("Evaluation accuracy = %f, Elapsed Time = %fs\n", eval_acc, epoch_s);
  if (cfg_.report_comm) {
    double steps = std::max<double>(static_cast<double>(c.steps), 1.0);
    std::printf("Communication (rank 0): %.3f MB sent, %.3f MB received per step; %.3fs waiting, %lld collectives\n",
                c.bytes_sent / steps / 1e6, c.bytes_received / steps / 1e6, c.wait_seconds,
                static_cast<long long>(c.collectives));
  }
  std::fflush(stdout);
  if (!metrics_.is_open()) return;
  nlohmann::json j{{"epoch", epoch},
                   {"train_loss", train.loss},
                   {"train_acc", train_acc},
                   {"eval_acc", eval_acc},
                   {"epoch_s", epoch_s},
                   {"train_s", train.seconds},
                   {"eval_s", eval.seconds},
                   {"train_samples", static_cast<int64_t>(train.samples)},
                   {"train_images_per_s", train.samples / train.seconds},
                   {"model", cfg_.model},
                   {"dataset", cfg_.dataset},
                   {"device", s.device().str()},
                   {"world_size", s.world()},
                   {"dist_option", s.sync().method},
                   {"precision", precision_name(s.precision())},
                   {"batch_size", cfg_.batch_size},
                   {"bytes_sent_per_step", c.bytes_sent / std::max<int64_t>(c.steps, 1)},
                   {"bytes_received_per_step", c.bytes_received / std::max<int64_t>(c.steps, 1)},
                   {"comm_wait_s", c.wait_seconds}};
  metrics_ << j.dump() << "\n";
  metrics_.flush();
}

void Trainer::save_checkpoint(int epoch, const EvalStats& eval) {
  Session& s = *session_;
  if (!s.lead() || cfg_.checkpoint.empty()) return;
  nlohmann::json meta{{"epoch", epoch},
                      {"model", cfg_.model},
                      {"dataset", cfg_.dataset},
                      {"optimizer", cfg_.optimizer},
                      {"world_size", s.world()},
                      {"seed", cfg_.seed},
                      {"dist_option", s.sync().method},
                      {"eval_acc", eval.correct / std::max(eval.samples, 1.0)}};
  tandem::save_checkpoint(cfg_.checkpoint, s.model(), &s.opt().optimizer(), meta.dump());
}

}  // namespace tandem::cli
