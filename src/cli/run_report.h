#pragma once
// Internal: what a training run reports besides its per-epoch lines: the --metrics JSON lines (each
// with the run's id and a timestamp) and the one-line summary at the end.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/safe_file.h"

namespace tandem::cli {

/// A new run id: 16 hex digits, random, so that runs appended to one metrics file stay apart.
std::string new_run_id();

/// The current UTC time as ISO 8601 with milliseconds ("2026-12-01T10:15:02.123Z").
std::string utc_timestamp();

/// Appends JSON lines to a metrics file, each stamped with run_id, time (ISO 8601) and unix_time.
class MetricsFile {
 public:
  /// Opens path for appending (creating it when missing); throws tandem::Error (Input) naming it when
  /// that fails or path is a symbolic link, not a regular file or a file with other hard links.
  MetricsFile(const std::string& path, std::string run_id);
  /// Writes j plus the stamps as one line and flushes it.
  void write(nlohmann::json j);

 private:
  std::string path_, run_id_;
  io::UniqueFd fd_;
};

/// One epoch's figures, as the summary needs them.
struct EpochFigures {
  int epoch = 0;
  double eval_acc = 0, train_s = 0;
  int64_t train_samples = 0;  // all ranks
  double bytes_per_step = 0;  // sent by rank 0
};

/// Accumulates epochs and renders the end-of-run line.
class RunSummary {
 public:
  void add(const EpochFigures& e);
  /// "done: 10 epochs in 131.2 s; final accuracy 0.9014, best 0.9020 (epoch 8); 5,039 images/s; 1.72 MB sent per step"
  std::string line(double wall_s) const;
  int epochs() const { return epochs_; }

 private:
  int epochs_ = 0;
  double final_acc_ = 0, best_acc_ = -1, train_s_ = 0, bytes_ = 0;
  int best_epoch_ = 0;
  int64_t samples_ = 0;
};

}  // namespace tandem::cli
