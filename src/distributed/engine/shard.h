#pragma once
// Internal: the parameters' side of sharded state (ZeRO). The parameters move into one flat buffer
// laid out as the reducer's gradient arena (every bucket padded to one block per rank), so that rank
// r's block r of every bucket is a slice of each parameter it touches. An optimizer of the wrapped
// one's kind and settings steps those slices only, reading their gradients from the reducer's blocks
// of the averages: its state exists for them alone. After the step, every bucket's parameter blocks
// are all-gathered in place, and every rank holds the whole model again.
//
// With sharded parameters (stage 3) the parameter buffer stays whole only until sync_parameters
// (a loaded checkpoint and rank 0's broadcast land in it); then each rank keeps its blocks alone, and
// the parameters are gathered by layer group (ShardedLayer) just for their forward and backward: a
// released parameter views a single NaN, with zero strides.
#include <memory>
#include <string>
#include <vector>

#include "core/tensor_impl.h"

#include "distributed/engine/grad_codec.h"
#include "distributed/engine/reducer.h"
#include "tandem/distributed/sharded_layer.h"
#include "tandem/optim/optimizer.h"

namespace tandem::dist::detail {

/// One slice of a parameter that this rank steps.
struct ShardPiece {
  int param = 0;       // the wrapped optimizer's index
  int64_t start = 0;   // first element of the slice within the parameter
  int64_t numel = 0;
  int bucket = 0;      // the bucket it lies in
  int64_t offset = 0;  // where the slice starts in the parameter buffer (and the gradient arena)
};

class ShardedStep final : public LayerGatherer {
 public:
  /// Moves `params` into the parameter buffer (each keeps its identity and now views the buffer) and
  /// makes the optimizer of this rank's slices after `opt`. With shard_parameters, the slices are of
  /// this rank's blocks, kept apart (see shard_parameters()).
  ///
  /// offload: the slices' optimizer steps host copies of this rank's blocks (f32: the masters under master
  /// weights) with its state on the host: each step copies this rank's averaged gradient blocks to the host,
  /// steps there, and writes the blocks back into the parameters (rounded to their 16-bit precision under
  /// master weights) before the all-gather.
  ///
  /// offload_parameters (with shard_parameters and offload, f32 parameters): the kept blocks are the host's
  /// values themselves; each gather copies this rank's block of a bucket to the device first.
  ShardedStep(const std::vector<Tensor>& params, const Reducer& reducer, std::shared_ptr<Communicator> comm,
              CommStats& stats, const optim::Optimizer& opt, bool shard_parameters = false, bool offload = false,
              bool offload_parameters = false);
  bool offloads() const { return offload_; }
  /// Offload: bytes this rank keeps on the host (its blocks' values and gradients, and the optimizer's state).
  int64_t host_bytes() const;

  // ---- sharded parameters (stage 3)
  /// Keeps this rank's blocks of the parameters and frees the whole buffer: from now on the
  /// parameters are whole only while gathered. Once; does nothing without sharded parameters.
  void shard_parameters();
  /// Stage 3: groups_of_param[i] lists the layer groups that use parameter i (one, or several for a shared
  /// parameter). A bucket is gathered for each group that uses it and freed when none holds it.
  void set_layer_groups(const std::vector<std::vector<int>>& groups_of_param);
  void gather(int group, int next) override;
  void release(int group) override;
  /// Every group gathered (to read or write the whole parameters: checkpoints, checks), and released.
  void gather_all();
  void release_all();
  /// Stage 3: this rank's blocks take the values of the parameters gathered whole now (written since
  /// gather_all: a checkpoint loaded, values set), rounded to the parameters' 16-bit type under master
  /// weights; then every group is released.
  void keep_whole();
  bool shards_parameters() const { return stage3_; }

  /// Stages 1 and 2, overlapped gathers: group_of[i] is parameter i's layer group (-1: none). From the next
  /// step on, the step's all-gathers go out in the groups' order and are left in flight; gather(group, ...)
  /// waits for a group's, wait_all() for every one. Nothing overlaps on one rank.
  void overlap_groups(const std::vector<int>& group_of);
  /// Waits for every all-gather still in flight (and writes those buckets' 16-bit copies).
  void wait_all();

  /// Every rank takes root's parameters.
  void broadcast(int root);
  /// Steps this rank's slices with `opt`'s settings (learning rate, schedule, step count, group
  /// settings, step guard), counts the step in `opt`, then all-gathers the parameters (and writes their
  /// 16-bit copies, where kept). A defined grad_factor (one f32 value on the device, a clipping
  /// coefficient) multiplies every gradient the slices' optimizer reads (it must take one). The slices of
  /// the parameters `unused` lists (wrapped optimizer's indices: no rank used them) are not stepped.
  void step(optim::Optimizer& opt, const Tensor& grad_factor = Tensor(), const std::vector<int>& unused = {});
  /// Recorded steps (stages 1 and 2): the slices' optimizer takes `opt`'s settings for the step a replay is
  /// about to take and writes what its recorded step reads on the device (Optimizer::prepare_replay).
  void prepare_replay(const optim::Optimizer& opt);
  /// Stages 1 and 2: bf16 or f16 copies of the parameters in one buffer laid out as the parameter buffer,
  /// the parameters' rounding now and written again after every change of the parameters here (the step's
  /// gather, a broadcast, an average): one conversion of the whole buffer, or, on one rank with an optimizer
  /// that keeps copies (SGD, Adam), the copies its step writes. One view per parameter, in the order the step
  /// was made with. Empty under sharded parameters.
  std::vector<Tensor> keep_copies(DType dtype);
  /// Averages the parameters across ranks.
  void average();
  /// Collective: `opt`'s state lists (and step counts) receive the whole state, gathered from every
  /// rank's slices, as if `opt` had taken the steps itself (for a checkpoint of it). That copy is never
  /// taken back into the slices (they stay the state's one owner: a recorded step replayed since changes
  /// them without telling anyone): release_gathered_state() drops it, and so does the next eager step.
  void gather_state(optim::Optimizer& opt);
  /// Drops what gather_state left in `opt` (nothing when it left nothing).
  void release_gathered_state(optim::Optimizer& opt);
  /// Moves the state `opt` holds (a checkpoint loaded into it) into this rank's slices, cut from each
  /// parameter's, and drops it from `opt`; gather_state's copy is dropped, never taken. Returns whether
  /// it took any.
  bool adopt_state(optim::Optimizer& opt);
  /// Whether `opt` holds state adopt_state would take (a step recorded now would record the copies).
  bool state_to_adopt(optim::Optimizer& opt);

  /// The optimizer of this rank's slices (its parameter i is pieces()[i]).
  optim::Optimizer& stepper() { return *stepper_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  /// Bytes of the parameters kept between steps: the whole buffer, or this rank's blocks.
  int64_t parameter_bytes() const {
    if (stage3_ && offload_params_ && params_sharded_) return 0;  // on the host (host_bytes counts them)
    return static_cast<int64_t>(stage3_ ? (params_sharded_ ? blocks_.nbytes() : arena_.nbytes()) : arena_.nbytes());
  }
  /// Elements this rank steps (the optimizer's state is this many per copy).
  int64_t stepped_elements() const { return stepped_; }

 private:
  void gather();
  void refresh_copies();
  // Offload: this rank's block of bucket k in the parameters (of the buffer or of the kept blocks); the host
  // values read from them again; the stepped values written into them.
  Tensor device_block(size_t k);
  void refresh_host();
  void write_back();
  // The slices' state lists as the wrapped optimizer lists its own (offload under master weights: the host
  // values are the masters).
  std::vector<optim::Optimizer::StateList> slice_state_lists();
  Device state_device() const { return offload_ ? Device::cpu() : comm_->device(); }
  void wait_bucket(size_t k);
  void launch(size_t k);
  void bind(size_t k);
  void unbind(size_t k);
  // Runs f on the whole parameters (gathered for it), then keeps this rank's blocks of what f left.
  template <typename F>
  void on_whole(F f);
  std::shared_ptr<Communicator> comm_;
  CommStats& stats_;
  const Reducer& reducer_;
  std::vector<Tensor> params_;
  Tensor arena_;
  Tensor copy_arena_;  // keep_copies: the parameters' 16-bit copies, laid out as arena_
  bool stepper_copies_ = false;  // the slices' optimizer writes their copies in copy_arena_ as it steps
  // Stages 1 and 2 with overlapped gathers: the buckets with a parameter in no group; the order the step's
  // gathers go out in; each bucket's gather in flight (group_buckets_ lists each group's buckets).
  std::vector<size_t> waited_at_once_, gather_order_;
  // Master weights: per bucket, the 16-bit buffer its all-gather fills (declared before in_flight_, so that
  // the gathers are waited for before these go).
  std::vector<Tensor> staging_;
  BucketWork in_flight_;  // waited for (quietly) when the step goes away
  bool stage3_ = false;
  bool params_sharded_ = false;
  Tensor blocks_;                                 // stage 3: this rank's block of every bucket
  std::vector<int64_t> block_at_;                 // per bucket: where its block starts in blocks_
  std::vector<Tensor> whole_;                     // stage 3: per bucket, its parameters while gathered
  std::vector<Tensor> whole16_;                   // master weights: per bucket, its 16-bit gather in flight
  std::vector<WorkPtr> gathering_;                // per bucket: its all-gather in flight
  std::vector<std::vector<size_t>> group_buckets_;  // per layer group, the buckets holding its parameters
  std::vector<std::vector<int>> holders_;         // stage 3: per bucket, the groups that hold it gathered now
  Tensor absent_;                                 // what a released parameter views
  std::vector<std::weak_ptr<Storage>> held_;      // per bucket: a released buffer ops still view, emptied
  Allocator* allocator_ = nullptr;                // what filled such a buffer, to fill it again
  std::vector<ShardPiece> pieces_;                 // in the order of the stepping optimizer's parameters
  std::vector<std::vector<size_t>> bucket_pieces_;  // per bucket, its pieces' indices
  std::shared_ptr<optim::Optimizer> stepper_;
  int64_t stepped_ = 0;
  bool gathered_ = false;  // what the wrapped optimizer holds is gather_state's copy, not state to take
  DType param_dtype_ = DType::f32;  // the parameters' precision (bf16 or f16 under master weights)
  bool offload_ = false;
  bool offload_params_ = false;  // the kept blocks are host_values_ (stage 3 under offload)
  Tensor host_values_, host_grads_;  // offload: this rank's blocks on the host, laid out as block_at_ says
  std::vector<Tensor> host_pieces_;  // offload: the stepped slices of host_values_, in pieces_ order
  std::vector<Tensor> host_masters_;  // offload under master weights: host_pieces_ once stepped (the "master" list)
  bool host_stale_ = true;            // offload: host_values_ to be read from the parameters before the next step
};

}  // namespace tandem::dist::detail
