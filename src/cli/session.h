#pragma once
// Internal: what `tandem train` and `tandem bench train` share — joining the job, the device, the
// communicator, the model, its optimizer and the distributed optimizer — and the training step.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/memory_plan.h"
#include "tandem/distributed/agreement.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/distributed/loss_scaler.h"
#include "tandem/graph.h"
#include "tandem/nn/models.h"
#include "tandem/optim/optimizer.h"
#include "tandem/precision.h"
#include "tandem/tensor.h"

namespace tandem {
class ParamCopies;
}

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
  std::string optimizer = "sgd";  // sgd, adam, adamw (see make_optimizer)
  double lr = 0.005;
  double momentum = 0.9;
  double weight_decay = 1e-5;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999;  // adam and adamw
  // distributed training
  std::string dist_option = "plain";  // a method of dist::sync_method_names()
  double spars = 0.05;
  bool error_feedback = true;
  double clip = 0.0;       // half: clip gradients into [-clip, clip] when positive
  double clip_norm = 0.0;  // clip the averaged gradients' global L2 norm to this when positive
  int low_rank = 0;        // powerSGD: rank of the approximation (0: its default)
  bool sync_bn = false;    // batch-norm statistics over the global batch
  std::string half_dtype = "f16";
  std::string shard = "none";  // none, optimizer, gradients, parameters (dist::parse_shard)
  std::string offload = "none";  // none, optimizer (DistOptOptions::offload_optimizer)
  std::string master_weights = "none";  // none, bf16, f16 (DistOptOptions::master_weights)
  double bucket_mb = 16.0;
  double first_bucket_mb = 1.0;
  double timeout_s = 300.0;
  bool per_rank_optimizer_settings = false;  // --lr, --momentum, --weight-decay may differ between ranks
  bool cuda_graph = true;  // replay a recorded step where it applies (see Session::train_step)
  bool deterministic = false;  // GPU algorithms that give the same bits on every run
  bool memory_check = true;    // language models: refuse a run whose memory plan does not fit the device
};

/// What a (micro-)batch produced, detached from autograd (for metrics).
struct StepResult {
  Tensor logits;  // undefined for a GPT, whose head is taken with its loss
  Tensor loss;  // weighted as in forward_backward: a step's micro-batches add up to its mean loss
  Tensor grad_norm;  // f32 [1]: the averaged gradients' L2 norm before clipping (with --clip-norm only)
};

/// The optimizer cfg.optimizer names for the model's parameters: "sgd" (momentum, Nesterov, L2 weight
/// decay), "adam" (L2 weight decay added to the gradients) or "adamw" (decoupled weight decay, applied
/// as GPT training runs apply it, nanoGPT's rule: to every parameter of two or more dimensions, the
/// matrices and embedding tables, and to no bias or normalisation parameter).
std::shared_ptr<optim::Optimizer> make_optimizer(const SessionConfig& cfg, const nn::Module& model);

/// Running sums, on the device, of the steps train_step was asked to track.
struct StepSums {
  Tensor loss;     // f32 [1]: the steps' mean losses, added up
  Tensor correct;  // i64 [1]: rows predicted right
  int64_t samples = 0;
};

/// One rank's share of a training job. The constructor joins the job; build_model and sync_model
/// follow; then train_step runs each step.
class Session {
 public:
  /// Checks the flags, sets the CPU threads, picks this rank's device and joins the job.
  explicit Session(const SessionConfig& cfg);
  ~Session();

  /// Builds the model for the given inputs, its optimizer and the distributed optimizer.
  void build_model(nn::ModelConfig mc);
  /// Every rank continues from rank 0's model: call after any checkpoint is loaded.
  void sync_model();
  /// What every rank must have been started with (model, parameters, optimizer, synchronisation,
  /// precision), for dist::check_agreement after build_model; the command adds its own.
  std::vector<dist::AgreementField> agreement_fields() const;
  /// Forward and backward of one micro-batch, its loss weighted by `weight` (1/N of a step of N
  /// micro-batches); the gradients are synchronised after the step's `last` micro-batch only. The loss
  /// is the softmax cross-entropy: over logits [N, C] against labels [N] (or target rows [N, C]), or,
  /// for a language model's logits [B, T, V], the mean over every position of targets [B, T].
  StepResult forward_backward(const Tensor& x, const Tensor& y, double weight, bool last);
  /// Clips the averaged gradients (--clip-norm) and applies them. Returns the norm before clipping
  /// (StepResult::grad_norm; undefined without --clip-norm).
  Tensor apply_update();
  /// One step on one batch: forward_backward, then apply_update; with track, the batch's loss and
  /// correct predictions are added to sums() on the device. With cuda_graph set, once a few steps
  /// of one batch shape have run, the step is recorded into a DeviceGraph and later steps of that
  /// shape replay it: the batch is copied into the recorded input (nothing when it already is that
  /// tensor) and the returned results are the recording's, rewritten by each replay. Other shapes,
  /// and steps that cannot be recorded (rank 0 prints why, once), run eagerly.
  /// `fill`, when given, queues the batch's arrival into x and y (a loader's deferred gather): it runs
  /// before an eager step and is recorded into the step, so that a replay gathers its own batch;
  /// a recording made with a fill is replayed only for steps that bring one, on the recorded tensors.
  StepResult train_step(const Tensor& x, const Tensor& y, bool track = false,
                        const std::function<void()>& fill = nullptr);
  StepSums& sums() { return sums_; }
  /// Zeroes sums() (queued on the device).
  void reset_sums();
  /// Steps run as replays so far.
  int64_t replays() const { return replays_; }
  /// Points `x` and `y` at the batch the recorded step reads, when there is one, so that a loader
  /// with reuse_buffers uploads the next batch straight into it (an epoch's first batch would
  /// otherwise arrive in a tensor of its own, and every batch after it be copied).
  void aim_at_recorded_batch(Tensor& x, Tensor& y) const;

  /// Evaluation of one batch (call in evaluation mode, without gradients): the model's forward, its
  /// correct predictions added to eval_sums() on the device. With cuda_graph set, after two batches
  /// of one shape the pass is recorded and later batches of that shape replay it, as train_step does.
  void eval_batch(const Tensor& x, const Tensor& y);
  const StepSums& eval_sums() const { return eval_sums_; }
  /// Zeroes eval_sums() (queued on the device).
  void reset_eval_sums();
  /// aim_at_recorded_batch for the recorded evaluation pass.
  void aim_at_recorded_eval_batch(Tensor& x, Tensor& y) const;

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
  dist::LossScaler* loss_scaler() { return scaler_.get(); }
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }
  /// Rank 0 prints the reports.
  bool lead() const { return rank() == 0; }
  /// "cpu, 2 threads, 2 ranks (gloo, plain)": where the session runs, for the start-up line.
  std::string where() const;
  /// "model state per rank (--shard none): parameters 1.7 MB, gradients 1.7 MB, ...": the start-up line
  /// of what DistOpt keeps (memory_report).
  std::string memory_line() const;
  /// The memory plan's settings this session decides (device, precision, ranks, sharding, optimizer, the
  /// kernels' choices); the command adds the model, its micro-batch and the recompute policy.
  MemoryPlanSettings memory_plan_settings() const;
  /// Plans a step (before the model is built), prints the plan's table (rank 0) and, when it does not fit the
  /// device and config().memory_check is on, throws on every rank (an error naming the peak, what is
  /// available and flags that would fit: fitting_flags); with it off, says so and goes on. Collective.
  /// `total_batch_tokens`: the command takes --total-batch-tokens (train), so smaller batches are offered with
  /// it. `check` false: the plan is only printed (bench train --plan-only).
  MemoryPlan plan_memory_or_refuse(const MemoryPlanSettings& ps, bool total_batch_tokens, bool check = true);
  /// What the plan is checked against on this rank (usable_memory; 0: unknown).
  int64_t memory_budget() const;

 private:
  struct RecordedBatch;
  struct Recorded;
  StepResult eager_step(const Tensor& x, const Tensor& y, bool track);
  StepResult record_step(const Tensor& x, const Tensor& y, bool track, const std::function<void()>& fill);
  StepResult replay_step(const Tensor& x, const Tensor& y);
  bool fits_recording(const Tensor& x, const Tensor& y, bool track, bool fill) const;
  void run_eagerly_because(const std::string& why);

  SessionConfig cfg_;
  dist::DistEnv env_;
  Device device_;
  std::shared_ptr<dist::Communicator> comm_;
  Precision precision_ = Precision::f32;
  nn::ModulePtr model_;
  std::unique_ptr<dist::DistOpt> opt_;
  std::unique_ptr<dist::LossScaler> scaler_;
  bool copies_wanted_ = false;               // see build_model
  std::unique_ptr<ParamCopies> copies_;      // made at the first forward_backward
  StepSums sums_;
  std::unique_ptr<Recorded> recorded_;
  bool graph_given_up_ = false;
  Shape steady_shape_;      // the batch shape of the last eager steps
  int64_t steady_steps_ = 0;  // how many in a row had it
  int64_t replays_ = 0;
  StepSums eval_sums_;
  std::unique_ptr<RecordedBatch> recorded_eval_;
  bool eval_given_up_ = false;
  Shape eval_shape_;
  int64_t eval_steady_ = 0;
};

/// --recompute: the session's model takes the policy (a GPT or a Llama: none, selective or full; a ResNet: none or
/// full); none does nothing; another model is refused.
void apply_recompute(Session& s, const std::string& policy);

}  // namespace tandem::cli
