#pragma once
// Internal: `tandem train` as a session run through named phases — setup, then per epoch
// train_epoch, evaluate, report and save_checkpoint.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/interrupt.h"
#include "cli/run_report.h"
#include "cli/session.h"
#include "cli/tensorboard.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"

namespace tandem::cli {

/// Evaluation keeps no activations for a backward pass, so by default it takes batches this many
/// times the training batch: fewer, fuller steps over the test set.
constexpr int64_t kEvalBatchFactor = 4;

struct TrainConfig : SessionConfig {
  /// The evaluation batch per rank: eval_batch_size, or kEvalBatchFactor x batch_size when it is 0.
  int64_t eval_batch() const { return eval_batch_size > 0 ? eval_batch_size : kEvalBatchFactor * batch_size; }

  std::string recompute = "none";  // --recompute: none, or full (a ResNet's residual blocks run again in backward)
  std::string dataset = "fashion-mnist";
  std::string data_dir;  // empty: the data set's default directory
  int epochs = 10;
  int64_t batch_size = 64;
  int64_t accumulate = 1;  // micro-batches of batch_size per optimizer step
  int64_t eval_batch_size = 0;  // 0: kEvalBatchFactor x batch_size
  std::string metrics_path;
  std::string tensorboard_dir;     // TensorBoard event files go here when set
  int64_t tensorboard_every = 50;  // steps between step-level points
  int64_t limit_train = 0;  // 0: the whole split
  int64_t limit_test = 0;
  std::string progress = "auto";  // auto | on | off
  std::string data_on_device = "auto";  // auto | on | off: keep the data set on the GPU (LoaderOptions::on_device)
  int64_t check_consistency = 0;  // every N steps (0: never)
  bool report_comm = false;
  // checkpoints
  std::string checkpoint;  // saved after every epoch when set
  bool resume = false;     // continue from `checkpoint` when it exists
};

/// Where rank `rank` keeps its own state beside the checkpoint `checkpoint` (`m.ck` -> `m.ck.rank1`).
std::string rank_state_path(const std::string& checkpoint, int rank);
/// --resume: loads this rank's own state (DistOpt's per-rank state, the f16 loss scale) from its file
/// beside `checkpoint` when that file is there and was saved at the same point (its meta `key`, "epoch"
/// or "step", equal to `at`); a checkpoint saved by another number of ranks has every one of its rank
/// files read and their state re-cut (DistOpt::load_rank_states). What starts afresh instead is said
/// on stderr, with the reason.
void load_rank_state_beside(Session& s, const std::string& checkpoint, const std::string& key, int64_t at);
/// Saving a checkpoint, each rank's part first: writes this rank's own state to its file beside
/// `checkpoint` with its meta `key` set to `at` (so that a run stopped before the main file is written
/// resumes with that state started afresh, never with state newer than the model). Every rank calls
/// it, then gathers a sharded optimizer's state whole (GatheredOptimizerState) for rank 0 to write
/// with the model (any number of ranks, with any --shard, resumes from it).
void save_rank_state_beside(Session& s, const std::string& checkpoint, const std::string& key, int64_t at);

/// While it lives, a sharded optimizer's whole state is gathered into the wrapped optimizer for a
/// checkpoint of it (every rank makes one: the gather is collective); the copy is dropped after.
class GatheredOptimizerState {
 public:
  explicit GatheredOptimizerState(dist::DistOpt& opt) : opt_(opt) { opt_.gather_optimizer_state(); }
  ~GatheredOptimizerState() { opt_.release_optimizer_state(); }
  GatheredOptimizerState(const GatheredOptimizerState&) = delete;
  GatheredOptimizerState& operator=(const GatheredOptimizerState&) = delete;

 private:
  dist::DistOpt& opt_;
};

/// One epoch's training figures, summed over ranks.
struct EpochStats {
  double loss = 0;  // sum of the per-batch mean losses
  double correct = 0, samples = 0;
  double seconds = 0;
  dist::CommStats comm;  // this rank's traffic in the epoch
  // Stopped inside the epoch (Ctrl-C, SIGTERM): the batches done by then and the signal; the figures
  // above are those of these batches.
  int64_t stopped_at = 0;
  int stop_signal = 0;
};

/// One evaluation pass, summed over ranks.
struct EvalStats {
  double correct = 0, samples = 0;
  double seconds = 0;
};

class Trainer {
 public:
  explicit Trainer(const TrainConfig& cfg);
  ~Trainer();
  /// Every phase in order; returns the exit status.
  int run();

  /// Joins the job, loads the data, builds the model, resumes a checkpoint, syncs the ranks. Returns
  /// false when the checkpoint holds a finished run (nothing left to train).
  bool setup();
  /// Every rank was started with the same model, batch, data and synchronisation (rc 2 naming what
  /// differs otherwise); a differing seed or learning rate is only warned about.
  void check_ranks_agree();
  /// --resume: every rank finds the same checkpoint (or none: then nothing happens), which suits this
  /// run; each loads it and its own state beside it. Returns false when the run there is finished.
  bool resume();
  /// One pass over this rank's shard of the training set.
  EpochStats train_epoch(int epoch);
  /// Agrees on one model across ranks, then one pass over the test set.
  EvalStats evaluate();
  /// Rank 0 prints the guide's lines (and the traffic) and appends to the metrics file.
  void report(int epoch, const EpochStats& train, const EvalStats& eval, double epoch_seconds);
  /// Rank 0 saves the model and optimizer after the epoch (when --checkpoint is set).
  void save_checkpoint(int epoch, const EvalStats& eval);
  /// The ranks agreed to stop inside `epoch` (Ctrl-C, SIGTERM): saves a checkpoint of the batches done
  /// (a resumed run goes on from the next one, with this epoch's figures so far), says what was saved,
  /// and returns the exit status, 128 + the signal.
  int stop_inside_epoch(int epoch, const EpochStats& done);
  /// The ranks agreed to stop at the end of `epoch`, whose checkpoint is saved: says so; 128 + sig.
  int stop_after_epoch(int epoch, int sig);
  /// What every checkpoint of the run records (model, data set, ranks, ...), saved after `epoch`.
  nlohmann::json checkpoint_meta_json(int epoch);

 private:
  TrainConfig cfg_;
  std::unique_ptr<Session> session_;
  data::Dataset train_set_, test_set_;
  std::unique_ptr<data::DataLoader> train_loader_, test_loader_;
  std::optional<MetricsFile> metrics_;
  std::optional<TensorBoardWriter> board_;
  RunSummary summary_;
  std::chrono::steady_clock::time_point start_;
  int first_epoch_ = 0;
  int64_t global_step_ = 0;
  // Resuming inside an epoch: its first batch and its figures before it (summed over ranks).
  int64_t first_batch_ = 0;
  EpochStats carried_;
  std::unique_ptr<StopAgreement> stop_;  // while the epochs run
};

}  // namespace tandem::cli
