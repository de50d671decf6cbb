#pragma once
// Internal: the reducer owns the gradient arena (every parameter's gradient is a view into one flat
// buffer), lays it out in buckets, follows which gradients are final during backward, launches
// each bucket through the codec the moment it is complete (strictly in order, so that every rank
// issues the same collectives in the same sequence) and finishes them after backward.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

struct ReducerOptions {
  size_t bucket_bytes = size_t(16) << 20;
  size_t first_bucket_bytes = size_t(1) << 20;
  bool rebuild_buckets = true;
  bool check_finite = false;  // decide after each finish whether any averaged gradient is inf/NaN
  /// optimizer: buckets padded to a multiple of the world size and reduce-scattered into the rank's
  /// block of the arena. gradients, parameters: no whole arena; each bucket is staged from the
  /// parameters' gradients as backward produces them, and only the rank's blocks are kept.
  Shard shard = Shard::none;
  /// Unsharded f32 (or 16-bit) gradients without master copies: no arena kept between steps. Each bucket's
  /// storage is allocated when backward first reaches one of its parameters (grad_buffer, through the
  /// autograd engine's GradBufferProvider) and dropped by release() after the update, so that gradients take
  /// the memory the activations free during backward instead of adding to the forward pass's peak.
  bool release_gradients = false;
};

class Reducer {
 public:
  /// Gradients of `params` go to an arena of their dtype (f32, or f16/bf16 for 16-bit gradients).
  /// With `masters` (f32 tensors, one per parameter), each finished bucket is also converted to f32
  /// into a second arena that the masters' grad() views: the optimizer sees f32 averages.
  Reducer(const std::vector<Tensor>& params, std::shared_ptr<Communicator> comm, ReducerOptions options,
          CommStats& stats, const std::vector<Tensor>& masters = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Sends gradients through `codec` from the next step on. Residuals are kept when keep_residuals
  /// and the codec keeps them too; otherwise they start from zero.
  void set_codec(std::unique_ptr<GradCodec> codec, bool keep_residuals);
  const GradCodec& codec() const { return *codec_; }

  // ---- one step, in the order it runs

  /// Before backward: unless accumulating onto the gradients of earlier micro-batches, adopts the
  /// layout learnt from the first step (when due) and zeroes the arena; points every parameter's
  /// grad() at its slot (zero_grad(set_to_none) may have dropped it).
  void begin(bool accumulate);
  /// With release_gradients, during backward: gives leaf (an optimizer's parameter without a gradient) its slot
  /// of its bucket, allocating the bucket (zeros) when none of its parameters has one yet. Others: nothing.
  void grad_buffer(const Tensor& leaf);
  /// Whether gradients are allocated per step (release_gradients, where it applies).
  bool releases_gradients() const { return lazy_; }
  /// With release_gradients, after the update: drops every bucket and every parameter's gradient.
  void release();
  /// The backward hook: leaf's gradient is final; launches every bucket completed, in order.
  void on_ready(const Tensor& leaf);
  /// After backward: launches the buckets still waiting (parameters that took no part), finishes
  /// every bucket in order, and decides whether any average is inf/NaN (with check_finite).
  void finish();
  /// Under sharded gradients: whether this step's buckets add their averages to the shard (a later
  /// micro-batch of an accumulated step) rather than replacing it.
  bool accumulating() const { return accumulating_; }
  /// After backward in a job of one rank: nothing travels; the codec's local effect only.
  void finish_locally();
  /// Backward reached `leaf` (an optimizer's parameter) in this step's backward or an earlier
  /// micro-batch's of it. Parameters that no rank's backward reached in a step are not stepped (unused()).
  void mark_used(const Tensor& leaf);
  /// After finish: the parameters (indices) that no rank used in this step, which the optimizer leaves
  /// alone (no momentum, no weight decay), as it does a parameter without a gradient. Several ranks agree
  /// on it with a small all-reduce of one flag per parameter, done on eager steps; a recorded step keeps
  /// the answer of the steps before it (a recording replays one graph, which uses the same parameters).
  const std::vector<int>& unused() const { return unused_; }
  /// After backward when gradients stay this rank's own (partialUpdate): only the gradient scale and,
  /// with check_finite, the verdict (agreed between ranks, so that every rank skips alike).
  void finish_unsynced();

  /// From the next step on, every gradient is multiplied by factor (one f32 on the device, read
  /// there) before anything else sees it: f16 loss scaling's inverse, so that codecs, their
  /// error-feedback residuals and the optimizer all work in unscaled units. Undefined: none.
  void set_gradient_scale(Tensor factor) { factor_ = std::move(factor); }
  /// For the next finish only: every gradient is multiplied by s before it is sent (uneven inputs:
  /// world / active ranks, so that the average over all ranks is the average over the active ones).
  void set_contribution_scale(double s) { contribution_ = s; }
  /// This rank contributes zeros to the next finish (a rank with no data left, under uneven inputs).
  void zero_contribution();

  /// With check_finite: whether the last finish found an inf/NaN average (the same on every rank).
  /// Reads the verdict on the host (a wait for the device).
  bool found_nonfinite() const;
  /// One f32 on the device, finite exactly when the last finish's averages were (with check_finite;
  /// always finite otherwise). Its address never changes: optimizers and recorded steps read it.
  const Tensor& verdict() const { return total_; }
  /// L2 norm of all the gradients (a one-element device tensor); with agree, made bit-identical on
  /// every rank by one tiny all-reduce.
  Tensor grad_norm(bool agree);
  /// Multiplies every gradient by coef (a one-element device tensor).
  void scale_grads(const Tensor& coef);

  // ---- state that outlives a step (checkpoints)
  /// Parameter indices in arena order (the bucket layout), and whether it is the learnt one.
  std::vector<int> layout_order() const;
  bool layout_learnt() const { return rebuilt_; }
  /// Adopts a layout saved by layout_order (a permutation of the parameters), as the learnt one.
  void restore_layout(const std::vector<int>& order);
  /// Lays the buckets out again so that none holds parameters of two keys (key_of_param[i]: parameter
  /// i's, its layer group's), the keys from the largest to the smallest and each key's parameters in
  /// reverse order, as backward meets them. Before the first step only.
  void set_groups(const std::vector<int>& key_of_param);
  /// The error-feedback residuals, every parameter's in arena order (undefined without them).
  const Tensor& residuals() const { return residual_arena_; }
  GradCodec& codec() { return *codec_; }

  // ---- sharding
  bool sharded() const { return options_.shard != Shard::none; }
  /// Whether every rank keeps the whole gradient arena (unsharded, sharded optimizer state, and any stage on
  /// one rank, whose one block of each bucket is the whole bucket: staging its gradients would only copy them).
  bool whole_arena() const {
    return options_.shard == Shard::none || options_.shard == Shard::optimizer || world_ == 1;
  }
  /// Under sharding: the average of this rank's block of bucket k ([span / world]), after finish.
  const Tensor& owned(size_t k) const { return owned_[k]; }
  /// Bytes of gradient storage kept between steps: the arena, or under sharded gradients the blocks.
  int64_t gradient_bytes() const;

  // ---- introspection
  const std::vector<Bucket>& buckets() const { return buckets_; }
  std::vector<double> residual_norms() const;
  void set_trace(bool on) { trace_on_ = on; }
  const std::vector<std::string>& trace() const { return trace_; }

 private:
  struct Slot {
    Tensor param, master;
    int64_t numel = 0, offset = 0;  // in the arena
    int bucket = -1;
    bool ready = false;
    bool used = false;  // backward reached it in this step (any of its micro-batches)
    Tensor grad, master_grad, residual;  // views of the arenas
  };
  void layout(const std::vector<int>& order);
  void ensure_bucket(Bucket& b);
  void ensure_buckets();
  void stage_gradient(Slot& s);
  void launch_ready();
  void finalize();
  void find_unused(bool agree);
  void rebuild();
  void apply_gradient_scale(Bucket& b);
  void save_carried();
  std::vector<Tensor> carried();
  Tensor f32_range(size_t k) const;

  std::shared_ptr<Communicator> comm_;
  ReducerOptions options_;
  CommStats& stats_;
  Device device_;
  int world_ = 1;
  std::vector<Slot> slots_;
  std::unordered_map<TensorImpl*, int> index_;
  int rank_ = 0;
  DType arena_dtype_ = DType::f32;
  bool lazy_ = false;        // release_gradients in force: buckets allocated per step
  int64_t arena_numel_ = 0;  // the arena's extent (allocated whole or, lazily, bucket by bucket)
  bool has_masters_ = false;
  Tensor arena_, master_arena_, residual_arena_;
  Tensor shard_arena_;          // sharded gradients: this rank's block of every bucket, in bucket order
  std::vector<Tensor> owned_;   // sharded: per bucket, this rank's block of the average
  bool accumulating_ = false;   // this step adds to the gradients of earlier micro-batches
  std::vector<Bucket> buckets_;
  std::unique_ptr<GradCodec> codec_;
  size_t next_launch_ = 0;
  std::vector<int> ready_order_;  // parameters in the order backward finished them, this step
  std::vector<int> unused_;       // parameters no rank used in the last finished step
  bool rebuild_due_ = false, rebuilt_ = false;
  bool checked_ = false;  // the last finish decided found_nonfinite
  Tensor bucket_sums_;       // check_finite, grad_norm: one value per bucket
  Tensor total_, norm_sq_;  // their sum, for check_finite and for grad_norm (allocated once)
  Tensor factor_;           // set_gradient_scale
  double contribution_ = 1.0;  // set_contribution_scale
  std::vector<int> groups_;     // set_groups: per parameter, the key of its layer group
  std::vector<Tensor> carried_saved_;  // check_finite: the carried state as it was before this step
  std::vector<Tensor> bucket_sum_views_;
  bool trace_on_ = false;
  std::vector<std::string> trace_;
};

}  // namespace tandem::dist::detail
