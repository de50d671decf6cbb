#pragma once
// Internal: the memory a language model's training step needs on each rank, planned from the model's shape
// before anything is allocated (docs/memory.md). The plan walks one step as the program runs it: the tensors
// every op of a transformer block keeps for its backward (by dtype, as the allocator rounds them), the
// gradients as backward makes them (released between steps), the optimizer's state, and the transients of
// the loss, the backward and the update; its peak is the most those hold at any moment. `tandem train` and
// `tandem bench train` print it at start (memory_table) and refuse a run that would not fit the device.
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/device.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/dtype.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/precision.h"

namespace tandem::cli {

/// How transformer blocks keep what their backward reads (--recompute, nn::RecomputePolicy). Each policy maps to
/// what a micro-batch keeps through the forward pass (block_activations) and to what a block's backward holds again.
///  - none: every op keeps its tensors until its backward.
///  - full: a block keeps only its input; its backward runs the block again and holds one block's tensors.
///  - selective: as none, less each block's norm outputs (and SwiGLU output) from the block's close until its
///    backward begins, when they are made again.
using nn::RecomputePolicy;

/// What the plan is made from: the model, one rank's micro-batch, and how the run computes and shards.
struct MemoryPlanSettings {
  std::string model = "gpt";  // "gpt" or "llama"
  nn::GptConfig gpt;
  nn::LlamaConfig llama;
  int64_t batch = 1, context = 1;  // one micro-batch of one rank: batch sequences of context tokens
  int64_t accumulate = 1;          // micro-batches per optimizer step
  int64_t eval_batch = 0;          // rows of a validation batch (0: the run does not evaluate)
  bool checkpoint = false;         // the run saves checkpoints
  int64_t data_bytes = 0;          // the rank's token data kept on the device (train: its parts of the splits)
  Device device = Device::cpu();
  Precision precision = Precision::f32;
  int world = 1;        // ranks
  int local_ranks = 1;  // ranks on this host (they share its memory)
  std::string method = "plain";  // -d
  DType half_dtype = DType::f16;  // -d half: the wire's type
  double spars = 0.05;            // -d sparseTopK: the fraction sent
  int low_rank = 2;               // -d powerSGD: the approximation's rank
  bool error_feedback = true;     // sparse, powerSGD: residuals kept
  dist::Shard shard = dist::Shard::none;
  DType master_weights = DType::f32;  // --master-weights (f32: none)
  std::string optimizer = "adamw";
  double momentum = 0.9;  // sgd
  RecomputePolicy recompute = RecomputePolicy::none;
  bool param_copies = true;        // 16-bit weight copies wanted (TANDEM_PARAM_COPIES, GPU under bf16/f16)
  bool bias_from_product = false;  // layer norms before a biased product write padded rows (GPU default)
  bool fused_attention = true;     // attention through the fused kernels (the CPU's, cuDNN's); else the math
  bool column_sums = true;         // layer norms' backward hands on column sums (TANDEM_LN_COLUMN_SUMS)
  int64_t logit_chunk_bytes = int64_t(1024) << 20;  // the loss's logits per chunk (TANDEM_LOGIT_CHUNK_MB)
  size_t bucket_bytes = size_t(16) << 20, first_bucket_bytes = size_t(1) << 20;
  bool release_gradients = true;  // as the tandem program runs (DistOptOptions::release_gradients)
  /// --offload optimizer: the optimizer's state and this rank's slices of the values and gradients in host memory
  /// (shard none is planned as optimizer, as DistOpt runs it).
  bool offload_optimizer = false;
  /// --offload parameters: that, and stage 3's slices of the parameters on the host between uses (shard none
  /// planned as parameters).
  bool offload_parameters = false;
};

/// One parameter as the planner sees the model: its name, size and the layer groups that use it (embeddings 0,
/// block i as i + 1, the head layers + 1).
struct PlannedParam {
  std::string name;
  Shape shape;
  std::vector<int> groups;
  int64_t numel() const;
};

/// The model's parameters in the order the model registers them (Module::named_parameters).
std::vector<PlannedParam> planned_parameters(const MemoryPlanSettings& s);

/// The bytes a rank's part of a token stream takes on the device (data::TokenBatches uploads it: `width` bytes a
/// token, a byte more for a loss mask), `frame` > 0 cutting it at whole frames.
int64_t token_data_bytes(int64_t tokens, int width, bool masked, int64_t frame, int rank, int world);

/// A moment of the step and what it holds, for the planner's own accounting.
struct PlanMoment {
  std::string at;
  int64_t bytes = 0;
};

/// Bytes per rank, each tensor rounded as the device's caching allocator rounds it.
struct MemoryPlan {
  int64_t weights = 0;          // the f32 parameters (this rank's blocks under --shard parameters)
  int64_t weight_copies = 0;    // the 16-bit copies the products read (GPU, bf16 or f16)
  int64_t master_weights = 0;   // f32 masters (--master-weights)
  int64_t gradients = 0;        // all of them, as a step holds them at the end of its backward (with what the
                                // -d method keeps beside them: residuals, its wire's buffers)
  int64_t optimizer_state = 0;  // AdamW's moments, SGD's momentum (this rank's share under --shard)
  int64_t data = 0;             // the rank's token data on the device (train)
  int64_t between_steps = 0;    // what is held between steps (the parameters, their copies, the state, ...)
  int64_t activations = 0;      // what one micro-batch keeps for backward at the turn from forward to backward
  int64_t peak = 0;             // the most held at once in a step (or an evaluation, a checkpoint's save)
  std::string peak_at;          // the moment of the peak: "the loss (logits in chunks)", "backward, block 3's MLP"
  int64_t workspace = 0;        // what the peak holds beyond the parts above it counts (peak - the rest)
  int64_t host = 0;             // host memory beside, for a GPU run (checkpoints staged on the host; the
                                // offloaded state)
  int64_t host_state = 0;       // --offload optimizer: the state, slices and their gradients in host memory
  std::vector<PlanMoment> moments;  // the largest moment of each phase, in order
};

/// The plan of one training step (steady state: after the first, whose update makes the optimizer's state).
MemoryPlan plan_memory(const MemoryPlanSettings& s);

/// Sizes for people: "512 B", "3.4 KiB", "12.0 MiB", "1.53 GiB".
std::string format_bytes(int64_t bytes);

/// The plan as printed at start: a compact table of a few lines, each beginning "tandem: ". `available` is
/// what the device has (0: unknown), `where` names it ("cuda:0", "cpu, 2 ranks on this host").
std::string memory_table(const MemoryPlan& plan, const MemoryPlanSettings& s, int64_t available,
                         const std::string& where);

/// What the check compares the plan's peak with: the device's free memory (CUDA), or the host's available
/// memory shared by the ranks on it (the CPU), less a reserve for what the allocator does not count (the
/// CUDA context, library workspaces, the allocator's rounding up of whole blocks); TANDEM_MEMORY_LIMIT_MIB
/// sets it instead (planning for another device). 0 when unknown.
int64_t usable_memory(Device d, int local_ranks);

/// Settings that would make the run fit `budget` bytes, as flags to change ("--recompute full",
/// "--batch-size 4 --total-batch-tokens 65536", "--shard parameters on 4 ranks"), each planned; at most
/// a few, the cheapest first. `total_batch_tokens` false: the command takes no --total-batch-tokens
/// (bench train), so a smaller batch is offered as it is.
std::vector<std::string> fitting_flags(const MemoryPlanSettings& s, int64_t budget, bool total_batch_tokens);

}  // namespace tandem::cli
