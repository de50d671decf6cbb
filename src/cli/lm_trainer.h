#pragma once
// Internal: `tandem train` for language models: optimizer steps over random windows of token shards,
// run through named phases — setup, then per step train_step (with evaluate, report and
// save_checkpoint when due). Every model that takes tokens i32 [B, T] and gives logits [B, T, V]
// trains here (bigram, gpt).
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/memory_plan.h"
#include "cli/run_report.h"
#include "cli/session.h"
#include "cli/tensorboard.h"
#include "tandem/data/tokens.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"

namespace tandem::cli {

struct LmTrainConfig : SessionConfig {
  LmTrainConfig() {
    optimizer = "adamw";
    lr = 6e-4;
    weight_decay = 0.1;
    clip_norm = 1.0;
    beta1 = 0.9;
    beta2 = 0.95;
  }
  // data
  std::string data_dir;    // --data: *train*.bin and *val*.bin in it
  std::string train_data;  // --train-data: a spec TokenStream takes
  std::string val_data;    // --val-data; empty: no validation (unless from --data)
  // the model's shape
  std::string gpt_config = "gpt2";
  std::string llama_config = "llama-1b";     // --model llama's named shape
  int64_t layers = 0, heads = 0, width = 0;  // 0: the configuration's
  int64_t kv_heads = 0, mlp_hidden = 0;      // llama: 0, the configuration's
  double rope_theta = 0.0;                   // llama: 0, the configuration's
  bool untied = false;                       // llama: an output layer of its own
  std::string recompute = "none";            // gpt, llama: none, selective or full (nn::RecomputePolicy)
  double dropout = -1.0;                     // < 0: the configuration's
  std::string init;  // --init: start from this Hugging Face directory or tandem checkpoint (its weights)
  int64_t context = 0;                       // 0: the model's (gpt: its configuration's; bigram: 256)
  int64_t vocab = 0;  // 0: the data's meta.json's, else the configuration's (gpt) or the data's largest + 1 (bigram, at least 256)
  // batches and steps
  int64_t batch_size = 8;          // sequences per rank per micro-batch
  int64_t total_batch_tokens = 0;  // tokens per optimizer step over all ranks; 0: one micro-batch
  int64_t steps = 1000;
  int64_t stop_at = 0;  // end this run after this step (the schedule still spans --steps); 0: at --steps
  // the schedule
  int64_t warmup = 0;
  double min_lr = -1.0;  // < 0: lr / 10
  // evaluation, reports, checkpoints
  int64_t eval_every = 250;  // 0: at the end only
  int64_t eval_steps = 20;   // validation batches per evaluation
  int64_t log_every = 1;
  std::string metrics_path;
  std::string tensorboard_dir;
  std::string checkpoint;
  int64_t checkpoint_every = 0;  // 0: at the end (and at --stop-at) only
  bool resume = false;
  int64_t check_consistency = 0;
  bool report_comm = false;

  /// min_lr as given, or lr / 10.
  double min_lr_or_default() const { return min_lr >= 0.0 ? min_lr : lr / 10.0; }
};

/// The data specs of a run: --data DIR's *train*.bin and *val*.bin, or --train-data and --val-data. A
/// --train-data directory that holds both splits (nanoGPT's train.bin and val.bin, llm.c's *_train*.bin and
/// *_val*.bin) is read as --data DIR: its training shards train, and its validation shards validate unless
/// --val-data is given.
struct LmDataSpecs {
  std::string train, val;  // val empty: no validation
  // The vocabulary the data declare: "vocab_size" of DIR/meta.json (256 for `tandem data text`'s byte
  // tokens) when --data DIR has one, else 0. A meta.json that is not JSON, or whose vocab_size is not a
  // positive integer, is an error naming it.
  int64_t vocab = 0;
  std::string vocab_from;  // the meta.json it came from
  std::string note;        // how the specs were read from the flags, when that needs saying
  // Instruction data (`tandem data jsonl`, "loss_mask": true in DIR/meta.json): a loss mask beside each
  // shard, and the stream cut into frames of `frame` tokens (context + 1: one padded example, or whole
  // examples packed, each) that windows are drawn at. A meta.json whose "window" is not a positive
  // integer is an error naming it.
  bool loss_mask = false;
  int64_t frame = 0;
  std::string packing;  // "pad" or "pack"
  std::string meta;     // the meta.json that said so
};
LmDataSpecs lm_data_specs(const LmTrainConfig& cfg);

/// The context a run trains with: --context, or the data's when it is framed (data.frame - 1) and
/// --context is not given; 0 when neither says (the model's then). Framed data with another --context
/// is an error: its windows hold frame tokens.
int64_t lm_data_context(const LmTrainConfig& cfg, const LmDataSpecs& data);

/// A split's token stream as the trainer reads it: spec's shards, with their loss masks beside them when
/// the data has them (data.loss_mask). Shards with a loss mask beside them that data does not know of
/// (no meta.json said "loss_mask") are an error: they train through --data DIR.
data::TokenStream lm_token_stream(const std::string& spec, const LmDataSpecs& data);

/// The options of one rank's batches as the trainer draws them: --batch-size windows of `context`
/// tokens, decided by --seed and the rank; consecutive for validation, random for training; at the
/// data's frames when it has them.
data::TokenBatchOptions lm_batch_options(const LmTrainConfig& cfg, const LmDataSpecs& data, int64_t context, int rank,
                                         int world, Device device, bool validation);

/// The model's shape for the run: --gpt-config with its overrides, context and vocabulary resolved
/// against the data: --vocab when given, else the vocabulary the data declare (`data.vocab`), else the
/// configuration's (gpt) or the smallest that holds the data's largest token (bigram: 256 for bytes).
/// A vocabulary too small for the largest token is an error naming both.
nn::GptConfig lm_model_shape(const LmTrainConfig& cfg, int64_t largest_token, const LmDataSpecs& data = {});

/// The keys of a GPT's shape in a checkpoint's meta ("layers", "heads", "width", "context", "vocab",
/// "dropout", "bias"), and back.
/// --model llama's shape: --llama-config with its overrides, context and vocabulary resolved as for a GPT.
nn::LlamaConfig lm_llama_shape(const LmTrainConfig& cfg, int64_t largest, const LmDataSpecs& data);
nlohmann::json gpt_shape_json(const nn::GptConfig& g);
nn::GptConfig gpt_shape_from_json(const nlohmann::json& j);

/// Micro-batches per optimizer step for --total-batch-tokens (1 when it is 0); an error naming the
/// figures when it is not a multiple of batch x context x world.
int64_t lm_accumulation(int64_t total_batch_tokens, int64_t batch, int64_t context, int world);

class LmTrainer {
 public:
  explicit LmTrainer(const LmTrainConfig& cfg);
  ~LmTrainer();
  /// Every phase in order; returns the exit status.
  int run();

  /// Joins the job, maps the shards, builds the model and its schedule, resumes a checkpoint, syncs
  /// the ranks. Returns false when the checkpoint holds a finished run.
  bool setup();
  /// Every rank was started with the same model, data, batch and schedule.
  void check_ranks_agree();
  /// --resume: continues from --checkpoint when it exists (model, optimizer and schedule step, each
  /// rank's own state, the windows drawn, the dropout generators). False when the run there is finished.
  bool resume();
  /// One optimizer step (its micro-batches); returns the step's loss tensor (on the device, summed
  /// over micro-batches: the step's mean loss on this rank) and the gradient norm when clipped.
  StepResult train_step();
  /// The mean loss over --eval-steps validation batches of every rank (seen from the same first window
  /// every time).
  double evaluate();
  /// Rank 0 prints the step line and writes the metrics and TensorBoard points.
  void report_step(int64_t step, const StepResult& r, double seconds, int64_t steps_timed);
  void report_eval(int64_t step, double val_loss, double seconds);
  /// Saves the model, the optimizer and each rank's state after `step` steps (when --checkpoint is set).
  void save_checkpoint(int64_t step);
  void save_main_checkpoint(int64_t step);  // rank 0: the model, the optimizer and the run's meta data
  /// The ranks agreed to stop after `step` for signal `sig` (Ctrl-C, SIGTERM): saves the checkpoint there,
  /// says what was saved, and returns the exit status, 128 + sig.
  int stop_after(int64_t step, int sig);
  /// Rank 0 prints the peak of tensors held at once over the run beside the memory plan's (gpt, llama).
  void report_memory();

 private:
  LmTrainConfig cfg_;
  LmDataSpecs specs_;
  std::unique_ptr<Session> session_;
  data::TokenStream train_stream_, val_stream_;
  std::unique_ptr<data::TokenBatches> train_batches_, val_batches_;
  nn::GptConfig shape_;       // gpt, bigram
  nn::LlamaConfig llama_;     // llama
  int64_t vocab_ = 0;         // the model's vocabulary (any kind)
  std::string hf_config_;     // --init of a Hugging Face directory: its config.json
  nlohmann::json shape_json() const;  // the model's shape as the checkpoint records it ("gpt" / "llama")
  int64_t context_ = 0, accumulate_ = 1;
  double flops_per_token_ = 0, peak_ = 0;
  Tensor x_, y_;                   // the training batch, drawn in place
  Tensor pos_;                     // packed examples: each token's position in its example (else undefined)
  Tensor step_loss_;               // f32 [1]: the micro-batches' weighted losses of a step, added up
  std::optional<MetricsFile> metrics_;
  std::optional<TensorBoardWriter> board_;
  int64_t first_step_ = 0;
  double last_val_loss_ = -1;
  std::string eager_because_;  // why steps on a GPU are not recorded, when the trainer decided it
  std::optional<MemoryPlan> plan_;  // gpt, llama: the memory plan printed at start
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem::cli
