#pragma once
// Internal: the training loop behind `tandem train`.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::cli {

struct TrainConfig {
  std::string model = "cnn";
  std::string dataset = "fashion-mnist";
  std::string data_dir;  // empty: the data set's default directory
  int epochs = 10;
  int64_t batch_size = 64;
  std::string optimizer = "sgd";
  double lr = 0.005;
  double momentum = 0.9;
  double weight_decay = 1e-5;
  bool nesterov = false;
  std::string device = "cpu";
  std::string precision;  // f32 | tf32 | bf16 | f16; empty: the device's default
  uint64_t seed = 0;
  std::string metrics_path;
  std::string tensorboard_dir;      // TensorBoard event files go here when set
  int64_t tensorboard_every = 50;   // steps between step-level points
  int threads = 0;
  int64_t limit_train = 0;  // 0: the whole split
  int64_t limit_test = 0;
  std::vector<int64_t> hidden;
  std::string progress = "auto";  // auto | on | off
  // distributed training
  std::string dist_option = "plain";  // plain | half | partialUpdate | sparseTopK | sparseThreshold
  double spars = 0.05;
  bool error_feedback = true;
  double clip = 0.0;  // half: clip gradients into [-clip, clip] when positive
  std::string half_dtype = "f16";
  double bucket_mb = 16.0;
  double first_bucket_mb = 1.0;
  int64_t check_consistency = 0;  // every N steps (0: never)
  bool report_comm = false;
  double timeout_s = 300.0;
  // checkpoints
  std::string checkpoint;  // saved after every epoch when set
  bool resume = false;     // continue from `checkpoint` when it exists
};

/// Trains and evaluates per the config, printing the guide's per-epoch lines; returns the exit status.
int run_training(const TrainConfig& cfg);

}  // namespace tandem::cli
