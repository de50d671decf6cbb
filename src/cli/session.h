#pragma once
// Internal: what `tandem train` and `tandem bench train` share — joining the job, the device, the
// communicator, the model, its optimizer and the distributed optimizer — and the training step.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/distributed/loss_scaler.h"
#include "tandem/nn/models.h"
#include "tandem/precision.h"
#include "tandem/tensor.h"

namespace tandem::cli {

/// The settings a session is built from (the flags train and bench have in common).
struct SessionConfig {
  std::string model = "cnn";
  std::vector<int64_t> hidden;  // mlp hidden sizes
  uint64_t seed = 0;            // initialisation (and, in train, shuffling)
  std::string device = "cpu";
  int threads = 0;         // 0: an equal share of the cores per rank
  std::string precision;   // f32, tf32, bf16, f16; empty: the device's default (tf32 on CUDA)
  // optimizer
  std::string optimizer = "sgd";
  double lr = 0.005;
  double momentum = 0.9;
  double weight_decay = 1e-5;
  bool nesterov = false;
  // distributed training
  std::string dist_option = "plain";  // a method of dist::sync_method_names()
  double spars = 0.05;
  bool error_feedback = true;
  double clip = 0.0;       // half: clip gradients into [-clip, clip] when positive
  double clip_norm = 0.0;  // clip the averaged gradients' global L2 norm to this when positive
  int low_rank = 0;        // powerSGD: rank of the approximation (0: its default)
  bool sync_bn = false;    // batch-norm statistics over the global batch
  std::string half_dtype = "f16";
  double bucket_mb = 16.0;
  double first_bucket_mb = 1.0;
  double timeout_s = 300.0;
};

/// What a (micro-)batch produced, detached from autograd (for metrics).
struct StepResult {
  Tensor logits;
  Tensor loss;  // weighted as in forward_backward: a step's micro-batches add up to its mean loss
};

/// One rank's share of a training job. The constructor joins the job; build_model and sync_model
/// follow; then train_step runs each step.
class Session {
 public:
  /// Checks the flags, sets the CPU threads, picks this rank's device and joins the job.
  explicit Session(const SessionConfig& cfg);

  /// Builds the model for the given inputs, its optimizer and the distributed optimizer.
  void build_model(nn::ModelConfig mc);
  /// Every rank continues from rank 0's model: call after any checkpoint is loaded.
  void sync_model();
  /// Forward and backward of one micro-batch, its loss weighted by `weight` (1/N of a step of N
  /// micro-batches); the gradients are synchronised after the step's `last` micro-batch only.
  StepResult forward_backward(const Tensor& x, const Tensor& y, double weight, bool last);
  /// Clips the averaged gradients (--clip-norm) and applies them.
  void apply_update();
  /// One step on one batch: forward_backward, then apply_update.
  StepResult train_step(const Tensor& x, const Tensor& y);

  const SessionConfig& config() const { return cfg_; }
  const dist::DistEnv& env() const { return env_; }
  Device device() const { return device_; }
  dist::Communicator& comm() { return *comm_; }
  nn::Module& model() { return *model_; }
  dist::DistOpt& opt() { return *opt_; }
  /// How the ranks synchronise (the -d option and its settings).
  const dist::SyncOptions& sync() const { return opt_->options().sync; }
  /// partialUpdate: replicas differ between the averages of their parameters.
  bool partial() const { return sync().method == "partialUpdate"; }
  /// How forward (and so backward) computes: the --precision asked for, or the device's default.
  Precision precision() const { return precision_; }
  /// f16's dynamic loss scaling (null in every other precision).
  const dist::LossScaler* loss_scaler() const { return scaler_.get(); }
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }
  /// Rank 0 prints the reports.
  bool lead() const { return rank() == 0; }
  /// "cpu, 2 threads, 2 ranks (gloo, plain)": where the session runs, for the start-up line.
  std::string where() const;

 private:
  SessionConfig cfg_;
  dist::DistEnv env_;
  Device device_;
  std::shared_ptr<dist::Communicator> comm_;
  Precision precision_ = Precision::f32;
  nn::ModulePtr model_;
  std::unique_ptr<dist::DistOpt> opt_;
  std::unique_ptr<dist::LossScaler> scaler_;
};

}  // namespace tandem::cli
