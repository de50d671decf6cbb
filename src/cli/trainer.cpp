// `tandem train`: the phases of a training run, in the order they run. A single process runs the
// same code with a one-rank communicator.
#include "cli/trainer.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <utility>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/progress.h"
#include "tandem/distributed/agreement.h"
#include "tandem/distributed/bootstrap.h"
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

  /// Sums over batches and ranks: {loss, correct, samples}, with the session's step sums when given.
  std::array<double, 3> reduce(dist::Communicator& comm, const StepSums* steps = nullptr) {
    NoGradGuard no_grad;
    Tensor loss = sum(loss_).view({1});
    Tensor counts = Tensor::empty({2}, DType::i64, loss_.device());
    counts.narrow(0, 0, 1).copy_(sum(correct_).view({1}));  // exact: whole numbers below 2^24
    int64_t samples = samples_;
    if (steps) {
      loss = tandem::add(loss, steps->loss);
      Tensor correct = counts.narrow(0, 0, 1);
      add_into(correct, steps->correct);
      samples += steps->samples;
    }
    counts.narrow(0, 1, 1).copy_(Tensor::full({1}, static_cast<double>(samples), DType::i64));
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

// Where a checkpoint's run stopped, after checking that it suits this run; says what changed.
struct ResumePoint {
  int next_epoch = 0;
  bool finished = false;
  // Saved inside next_epoch (the run was interrupted there): the batches done and their figures.
  int64_t first_batch = 0, of = 0;
  EpochStats carried;
  int64_t global_step = 0;
};

ResumePoint resume_point(const TrainConfig& cfg, const nlohmann::json& meta, const std::string& dist_option,
                         int world, bool lead) {
  const std::string& path = cfg.checkpoint;
  auto text = [&](const char* key) {
    TANDEM_CHECK(meta.contains(key) && meta[key].is_string(), "checkpoint '", path, "' does not record its --", key,
                 " (was it written by tandem train?)");
    return meta[key].get<std::string>();
  };
  for (auto [key, value] : {std::pair<const char*, const std::string*>{"model", &cfg.model},
                            {"dataset", &cfg.dataset}, {"optimizer", &cfg.optimizer}})
    TANDEM_CHECK(text(key) == *value, "checkpoint '", path, "' was saved with --", key, " ", text(key),
                 "; resume with the same value or use another --checkpoint");
  // The state each rank keeps beside the checkpoint belongs to its -d option: resuming under another
  // would silently drop it (or misread it), so a change of option starts a new run instead.
  if (meta.contains("dist_option")) {
    const std::string saved = text("dist_option");
    TANDEM_CHECK(saved == dist_option, "checkpoint '", path, "' was saved with -d ", saved, " and this run uses -d ",
                 dist_option, ": the ranks' ", saved, " state cannot carry over. Resume with -d ", saved,
                 ", or start a new run with another --checkpoint");
  }
  // Saved inside an epoch, "epoch" is the last whole one (-1 inside the first).
  const bool inside = meta.contains("partial_epoch") && meta["partial_epoch"].is_object();
  TANDEM_CHECK(meta.contains("epoch") && meta["epoch"].is_number_integer() &&
                   meta["epoch"].get<int64_t>() >= (inside ? -1 : 0),
               "checkpoint '", path, "' does not record the epoch it was saved after");
  ResumePoint at;
  at.next_epoch = static_cast<int>(meta["epoch"].get<int64_t>() + 1);
  if (meta.contains("global_step") && meta["global_step"].is_number_integer())
    at.global_step = meta["global_step"].get<int64_t>();
  if (inside) {
    const nlohmann::json& p = meta["partial_epoch"];
    auto num = [&](const char* key) {
      TANDEM_CHECK(p.contains(key) && p[key].is_number(), "checkpoint '", path, "' was saved inside an epoch but does "
                   "not record its ", key, " (was it written by tandem train?)");
      return p[key].get<double>();
    };
    TANDEM_CHECK(static_cast<int>(num("epoch")) == at.next_epoch && num("batches") >= 1, "checkpoint '", path,
                 "' records a stop inside epoch ", p.value("epoch", -1), " after epoch ", at.next_epoch - 1,
                 ": it is damaged");
    at.first_batch = static_cast<int64_t>(num("batches"));
    at.of = static_cast<int64_t>(num("of"));
    at.carried.loss = num("loss");
    at.carried.correct = num("correct");
    at.carried.samples = num("samples");
    at.carried.seconds = num("seconds");
    // The batches of an epoch are cut by the number of ranks, the batch size and --accumulate: resuming
    // at batch B means the same batches only with the same three.
    auto same = [&](const char* key, int64_t now, const char* flag) {
      const int64_t saved = static_cast<int64_t>(num(key));
      TANDEM_CHECK(saved == now, "checkpoint '", path, "' was saved inside epoch ", at.next_epoch, " (after batch ",
                   at.first_batch, ") with ", flag, " ", saved, "; this run has ", now, ". Resume it with ", flag, " ",
                   saved, " to finish that epoch on the same batches");
    };
    same("world_size", world, "ranks (-n)");
    same("batch_size", cfg.batch_size, "--batch-size");
    same("accumulate", cfg.accumulate, "--accumulate");
  }
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

// --data-on-device: auto keeps data sets of up to 2 GiB (both splits) on a GPU, where gathering a
// batch there costs one kernel instead of a host conversion and an upload per batch.
bool data_on_device(const std::string& mode, Device device, const data::Dataset& train, const data::Dataset& test) {
  if (mode == "off") return false;
  if (mode == "on") return true;
  const size_t bytes = train.images.nbytes() + train.labels.nbytes() + test.images.nbytes() + test.labels.nbytes();
  return device.is_cuda() && bytes <= (size_t(1) << 31);
}

std::string host_name() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("this host");
}

}  // namespace

std::string rank_state_path(const std::string& checkpoint, int rank) {
  return checkpoint + ".rank" + std::to_string(rank);
}

void load_rank_state_beside(Session& s, const std::string& checkpoint, const std::string& key, int64_t at) {
  // The checkpoint's job had as many rank files as ranks: this rank's own when the number is the same,
  // every one of them (re-cut by DistOpt) when it is not.
  auto main_meta = nlohmann::json::parse(checkpoint_meta(checkpoint), nullptr, false);
  int files = s.world();
  if (main_meta.is_object() && main_meta.contains("rank_files") && main_meta["rank_files"].is_number_integer())
    files = std::max(1, main_meta["rank_files"].get<int>());
  const bool same = files == s.world();
  std::vector<dist::RankState> states(static_cast<size_t>(same ? 1 : files));
  std::vector<std::pair<std::string, Tensor>> scale, first_scale;
  std::string why_not;
  for (int r = 0; r < static_cast<int>(states.size()); ++r) {
    const std::string file = rank_state_path(checkpoint, same ? s.rank() : r);
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) {
      why_not = "there is no '" + file + "'";
      continue;
    }
    auto own_meta = nlohmann::json::parse(checkpoint_meta(file), nullptr, false);
    const int64_t own_at = own_meta.is_object() ? own_meta.value(key, int64_t{-1}) : -1;
    if (own_at != at) {
      why_not = "'" + file + "' is from " + key + " " + std::to_string(own_at) + ", the checkpoint from " + key + " " +
                std::to_string(at);
      continue;
    }
    own_meta.erase(key);
    dist::RankState& state = states[static_cast<size_t>(r)];
    state.meta_json = own_meta.dump();
    std::vector<std::pair<std::string, Tensor>> file_scale;
    for (auto& [name, t] : read_checkpoint_tensors(file)) {
      if (name.rfind("dist/", 0) == 0) state.tensors.emplace_back(name.substr(5), t);
      if (name.rfind("loss_scale/", 0) == 0) file_scale.emplace_back(name.substr(11), t);
    }
    // The loss scale is the same on every rank: this rank's own, or else rank 0's.
    if (same || r == s.rank()) scale = file_scale;
    if (r == 0) first_scale = file_scale;
  }
  if (scale.empty()) scale = first_scale;
  std::vector<std::string> notes = same ? s.opt().load_rank_state(states[0]) : s.opt().load_rank_states(states);
  if (dist::LossScaler* scaler = s.loss_scaler()) {
    if (!scale.empty())
      scaler->load_state(scale);
    else
      notes.push_back("rank " + std::to_string(s.rank()) + ": the f16 loss scale starts afresh");
  }
  if (!why_not.empty() && !notes.empty()) notes.back() += " (" + why_not + ")";
  for (const std::string& n : notes) std::fprintf(stderr, "tandem: resuming: %s\n", n.c_str());
}

void save_rank_state_beside(Session& s, const std::string& checkpoint, const std::string& key, int64_t at) {
  dist::RankState state = s.opt().rank_state();
  auto meta = nlohmann::json::parse(state.meta_json);
  meta[key] = at;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : state.tensors) tensors.emplace_back("dist/" + name, t);
  if (const dist::LossScaler* scaler = s.loss_scaler())
    for (auto& [name, t] : scaler->state()) tensors.emplace_back("loss_scale/" + name, t);
  tandem::save_tensor_file(rank_state_path(checkpoint, s.rank()), tensors, meta.dump());
}

Trainer::Trainer(const TrainConfig& cfg) : cfg_(cfg) {}
Trainer::~Trainer() = default;

int Trainer::run() {
  start_ = Clock::now();
  if (!setup()) return 0;
  Session& s = *session_;
  // Ctrl-C / SIGTERM from here on: the ranks agree on a step boundary to stop at and save there.
  InterruptScope interrupts(s.lead(), cfg_.checkpoint.empty()
                                          ? std::string("with nothing to save (no --checkpoint)")
                                          : "saving the checkpoint '" + cfg_.checkpoint + "' there");
  stop_ = std::make_unique<StopAgreement>(s.comm(), s.device());
  for (int epoch = first_epoch_; epoch < cfg_.epochs; ++epoch) {
    auto t0 = Clock::now();
    EpochStats train = train_epoch(epoch);
    if (train.stopped_at > 0) return stop_inside_epoch(epoch, train);
    EvalStats eval = evaluate();
    double epoch_s = seconds_since(t0);
    TANDEM_RUNTIME_CHECK(std::isfinite(train.loss), "the training loss became ", train.loss, " in epoch ", epoch,
                         "; lower --lr (or check the data)");
    report(epoch, train, eval, epoch_s);
    save_checkpoint(epoch, eval);
    // A signal that came in the epoch's last step or its evaluation stops the run here, the epoch saved.
    if (epoch + 1 < cfg_.epochs)
      if (const int sig = stop_->now()) return stop_after_epoch(epoch, sig);
  }
  stop_->finish();
  stop_.reset();
  if (s.lead()) std::fprintf(stderr, "tandem: %s\n", summary_.line(seconds_since(start_)).c_str());
  return 0;
}

int Trainer::stop_after_epoch(int epoch, int sig) {
  Session& s = *session_;
  if (s.lead())
    std::fprintf(stderr, "tandem: interrupted by %s after epoch %d of %d: %s\n", stop_signal_name(sig).c_str(), epoch,
                 cfg_.epochs,
                 cfg_.checkpoint.empty() ? "nothing was saved (no --checkpoint)"
                                         : ("its checkpoint '" + cfg_.checkpoint + "' is saved (the same command with "
                                            "--resume goes on from there)").c_str());
  return 128 + sig;
}

int Trainer::stop_inside_epoch(int epoch, const EpochStats& done) {
  Session& s = *session_;
  synchronize(s.device());
  const int64_t batches = train_loader_->batches_per_epoch();
  if (!cfg_.checkpoint.empty()) {
    save_rank_state_beside(s, cfg_.checkpoint, "global_step", global_step_);
    GatheredOptimizerState gathered(s.opt());
    if (s.lead()) {
      nlohmann::json meta = checkpoint_meta_json(epoch - 1);
      meta["global_step"] = global_step_;
      meta["partial_epoch"] = {{"epoch", epoch},           {"batches", done.stopped_at}, {"of", batches},
                               {"loss", done.loss},        {"correct", done.correct},    {"samples", done.samples},
                               {"seconds", done.seconds},  {"world_size", s.world()},    {"batch_size", cfg_.batch_size},
                               {"accumulate", cfg_.accumulate}};
      tandem::save_checkpoint(cfg_.checkpoint, s.model(), &s.opt().optimizer(), meta.dump());
    }
  }
  if (s.lead()) {
    const std::string saved = cfg_.checkpoint.empty()
                                  ? std::string("nothing was saved (no --checkpoint)")
                                  : "saved the checkpoint '" + cfg_.checkpoint + "' (the same command with --resume "
                                    "goes on from the next batch)";
    std::fprintf(stderr, "tandem: interrupted by %s in epoch %d after batch %lld of %lld (step %lld): %s\n",
                 stop_signal_name(done.stop_signal).c_str(), epoch, static_cast<long long>(done.stopped_at),
                 static_cast<long long>(batches), static_cast<long long>(global_step_), saved.c_str());
  }
  return 128 + done.stop_signal;
}

bool Trainer::setup() {
  // A checkpoint that cannot be written is found before any training, not after the first epoch: rank 0
  // writes the checkpoint, every rank its own state beside it.
  if (!cfg_.checkpoint.empty()) {
    const int rank = dist::detect_env().rank;
    if (rank == 0) check_checkpoint_path(cfg_.checkpoint);
    check_checkpoint_path(rank_state_path(cfg_.checkpoint, rank));
  }
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
  apply_recompute(s, cfg_.recompute);

  check_ranks_agree();
  if (cfg_.resume && !resume()) return false;
  s.sync_model();

  data::LoaderOptions lo;
  lo.batch_size = cfg_.batch_size;
  lo.seed = cfg_.seed;
  lo.device = s.device();
  lo.rank = s.rank();
  lo.world_size = s.world();
  lo.reuse_buffers = s.device().is_cuda();  // a recorded step reads every batch where it read the first
  lo.on_device = data_on_device(cfg_.data_on_device, s.device(), train_set_, test_set_);
  // A training batch's gather is left to the step, which records it: a replay then gathers its own batch.
  lo.deferred_fill = lo.on_device;
  train_loader_ = std::make_unique<data::DataLoader>(train_set_, lo);
  lo.deferred_fill = false;
  lo.shuffle = false;
  lo.batch_size = cfg_.eval_batch();
  test_loader_ = std::make_unique<data::DataLoader>(test_set_, lo);

  if (s.lead()) {
    std::fprintf(stderr, "tandem: %s (%lld parameters) on %s: %lld training / %lld test samples, batch %lld per rank, %s\n",
                 cfg_.model.c_str(), static_cast<long long>(s.model().num_parameters()), cfg_.dataset.c_str(),
                 static_cast<long long>(train_set_.size()), static_cast<long long>(test_set_.size()),
                 static_cast<long long>(cfg_.batch_size), s.where().c_str());
    std::fprintf(stderr, "tandem: %s\n", s.memory_line().c_str());
    if (!cfg_.metrics_path.empty()) metrics_.emplace(cfg_.metrics_path, new_run_id());
    if (!cfg_.tensorboard_dir.empty()) board_.emplace(cfg_.tensorboard_dir);
  }
  return true;
}

void Trainer::check_ranks_agree() {
  Session& s = *session_;
  std::vector<dist::AgreementField> fields = s.agreement_fields();
  auto num = [](double v) { return detail::cat(v); };
  std::vector<dist::AgreementField> mine = {
      {"--batch-size", std::to_string(cfg_.batch_size)},
      {"--accumulate", std::to_string(cfg_.accumulate)},
      {"--epochs", std::to_string(cfg_.epochs)},
      {"training samples (--limit-train)", std::to_string(train_set_.size())},
      {"test samples (--limit-test)", std::to_string(test_set_.size())},
      {"--dataset", cfg_.dataset},
      {"--clip-norm", num(cfg_.clip_norm)},
      {"--check-consistency", std::to_string(cfg_.check_consistency)},
      {"--checkpoint (set or not)", cfg_.checkpoint.empty() ? "not set" : "set"},
  };
  fields.insert(fields.end(), mine.begin(), mine.end());
  dist::check_agreement(fields);
}

bool Trainer::resume() {
  Session& s = *session_;
  const std::string& path = cfg_.checkpoint;
  namespace fs = std::filesystem;
  // What this rank sees at --checkpoint; every rank must see the same (one file on a shared disk).
  std::error_code ec;
  std::string seen = "no checkpoint";
  nlohmann::json meta;
  std::exception_ptr unreadable;  // raised once the ranks agree that they all found this file
  if (fs::exists(path, ec)) {
    try {
      meta = nlohmann::json::parse(checkpoint_meta(path), nullptr, false);
      seen = meta.is_object() && meta.contains("epoch") && meta["epoch"].is_number_integer()
                 ? "the checkpoint of epoch " + std::to_string(meta["epoch"].get<int64_t>())
                 : "a checkpoint without an epoch";
    } catch (const Error& e) {
      seen = std::string("an unreadable checkpoint (") + e.what() + ")";
      unreadable = std::current_exception();
    }
  }
  dist::AgreementField field{"what --resume found", seen, true,
                             fs::absolute(path, ec).string() + " on " + host_name(),
                             "Every rank must find the same --checkpoint (on a disk all nodes share, or copied to "
                             "each node before resuming)"};
  dist::check_agreement({field});
  if (seen == "no checkpoint") {
    if (s.lead()) std::fprintf(stderr, "tandem: no checkpoint at '%s' yet: starting at epoch 0\n", path.c_str());
    return true;
  }
  if (unreadable) std::rethrow_exception(unreadable);
  const ResumePoint at = resume_point(cfg_, meta, s.sync().method, s.world(), s.lead());
  if (at.finished) return false;
  load_checkpoint(path, s.model(), &s.opt().optimizer());

  // This rank's own state, when its file is there and from the same point (a run stopped between
  // writing it and the checkpoint leaves an older or newer one: that state starts afresh, said below).
  if (at.first_batch > 0)
    load_rank_state_beside(s, path, "global_step", at.global_step);
  else
    load_rank_state_beside(s, path, "epoch", at.next_epoch - 1);
  first_epoch_ = at.next_epoch;
  first_batch_ = at.first_batch;
  carried_ = at.carried;
  global_step_ = at.global_step;
  if (s.lead()) {
    if (first_batch_ > 0)
      std::fprintf(stderr, "tandem: resuming from '%s' inside epoch %d, at batch %lld of %lld\n", path.c_str(),
                   first_epoch_, static_cast<long long>(first_batch_ + 1), static_cast<long long>(at.of));
    else
      std::fprintf(stderr, "tandem: resuming from '%s' at epoch %d\n", path.c_str(), first_epoch_);
  }
  return true;
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
  // A run resumed inside this epoch goes on at its batch, with the figures of the batches before.
  const int64_t first_batch = std::exchange(first_batch_, 0);
  const EpochStats carried = std::exchange(carried_, EpochStats{});
  train_loader_->start_epoch(epoch, first_batch);
  Tally tally(train_loader_->batches_per_epoch() - first_batch, s.device());
  s.reset_sums();
  bool progress = progress_enabled(cfg_.progress, s.lead());
  ProgressBar bar(progress, train_loader_->batches_per_epoch(), "epoch " + std::to_string(epoch));
  // Partial mode lets replicas differ between full averages, and every mode lets batch-norm
  // statistics differ between evaluations: those are compared after each epoch's averages.
  const bool check_steps = cfg_.check_consistency > 0 && !s.partial();
  // With --accumulate N, every N micro-batches make one step (the epoch's last step may have fewer);
  // each micro-batch's loss is weighted by 1/(micro-batches in its step), so the step applies the
  // mean gradient over its samples, as one batch of them would.
  const int64_t batches = train_loader_->batches_per_epoch(), n = cfg_.accumulate;
  data::Batch batch;
  int64_t i = first_batch;
  EpochStats st;
  s.aim_at_recorded_batch(batch.x, batch.y);
  while (train_loader_->next(batch)) {
    const int64_t first = i / n * n, in_step = std::min(n, batches - first);
    const bool last = i - first == in_step - 1;
    StepResult r;
    if (n == 1) {  // whole steps: the session may replay a recorded one, its sums kept on the device
      r = s.train_step(batch.x, batch.y, /*track=*/true, batch.fill);
    } else {
      if (batch.fill) batch.fill();
      r = s.forward_backward(batch.x, batch.y, 1.0 / static_cast<double>(in_step), last);
      tally.add(&r.loss, r.logits, batch.y);
      if (last) s.apply_update();
    }
    if (last) {
      ++global_step_;
      dist::report_step(global_step_);  // lets a timed-out rank name the one that stopped
      if (check_steps && global_step_ % cfg_.check_consistency == 0) s.opt().check_consistency(/*include_buffers=*/false);
      if (board_ && global_step_ % cfg_.tensorboard_every == 0)  // the one host read of a step, every N steps
        board_->scalar("step/loss", r.loss.item<double>() * static_cast<double>(in_step), global_step_);
    }
    bar.update(++i, (tally.samples() + s.sums().samples) * s.world());
    // Between steps, never inside one (a recorded step included): have the ranks agreed to stop? The
    // epoch's last step is left to the end of the epoch (Trainer::run), which saves a whole epoch.
    if (last && i < batches)
      if (const int sig = stop_ ? stop_->at_boundary() : 0) {
        st.stopped_at = i;
        st.stop_signal = sig;
        break;
      }
  }
  TANDEM_ASSERT(st.stopped_at > 0 || i == batches, "the loader gave ", i, " batches of the ", batches, " announced");
  bar.finish();
  synchronize(s.device());
  st.seconds = carried.seconds + seconds_since(t0);
  st.comm = s.opt().stats();
  auto totals = tally.reduce(s.comm(), &s.sums());
  st.loss = carried.loss + totals[0];
  st.correct = carried.correct + totals[1];
  st.samples = carried.samples + totals[2];
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
  s.reset_eval_sums();
  {
    NoGradGuard no_grad;
    data::Batch batch;
    test_loader_->start_epoch(0);
    PrecisionScope scope(s.precision());
    s.aim_at_recorded_eval_batch(batch.x, batch.y);
    while (test_loader_->next(batch)) s.eval_batch(batch.x, batch.y);
  }
  auto totals = Tally(1, s.device()).reduce(s.comm(), &s.eval_sums());
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
  if (c.skipped_updates > 0 && s.loss_scaler())
    std::printf("Skipped %lld steps whose f16 gradients overflowed; loss scale now %g\n",
                static_cast<long long>(c.skipped_updates), s.loss_scaler()->scale());
  if (cfg_.report_comm) {
    double steps = std::max<double>(static_cast<double>(c.steps), 1.0);
    std::printf("Communication (rank 0): %.3f MB sent, %.3f MB received per step; %.3fs waiting, %lld collectives\n",
                c.bytes_sent / steps / 1e6, c.bytes_received / steps / 1e6, c.wait_seconds,
                static_cast<long long>(c.collectives));
  }
  std::fflush(stdout);
  const double bytes_per_step = static_cast<double>(c.bytes_sent) / std::max<int64_t>(c.steps, 1);
  summary_.add({epoch, eval_acc, train.seconds, static_cast<int64_t>(train.samples), bytes_per_step});
  if (board_) {
    board_->scalar("train/loss", train.loss, epoch);
    board_->scalar("train/accuracy", train_acc, epoch);
    board_->scalar("eval/accuracy", eval_acc, epoch);
    board_->scalar("train/images_per_s", train.samples / train.seconds, epoch);
    board_->scalar("comm/bytes_sent_per_step", bytes_per_step, epoch);
    board_->flush();
  }
  if (!metrics_) return;
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
                   {"skipped_steps", c.skipped_updates},
                   {"batch_size", cfg_.batch_size},
                   {"eval_batch_size", cfg_.eval_batch()},
                   {"bytes_sent_per_step", c.bytes_sent / std::max<int64_t>(c.steps, 1)},
                   {"bytes_received_per_step", c.bytes_received / std::max<int64_t>(c.steps, 1)},
                   {"comm_wait_s", c.wait_seconds}};
  metrics_->write(j);
}

void Trainer::save_checkpoint(int epoch, const EvalStats& eval) {
  Session& s = *session_;
  if (cfg_.checkpoint.empty()) return;
  save_rank_state_beside(s, cfg_.checkpoint, "epoch", epoch);
  GatheredOptimizerState gathered(s.opt());
  if (!s.lead()) return;
  nlohmann::json main = checkpoint_meta_json(epoch);
  main["global_step"] = global_step_;
  main["eval_acc"] = eval.correct / std::max(eval.samples, 1.0);
  tandem::save_checkpoint(cfg_.checkpoint, s.model(), &s.opt().optimizer(), main.dump());
}

nlohmann::json Trainer::checkpoint_meta_json(int epoch) {
  Session& s = *session_;
  return nlohmann::json{{"epoch", epoch},
                      {"epochs", cfg_.epochs},
                      {"model", cfg_.model},
                      {"hidden", cfg_.hidden},
                      {"dataset", cfg_.dataset},
                      {"optimizer", cfg_.optimizer},
                      {"world_size", s.world()},
                      {"seed", cfg_.seed},
                      {"dist_option", s.sync().method},
                      {"shard", dist::shard_name(s.opt().options().shard)},
                      {"rank_files", s.world()}};
}

}  // namespace tandem::cli
