// The training loop: data, model, distributed optimizer, per-epoch report in the guide's format.
// A single process runs the same code with a one-rank communicator.
#include "cli/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/run_report.h"
#include "cli/tensorboard.h"
#include "tandem/checkpoint.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"
#include "tandem/precision.h"

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

std::shared_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, std::vector<Tensor> params) {
  if (cfg.optimizer == "adam") {
    optim::AdamOptions o;
    o.lr = cfg.lr;
    o.weight_decay = cfg.weight_decay;
    return std::make_shared<optim::Adam>(std::move(params), o);
  }
  optim::SgdOptions o;
  o.lr = cfg.lr;
  o.momentum = cfg.momentum;
  o.weight_decay = cfg.weight_decay;
  o.nesterov = cfg.nesterov;
  return std::make_shared<optim::SGD>(std::move(params), o);
}

// Running sums kept on the device, so that a training step never waits for the host.
struct Totals {
  Tensor loss_sum;  // f32, one element
  Tensor counts;    // i64 [2]: correct, samples
  Tensor correct, samples;

  explicit Totals(Device d)
      : loss_sum(Tensor::zeros({1}, DType::f32, d)), counts(Tensor::zeros({2}, DType::i64, d)) {
    correct = counts.narrow(0, 0, 1);
    samples = counts.narrow(0, 1, 1);
  }
  void add(const Tensor* loss, const Tensor& logits, const Tensor& labels, int64_t& host_samples) {
    backend::Backend& b = backend::backend_for(counts.device());
    if (loss) b.axpy(1.0, loss->view({1}), loss_sum);
    Tensor c = count_correct(logits, labels).view({1});
    b.binary(backend::Binary::Add, correct, c, correct);
    host_samples += labels.size(0);
  }
  // Sums over ranks; returns {loss, correct, samples}.
  std::array<double, 3> reduce(dist::Communicator& comm, int64_t host_samples) {
    samples.copy_(Tensor::full({1}, static_cast<double>(host_samples), DType::i64));
    comm.all_reduce(loss_sum)->wait();
    comm.all_reduce(counts)->wait();
    std::vector<int64_t> c = counts.to_vector<int64_t>();
    return {loss_sum.item<double>(), static_cast<double>(c[0]), static_cast<double>(c[1])};
  }
};

struct ResumePoint {
  int next_epoch = 0;
  bool finished = false;
};

// Reads where a checkpoint's run stopped and checks that it suits this run; says what changed.
ResumePoint resume_point(const TrainConfig& cfg, int world) {
  const std::string& path = cfg.checkpoint;
  auto meta = nlohmann::json::parse(checkpoint_meta(path));
  auto text = [&](const char* key) {
    TANDEM_CHECK(meta.contains(key) && meta[key].is_string(), "checkpoint '", path, "' does not record its --", key,
                 " (was it written by tandem train?)");
    return meta[key].get<std::string>();
  };
  for (auto [key, value] : {std::pair<const char*, const std::string*>{"model", &cfg.model},
                            {"dataset", &cfg.dataset}, {"optimizer", &cfg.optimizer}})
    TANDEM_CHECK(text(key) == *value, "checkpoint '", path, "' was saved with --", key, " ", text(key),
                 "; resume with the same value or use another --checkpoint");
  TANDEM_CHECK(meta.contains("epoch") && meta["epoch"].is_number_integer() && meta["epoch"].get<int64_t>() >= 0,
               "checkpoint '", path, "' does not record the epoch it was saved after");
  ResumePoint at;
  at.next_epoch = static_cast<int>(meta["epoch"].get<int64_t>() + 1);
  const bool lead = dist::detect_env().rank == 0;
  if (at.next_epoch >= cfg.epochs) {
    if (lead)
      std::fprintf(stderr, "tandem: checkpoint '%s' holds a finished run (%d of --epochs %d done): nothing to train\n",
                   path.c_str(), at.next_epoch, cfg.epochs);
    at.finished = true;
    return at;
  }
  if (lead && meta.contains("world_size") && meta["world_size"].is_number_integer() && meta["world_size"] != world)
    std::fprintf(stderr, "tandem: checkpoint '%s' was saved by %lld ranks, resuming on %d: each rank now takes a "
                 "different share of every epoch\n", path.c_str(), meta["world_size"].get<long long>(), world);
  if (lead && meta.contains("seed") && meta["seed"].is_number_unsigned() && meta["seed"] != cfg.seed)
    std::fprintf(stderr, "tandem: checkpoint '%s' was saved with --seed %llu, resuming with --seed %llu: the data "
                 "order differs from the original run's\n", path.c_str(), meta["seed"].get<unsigned long long>(),
                 static_cast<unsigned long long>(cfg.seed));
  return at;
}

dist::DistOptOptions dist_options(const TrainConfig& cfg) {
  dist::DistOptOptions o;
  o.bucket_bytes = static_cast<size_t>(cfg.bucket_mb * 1048576.0);
  o.first_bucket_bytes = static_cast<size_t>(cfg.first_bucket_mb * 1048576.0);
  o.half_dtype = parse_dtype(cfg.half_dtype);
  return o;
}

}  // namespace

int run_training(const TrainConfig& cfg) {
  dist::SyncMode mode = dist::parse_sync_mode(cfg.dist_option);
  if (mode == dist::SyncMode::SparseTopK)
    TANDEM_CHECK(cfg.spars > 0.0 && cfg.spars <= 1.0, "--spars for sparseTopK is the fraction of gradients sent, in ",
                 "(0, 1]; got ", cfg.spars);
  auto run_start = Clock::now();
  dist::DistEnv env = dist::detect_env();
  if (env.rank == 0 && !cfg.checkpoint.empty()) check_checkpoint_path(cfg.checkpoint);
  // Ranks sharing a machine share its cores.
  set_num_threads(cfg.threads > 0 ? cfg.threads : default_threads_per_rank(env.local_size));
  Device device = device_for_rank(cfg.device, env);
  const Precision precision = cfg.precision.empty() ? default_precision(device) : parse_precision(cfg.precision);
  TANDEM_CHECK(device.is_cuda() || activation_dtype(precision) == DType::f32, "--precision ",
               precision_name(precision), " needs a CUDA device: the CPU computes in f32 (use --precision f32)");
  auto comm = dist::init_communicator(device, std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000)));
  const int rank = comm->rank(), world = comm->size();
  const bool lead = rank == 0;

  data::Dataset train_set = limited(data::load_dataset(cfg.dataset, cfg.data_dir, true), cfg.limit_train);
  data::Dataset test_set = limited(data::load_dataset(cfg.dataset, cfg.data_dir, false), cfg.limit_test);
  TANDEM_CHECK(train_set.size() >= world && test_set.size() >= world, "the data set is too small for ", world,
               " ranks");

  nn::ModelConfig mc;
  mc.in_channels = train_set.images.size(1);
  mc.height = train_set.images.size(2);
  mc.width = train_set.images.size(3);
  mc.num_classes = train_set.num_classes;
  mc.hidden = cfg.hidden;
  mc.seed = cfg.seed;
  nn::ModulePtr model = nn::make_model(cfg.model, mc);
  model->to(device);
  dist::DistOpt opt(make_optimizer(cfg, model->parameters()), comm, dist_options(cfg));
  int first_epoch = 0;
  if (cfg.resume && std::filesystem::exists(cfg.checkpoint)) {
    ResumePoint at = resume_point(cfg, world);
    if (at.finished) return 0;
    load_checkpoint(cfg.checkpoint, *model, &opt.optimizer());
    first_epoch = at.next_epoch;
    if (rank == 0)
      std::fprintf(stderr, "tandem: resuming from '%s' at epoch %d\n", cfg.checkpoint.c_str(), first_epoch);
  } else if (cfg.resume && rank == 0) {
    std::fprintf(stderr, "tandem: no checkpoint at '%s' yet: starting at epoch 0\n", cfg.checkpoint.c_str());
  }
  opt.sync_parameters(*model);

  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.seed = cfg.seed;
  lo.device = device;
  lo.rank = rank;
  lo.world_size = world;
  data::DataLoader train_loader(train_set, lo);
  lo.shuffle = false;
  data::DataLoader test_loader(test_set, lo);

  if (lead) {
    std::string where = device.is_cpu() ? "cpu, " + std::to_string(num_threads()) + " threads" : device.str();
    if (device.is_cuda()) where += std::string(", ") + precision_name(precision);
    if (world > 1) where += ", " + std::to_string(world) + " ranks (" + comm->backend_name() + ", " +
                            dist::sync_mode_name(mode) + ")";
    std::fprintf(stderr, "tandem: %s (%lld parameters) on %s: %lld training / %lld test samples, batch %lld per rank, %s\n",
                 cfg.model.c_str(), static_cast<long long>(model->num_parameters()), cfg.dataset.c_str(),
                 static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
                 static_cast<long long>(cfg.batch_size), where.c_str());
  }
  bool progress = progress_enabled(cfg.progress, lead);
  std::optional<MetricsFile> metrics;
  if (lead && !cfg.metrics_path.empty()) metrics.emplace(cfg.metrics_path, new_run_id());
  std::optional<TensorBoardWriter> board;
  if (lead && !cfg.tensorboard_dir.empty()) board.emplace(cfg.tensorboard_dir);
  RunSummary summary;

  int64_t global_step = 0;
  for (int epoch = first_epoch; epoch < cfg.epochs; ++epoch) {
    if (lead) {
      std::printf("Starting Epoch %d:\n", epoch);
      std::fflush(stdout);
    }
    auto t0 = Clock::now();
    opt.reset_stats();
    model->train(true);
    Totals train(device);
    int64_t train_samples = 0;
    train_loader.start_epoch(epoch);
    ProgressBar bar(progress, train_loader.batches_per_epoch(), "epoch " + std::to_string(epoch));
    data::Batch batch;
    int64_t step = 0;
    while (train_loader.next(batch)) {
      Tensor logits, loss;
      {
        PrecisionScope scope(precision);
        logits = model->forward(batch.x);
        loss = softmax_cross_entropy(logits, batch.y);
      }
      opt.step(mode, loss, cfg.spars, cfg.error_feedback);
      Tensor loss_value = loss.detach();
      train.add(&loss_value, logits.detach(), batch.y, train_samples);
      ++global_step;
      // Partial mode lets replicas differ between full averages, and every mode lets batch-norm
      // statistics differ between evaluations: those are compared after each epoch's averages.
      if (cfg.check_consistency > 0 && mode != dist::SyncMode::Partial && global_step % cfg.check_consistency == 0)
        opt.check_consistency(/*include_buffers=*/false);
      if (board && global_step % cfg.tensorboard_every == 0) board->scalar("step/loss", loss_value.item<double>(), global_step);
      bar.update(++step, train_samples * world);
    }
    bar.finish();
    synchronize(device);
    double train_s = seconds_since(t0);
    dist::CommStats comm_stats = opt.stats();

    auto t1 = Clock::now();
    // Ranks evaluate one model: partial mode averages the parameters, every mode the buffers.
    if (mode == dist::SyncMode::Partial)
      opt.average_parameters();
    else
      opt.average_buffers();
    if (cfg.check_consistency > 0) opt.check_consistency();
    model->eval();
    Totals test(device);
    int64_t test_samples = 0;
    {
      NoGradGuard no_grad;
      PrecisionScope scope(precision);
      test_loader.start_epoch(0);
      while (test_loader.next(batch)) test.add(nullptr, model->forward(batch.x), batch.y, test_samples);
    }
    auto tr = train.reduce(*comm, train_samples);
    auto te = test.reduce(*comm, test_samples);
    double train_acc = tr[1] / std::max(tr[2], 1.0), eval_acc = te[1] / std::max(te[2], 1.0);
    double eval_s = seconds_since(t1), epoch_s = seconds_since(t0);
    TANDEM_RUNTIME_CHECK(std::isfinite(tr[0]), "the training loss became ", tr[0], " in epoch ", epoch,
                         "; lower --lr (or check the data)");

    if (lead) {
      std::printf("Training loss = %f, training accuracy = %f\n", tr[0], train_acc);
      std::printf("Evaluation accuracy = %f, Elapsed Time = %fs\n", eval_acc, epoch_s);
      if (cfg.report_comm) {
        double steps = std::max<double>(static_cast<double>(comm_stats.steps), 1.0);
        std::printf("Communication (rank 0): %.3f MB sent, %.3f MB received per step; %.3fs waiting, %lld collectives\n",
                    comm_stats.bytes_sent / steps / 1e6, comm_stats.bytes_received / steps / 1e6,
                    comm_stats.wait_seconds, static_cast<long long>(comm_stats.collectives));
      }
      std::fflush(stdout);
    }
    if (lead && !cfg.checkpoint.empty()) {
      nlohmann::json meta{{"epoch", epoch},           {"epochs", cfg.epochs},  {"model", cfg.model},
                          {"dataset", cfg.dataset},   {"hidden", cfg.hidden},  {"optimizer", cfg.optimizer},
                          {"world_size", world},      {"seed", cfg.seed},      {"dist_option", dist::sync_mode_name(mode)},
                          {"eval_acc", eval_acc}};
      save_checkpoint(cfg.checkpoint, *model, &opt.optimizer(), meta.dump());
    }
    const double bytes_per_step = static_cast<double>(comm_stats.bytes_sent) / std::max<int64_t>(comm_stats.steps, 1);
    if (lead) summary.add({epoch, eval_acc, train_s, static_cast<int64_t>(tr[2]), bytes_per_step});
    if (board) {
      board->scalar("train/loss", tr[0], epoch);
      board->scalar("train/accuracy", train_acc, epoch);
      board->scalar("eval/accuracy", eval_acc, epoch);
      board->scalar("train/images_per_s", tr[2] / train_s, epoch);
      board->scalar("comm/bytes_sent_per_step", bytes_per_step, epoch);
      board->flush();
    }
    if (metrics) {
      nlohmann::json j{{"epoch", epoch},
                       {"train_loss", tr[0]},
                       {"train_acc", train_acc},
                       {"eval_acc", eval_acc},
                       {"epoch_s", epoch_s},
                       {"train_s", train_s},
                       {"eval_s", eval_s},
                       {"train_samples", static_cast<int64_t>(tr[2])},
                       {"train_images_per_s", tr[2] / train_s},
                       {"model", cfg.model},
                       {"dataset", cfg.dataset},
                       {"device", device.str()},
                       {"world_size", world},
                       {"dist_option", dist::sync_mode_name(mode)},
                       {"precision", precision_name(precision)},
                       {"batch_size", cfg.batch_size},
                       {"bytes_sent_per_step", comm_stats.bytes_sent / std::max<int64_t>(comm_stats.steps, 1)},
                       {"bytes_received_per_step", comm_stats.bytes_received / std::max<int64_t>(comm_stats.steps, 1)},
                       {"comm_wait_s", comm_stats.wait_seconds}};
      metrics->write(j);
    }
  }
  if (lead) std::fprintf(stderr, "tandem: %s\n", summary.line(seconds_since(run_start)).c_str());
  return 0;
}

}  // namespace tandem::cli
