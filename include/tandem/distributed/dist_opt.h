#pragma once
// DistOpt: the distributed optimizer. Wraps any optimizer; gradients are averaged across ranks
// while backward is still running, then the wrapped optimizer applies them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/distributed/communicator.h"
#include "tandem/nn/module.h"
#include "tandem/optim/optimizer.h"

namespace tandem::dist {

/// How gradients (or, for partialUpdate, parameters) travel between ranks. `method` names a
/// gradient codec or partialUpdate; each codec reads the settings that concern it.
struct SyncOptions {
  /// plain (f32 all-reduce), half (16-bit all-reduce), sparseTopK, sparseThreshold, powerSGD (low
  /// rank), or partialUpdate (local steps, one chunk of the parameters averaged per step).
  std::string method = "plain";
  DType half_dtype = DType::f16;  // half: f16 or bf16 on the wire
  double clip = 0.0;              // half: each value clipped into [-clip, clip] before sending (0: off)
  double spars = 0.05;            // sparseTopK: fraction of each bucket sent; sparseThreshold: |g| threshold
  bool error_feedback = true;     // sparse, powerSGD: what was not sent is added to the next step's gradient
  int rank = 2;                   // powerSGD: rank of each matrix's approximation
  bool operator==(const SyncOptions&) const = default;
};

/// The canonical name of a method (plain, half, partialUpdate, sparseTopK, sparseThreshold,
/// powerSGD); lower-case and kebab-case spellings are accepted. Throws naming the valid ones otherwise.
std::string parse_sync_method(const std::string& s);
/// Every method parse_sync_method accepts, in canonical spelling.
std::vector<std::string> sync_method_names();

/// What each rank keeps only its own share of (ZeRO, Rajbhandari et al. 2020). Every bucket of
/// gradients is cut into one block per rank; rank r owns block r of every bucket.
///  - optimizer (stage 1): buckets are reduce-scattered instead of all-reduced; a rank steps the
///    optimizer on its own blocks only (its state exists only for them), then the parameters'
///    blocks are all-gathered. Same traffic as an all-reduce.
///  - gradients (stage 2): as optimizer, and a rank keeps only its block of each reduced bucket: a
///    gradient lives in a bucket-sized buffer from the moment backward produces it until its
///    bucket is reduced. Micro-batches are then reduced one by one (no whole gradient is kept to
///    accumulate into).
///  - parameters (stage 3): as gradients, and the parameters themselves are sharded: each layer group
///    (a ShardedLayer of the model, found by sync_parameters) is gathered whole just before its forward
///    and again before its backward, and freed after each; the next group's gather is started
///    meanwhile. Between steps a rank keeps only its blocks of the parameters.
enum class Shard { none, optimizer, gradients, parameters };
/// "none", "optimizer", "gradients", "parameters".
const char* shard_name(Shard s);
struct DistOptOptions;
/// What an options' offload keeps on the host, as --offload names it: "none", "optimizer" or "parameters".
const char* offload_name(const DistOptOptions& o);
/// The stage a name (or its number: 0, 1, 2, 3) stands for; throws naming the valid ones otherwise.
Shard parse_shard(const std::string& s);

/// The bytes one rank keeps for the model's training state, by kind, in the steady state (the
/// optimizer's state counted before its first step creates it). Buffers a step allocates and
/// frees (a bucket's staging under sharded gradients, a layer group's whole parameters under sharded
/// parameters) are not counted.
struct MemoryReport {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  /// f32 master copies of 16-bit parameters (DistOptOptions::master_weights): of every parameter, or of
  /// this rank's blocks under --shard. The parameters themselves are counted in f32: tandem keeps their
  /// 16-bit values in f32 storage.
  int64_t master_weights = 0;
  /// Under offload_optimizer: the bytes of this rank's host memory (the slices' values and gradients and the
  /// optimizer's state; the device's optimizer_state and master_weights are then 0).
  int64_t host = 0;
  /// The device's bytes (host memory not counted).
  int64_t total() const { return parameters + gradients + optimizer_state + master_weights; }
};

struct DistOptOptions {
  size_t bucket_bytes = size_t(16) << 20;       // gradient bytes per all-reduce (and partialUpdate's chunk)
  size_t first_bucket_bytes = size_t(1) << 20;  // a small first bucket starts communication early
  bool rebuild_buckets = true;                  // after the first step, order buckets as gradients arrived
  SyncOptions sync;                             // what step() and backward_and_sync() do
  /// Check the averaged gradients for inf/NaN after each synchronisation (every rank reaches the
  /// same verdict); update() then skips the step on every rank. For dynamic loss scaling. The skip is
  /// decided on the device, so such steps can be recorded; state carried between steps (residuals,
  /// PowerSGD's Q) is put back as it was before a skipped step.
  bool skip_nonfinite = false;
  /// Sharded state (ZeRO stages); methods plain and half only, buckets kept in the order of the
  /// first layout (not rebuilt).
  Shard shard = Shard::none;
  /// Ranks may run out of data at different steps (uneven inputs): every synchronisation first
  /// counts, with one 16-byte all-reduce, the ranks that still have data, and averages over them; a
  /// rank with no data left calls join(). Not with partialUpdate.
  bool uneven_inputs = false;
  /// --shard optimizer and gradients, with a model built of dist::ShardedLayer groups (found by
  /// sync_parameters): update() returns with the step's all-gathers in flight, issued in the order forward
  /// uses the groups, and each group waits for its own parameters as its forward begins, so that the
  /// gathers overlap the next forward (parameters in no group are waited for at once). Between update()
  /// and a group's next forward its parameters may still be arriving: read them only after
  /// wait_parameters() (DistOpt's own reads — checks, checkpoints, the next step — wait by themselves).
  bool overlap_gather = false;
  /// Mixed-precision master weights (Optimizer::keep_master_weights): bf16 or f16 makes the parameters hold
  /// values of that precision while the optimizer steps f32 masters, kept as its state: whole without
  /// sharding, this rank's blocks alone under --shard (the rank rounds its updated blocks into the
  /// parameters before the all-gather). Checkpoints keep the masters, re-cut like the rest of the state.
  /// f32 (the default): those of the wrapped optimizer (none unless it keeps them already). Not with
  /// partialUpdate.
  DType master_weights = DType::f32;
  /// Gradients held only from backward to the update (--shard none without master weights; elsewhere the
  /// gradients are kept as before): each bucket's storage is allocated as backward reaches its parameters, in
  /// memory the activations free, and released by update(), which leaves every parameter without a gradient,
  /// as PyTorch's zero_grad(set_to_none=True) after the step does. The peak of a step then holds no gradient
  /// beside the forward pass's activations. Off: the gradients stay (readable after update(), zeroed by the
  /// next step). The tandem program turns it on.
  bool release_gradients = false;
  /// The optimizer's step and state on the host (ZeRO-Offload's placement): the f32 values of this rank's
  /// slices (the masters under master_weights) and the optimizer's state live in host memory, and each update
  /// copies this rank's averaged gradients there, steps them on the CPU and writes the slices back into the
  /// parameters (rounded to their 16-bit precision under master weights) before the all-gather. The device
  /// keeps the parameters and the gradients alone. The state is sharded as under Shard::optimizer (which
  /// Shard::none becomes); checkpoints are those of the same run without offload, and resume either way.
  /// Updates run eagerly (the host's step is not recorded).
  bool offload_optimizer = false;
  /// The parameters' slices in host memory too (ZeRO-Infinity's CPU tier): under Shard::parameters each rank's
  /// slices live between uses only as the host's f32 values the offloaded step writes, and each layer group's
  /// slices are copied to the device as its all-gather starts, so that the device holds the groups in use and
  /// no slice between uses. Implies offload_optimizer; Shard::none becomes Shard::parameters (other stages are
  /// refused); f32 parameters only (no master_weights).
  bool offload_parameters = false;
};

/// A rank's own state beside the model and the optimizer, for checkpoints: the bucket layout, the
/// error-feedback residuals, PowerSGD's Q, partialUpdate's position and (since its replicas differ
/// between averages) the rank's own optimizer state. `meta_json` describes it (a JSON object).
struct RankState {
  std::string meta_json;
  std::vector<std::pair<std::string, Tensor>> tensors;
};

/// Communication counters, per rank.
struct CommStats {
  int64_t steps = 0;           // gradient synchronisations (or partialUpdate steps)
  int64_t collectives = 0;
  int64_t bytes_sent = 0;      // bytes this rank put on the wire (nccl-tests accounting)
  int64_t bytes_received = 0;  // bytes this rank took off the wire
  double wait_seconds = 0.0;   // host time blocked waiting for communication
  int64_t skipped_updates = 0;  // updates skipped for non-finite gradients
};

/// What the counters of b grew by since a (every field).
inline CommStats operator-(const CommStats& b, const CommStats& a) {
  return {b.steps - a.steps,           b.collectives - a.collectives, b.bytes_sent - a.bytes_sent,
          b.bytes_received - a.bytes_received, b.wait_seconds - a.wait_seconds,
          b.skipped_updates - a.skipped_updates};
}

/// One gradient bucket: a range of the gradient buffer holding whole parameters.
struct BucketInfo {
  int64_t offset = 0, numel = 0;  // the range, in elements (each parameter starts at a 16-byte boundary, the
                                  // gaps between them zero)
  int64_t span = 0;               // numel with the padding to whole blocks, one per rank (sharded; else numel)
  std::vector<int> params;        // the optimizer's parameter indices, in buffer order
  std::vector<int64_t> offsets;   // where each of them starts in the buffer
};

class DistOpt {
 public:
  /// Wraps opt; comm decides the ranks. Every rank must construct DistOpt with the same parameters
  /// and options.
  DistOpt(std::shared_ptr<optim::Optimizer> opt, std::shared_ptr<Communicator> comm, DistOptOptions options = {});
  ~DistOpt();
  DistOpt(const DistOpt&) = delete;
  DistOpt& operator=(const DistOpt&) = delete;

  /// GPU index on this node.
  int rank_in_local() const;
  /// Rank across all nodes.
  int rank_in_global() const;
  int world_size() const;
  Communicator& communicator() { return *comm_; }
  optim::Optimizer& optimizer() { return *opt_; }

  /// Checks that every rank built the same model (names, shapes, dtypes; throws saying what
  /// differs), then broadcasts parameters and buffers from rank 0 so all ranks start identical. The
  /// model's parameters the optimizer does not hold (frozen) are checked, broadcast and later compared
  /// (check_consistency) as well.
  /// Under Shard::parameters it first finds the model's layer groups (its ShardedLayers), and then
  /// shards the parameters: load a checkpoint into the model before calling it.
  void sync_parameters(nn::Module& model);

  // ---- a step, split around the synchronisation: backward_and_sync, user code, update

  /// Backward with each bucket of gradients averaged across ranks (options().sync) as soon as it
  /// is complete; on return every parameter's grad() holds the average (partialUpdate: its own).
  /// Gradients are zeroed by the first backward after an update; until update(), later ones add up.
  /// Throws when the loss depends on none of the optimizer's parameters (the step would do nothing).
  void backward_and_sync(const Tensor& loss);
  /// Scales the averaged gradients so that their global L2 norm is at most max_norm (by
  /// max_norm / (norm + 1e-6) when above). Returns the norm before clipping, a one-element tensor
  /// on the device, identical on every rank. Call between backward_and_sync and update.
  Tensor clip_grad_norm(double max_norm);
  /// As clip_grad_norm, the scaling left to the next update(): the optimizer that steps (the wrapped one,
  /// or under --shard the one of this rank's slices) multiplies the gradients by the coefficient as its step
  /// reads them where it can (Adam; not partialUpdate), the same update bit for bit without a pass over the
  /// gradients; otherwise they are scaled here. Until that update, grad() may hold the unclipped gradients.
  Tensor clip_grad_norm_in_update(double max_norm);
  /// bf16 or f16 copies of the parameters (one per parameter of the wrapped optimizer, in its order), the
  /// parameters' rounding now and kept so by every later update(): Adam writes them as it steps (unsharded),
  /// or the sharded step converts the gathered parameters in one pass (--shard optimizer, gradients, any
  /// optimizer). Empty where nothing keeps them: partialUpdate (its averages write the parameters), sharded
  /// parameters, an unsharded optimizer that writes no copies. The 16-bit products read them in place of the
  /// parameters inside a ParamCopiesScope. Writes to the parameters by other means (loading a checkpoint into
  /// them) leave the copies stale until this is called again.
  std::vector<Tensor> keep_parameter_copies(DType dtype);
  /// Multiplies every averaged gradient by coef, a one-element f32 tensor on the communicator's device
  /// (read on the device: no host wait). Call between backward_and_sync and update.
  void scale_gradients(const Tensor& coef);
  /// Applies the gradients with the wrapped optimizer (partialUpdate: then averages one chunk of
  /// the parameters). Returns false, on every rank, when the step was skipped for inf/NaN gradients
  /// (skip_nonfinite; the verdict is then read from the device, except while a DeviceGraph records the
  /// step: the skip is decided on the device alone, and update() returns true).
  /// Throws unless a backward_and_sync ran since the last update (its gradients would apply twice).
  bool update();
  /// backward_and_sync, then update.
  void step(const Tensor& loss);

  /// While the returned guard lives, backward_and_sync only accumulates this rank's gradients: no
  /// communication (for all but the last micro-batch of gradient accumulation). The first
  /// backward_and_sync after it averages the sum of every micro-batch's gradients once.
  class NoSync {
   public:
    explicit NoSync(DistOpt& opt);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistOpt& opt_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // ---- the guide's calls: each runs a whole step with its own method for that step

  /// Backward with bucketed f32 all-reduce overlapped, then the optimizer step.
  void backward_and_update(const Tensor& loss);
  /// As backward_and_update with gradients sent as f16 (options().sync.half_dtype); with clipping,
  /// each gradient value is first clipped into [-clip_value, clip_value].
  void backward_and_update_half(const Tensor& loss, bool clipping = false, double clip_value = 100.0);
  /// Backward and a local optimizer step, then one chunk of the parameters averaged across ranks.
  void backward_and_partial_update(const Tensor& loss);
  /// Backward with sparsified gradients: topK sends the ceil(spars*n) largest magnitudes per bucket,
  /// otherwise those with |g| >= spars; with corr, what was not sent is added to the next step's gradient.
  void backward_and_sparse_update(const Tensor& loss, double spars = 0.05, bool topK = false, bool corr = true);

  /// With uneven_inputs: this rank has no data left (no batch for the next step). Until every rank
  /// has called join(), it takes part in the other ranks' steps with zero gradients, and applies the
  /// same update (so that its parameters and optimizer state stay theirs); their averages are taken
  /// over the ranks that still have data. `clip_norm`: the max_norm the others pass to
  /// clip_grad_norm at every step (0: they do not clip). Every rank calls it at the end of its data
  /// (PyTorch's Join); returns the number of the others' steps this rank took part in.
  int64_t join(double clip_norm = 0.0);
  /// join() one step at a time, for callers that set the learning rate of each step themselves: takes
  /// part in the others' next step up to its update (its synchronisations, and clip_grad_norm when
  /// clip_norm is positive) and returns true, when update() must follow; false once every rank has
  /// joined. join() is `while (join_step(c)) update();`.
  bool join_step(double clip_norm = 0.0);

  /// Averages parameters and buffers across ranks (partialUpdate does this before evaluation).
  void average_parameters();
  /// partialUpdate: while it lives, the parameters are their average across ranks (to evaluate or save
  /// the one model the replicas stand for); each rank's own replica comes back when it goes, so training
  /// goes on as if nothing had happened. Collective. Under any other method it does nothing (the ranks
  /// hold the same parameters already).
  class AveragedReplicas {
   public:
    explicit AveragedReplicas(DistOpt& opt);
    ~AveragedReplicas();
    AveragedReplicas(const AveragedReplicas&) = delete;
    AveragedReplicas& operator=(const AveragedReplicas&) = delete;

   private:
    DistOpt& opt_;
    std::vector<Tensor> replica_;
  };
  /// Averages buffers only (batch-norm running statistics).
  void average_buffers();
  /// Throws, naming the first tensor that differs, unless all ranks hold bit-identical parameters,
  /// trained or frozen (and buffers, with include_buffers: batch-norm statistics agree only after
  /// average_buffers()).
  void check_consistency(bool include_buffers = true);
  /// Waits for the parameters' all-gathers still in flight (overlap_gather); a no-op otherwise.
  void wait_parameters();

  /// With skip_nonfinite: one f32 value on the device, finite exactly when the last synchronised
  /// gradients were (every rank holds the same); always finite otherwise. Its address never changes.
  const Tensor& step_verdict() const;
  /// Every gradient is multiplied by `factor` (one f32 value on the communicator's device, read there
  /// at each step) the moment backward has produced it, before it is sent: f16 loss scaling's inverse
  /// scale, so that codecs, their error-feedback residuals, clipping and the optimizer all see
  /// unscaled gradients whatever the scale does. An undefined tensor turns it off.
  void set_gradient_scale(const Tensor& factor);

  // ---- state beyond the model and the optimizer (checkpoints)

  /// This rank's state (see RankState), for a checkpoint's per-rank file.
  RankState rank_state();
  /// Loads what rank_state() saved, on the rank of the same number in a job of the same size, method
  /// and parameters; whatever does not fit starts afresh instead. Returns one line per part that
  /// starts afresh, saying why (empty when everything was loaded). Every rank calls it.
  std::vector<std::string> load_rank_state(const RankState& saved);
  /// Loads the states every rank of a checkpoint's job saved (saved[r]: rank r's), on any number of
  /// ranks. The same number: as load_rank_state(saved[rank]). Another: the state is re-cut, each rank
  /// taking rank 0's description (its bucket layout, partialUpdate's position) with the average over
  /// the saved ranks of what each kept for itself (error-feedback residuals: what remains to be sent
  /// then adds up to the same over the ranks; partialUpdate's local optimizer state) and rank 0's
  /// codec state (PowerSGD's Q, the same on every rank). Returns what load_rank_state returns, and a
  /// line saying that it was re-cut. Every rank calls it.
  std::vector<std::string> load_rank_states(const std::vector<RankState>& saved);
  /// Collective, under sharding: the wrapped optimizer's state becomes the whole state, gathered
  /// from every rank's slices, so that a checkpoint of optimizer() holds all of it; sharded parameters
  /// are gathered whole as well (until their layers' next use). Every rank calls it before the
  /// checkpoint is written, and release_optimizer_state() after; without sharding both do nothing. The
  /// copy is only read: the slices keep the state (a recorded step replays without host code), and the
  /// next eager update drops a copy not released. A checkpoint loaded into optimizer() is cut into this
  /// rank's slices at the next update (steps are recorded only after that): a run of any number of ranks
  /// and any Shard resumes from it.
  void gather_optimizer_state();
  /// Drops the copy gather_optimizer_state() made (its memory is the whole model's optimizer state).
  void release_optimizer_state();
  /// --shard parameters, once sync_parameters has sharded them: every parameter whole (a collective: every
  /// rank calls it), to be read, or written, as a whole (values set from outside, a checkpoint loaded into
  /// the model after sync_parameters) until release_parameters() or their layer groups' next use frees them.
  /// Does nothing otherwise.
  void gather_parameters();
  /// --shard parameters: frees the parameters gather_parameters() made whole; with `keep`, this rank first
  /// keeps its blocks of the values they hold now (what was written into them since: every rank must have
  /// written the same values). Nothing otherwise. Call it between steps.
  void release_parameters(bool keep);
  /// Regroups the wrapped optimizer's parameters (optim::Optimizer::set_param_groups: every parameter keeps
  /// its state). Under --shard optimizer and gradients the optimizer of this rank's slices was cut along the
  /// old groups: its state is gathered into the wrapped optimizer and the slices are cut again along the new
  /// ones (a collective: every rank calls it with the same groups). The wrapped optimizer regrouped directly
  /// (a checkpoint loaded into it restores its groups) is cut again the same way at the next update().
  /// Throws under --shard parameters once sync_parameters has sharded them, with overlap_gather once the
  /// layers wait for the step's gathers, and after keep_parameter_copies under --shard: give the groups
  /// before those.
  void set_param_groups(const std::vector<optim::ParamGroup>& groups);
  /// partialUpdate: the chunk of the parameters the next update() averages (a wait for the device).
  int64_t partial_chunk() const;

  // ---- introspection

  const CommStats& stats() const;
  void reset_stats();
  /// Records "launch <bucket>" and "backward_done" events in order (tests use it to see overlap).
  void set_trace(bool on);
  const std::vector<std::string>& trace() const;
  /// Element counts of the gradient buckets, in launch order.
  std::vector<int64_t> bucket_sizes() const;
  /// The buckets in launch order: which parameters each holds, and where.
  std::vector<BucketInfo> bucket_layout() const;
  /// Per parameter, the L2 norm of the error-feedback residual kept for it (0 without one).
  std::vector<double> residual_norms() const;
  const DistOptOptions& options() const;
  /// The bytes this rank keeps for parameters, gradients, optimizer state and master weights.
  MemoryReport memory_report() const;
  /// The optimizer that steps this rank's blocks under sharding (the wrapped optimizer's kind and
  /// settings over slices of the parameters); the wrapped optimizer itself otherwise.
  optim::Optimizer& stepping_optimizer();
  /// The settings the last step ran with.
  const SyncOptions& active_sync() const;
  /// Whether a step with those settings neither waits on the host nor allocates, so that it can be
  /// captured whole in a CUDA graph (all methods but sparseThreshold, whose counts are read on the host).
  bool step_capturable() const;

  // ---- recorded steps (tandem/graph.h)

  /// Why the next step (backward_and_sync, clip_grad_norm, update) could not be recorded once in a
  /// DeviceGraph and replayed; empty when it can.
  std::string replay_blocker() const;
  /// After a step was recorded, and before each replay: the stepping optimizer (the wrapped one, or the
  /// slices' under --shard) writes what its recorded step reads on the device (its rate and bias
  /// corrections for the step about to run: Optimizer::after_recording, prepare_replay).
  void after_recording();
  void prepare_replay();
  /// Forgets a step given up after backward_and_sync (a recording that failed part-way): the next
  /// backward_and_sync starts from zeroed gradients again.
  void abandon_step();
  /// The host-side bookkeeping of a step a replay ran: the counters advance by `delta` (what the
  /// recorded step added to stats()), the wrapped optimizer counts a step.
  void count_replayed_step(const CommStats& delta);

 private:
  void backward_and_sync_with(const SyncOptions& sync, const Tensor& loss);
  void find_layer_groups(nn::Module& model);
  void overlap_layer_groups(nn::Module& model);
  void take_loaded_replica();
  // Under --shard: cuts the slices again along the wrapped optimizer's groups, where they changed.
  void recut_slices();
  // The global norm (returned) and coef = min(1, max_norm / (norm + 1e-6)), both on the device.
  Tensor clip_coefficient(double max_norm, Tensor& coef);
  class Impl;
  std::shared_ptr<optim::Optimizer> opt_;
  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::dist
