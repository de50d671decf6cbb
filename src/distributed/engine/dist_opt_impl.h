#pragma once
// Internal: DistOpt's state (the pimpl), shared by its source files: dist_opt.cpp (settings, steps,
// agreement, introspection) and dist_opt_state.cpp (a rank's own state in checkpoints).
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "distributed/engine/grad_codec.h"
#include "distributed/engine/param_averager.h"
#include "distributed/engine/reducer.h"
#include "distributed/engine/shard.h"
#include "tandem/distributed/dist_opt.h"

namespace tandem::dist {

inline constexpr const char* kPartial = "partialUpdate";

class DistOpt::Impl {
 public:
  Impl(const std::vector<Tensor>& params, const std::shared_ptr<Communicator>& comm, const DistOptOptions& options,
       const optim::Optimizer& opt)
      : options_(options),
        reducer_(params, comm,
                 {options.bucket_bytes, options.first_bucket_bytes, options.rebuild_buckets, options.skip_nonfinite,
                  options.shard, options.release_gradients},
                 stats_),
        env_{*comm, stats_, comm->device(), comm->rank(), comm->size(), DType::f32, {}, options.shard},
        one_(Tensor::ones({1}, DType::f32, comm->device())) {
    if (options.shard == Shard::none)
      averager_ = std::make_unique<detail::ParamAverager>(params, comm, options.bucket_bytes, stats_);
    else
      cut(comm, params, opt);
    for (const Tensor& p : params) {
      env_.shapes.push_back(p.shape());
      param_impls_.insert(p.impl());
    }
    use(options.sync);
  }

  // Makes the sharded step, its slices cut along `opt`'s groups.
  void cut(const std::shared_ptr<Communicator>& comm, const std::vector<Tensor>& params, const optim::Optimizer& opt,
           bool shard_parameters = false) {
    sharded_ = std::make_shared<detail::ShardedStep>(params, reducer_, comm, stats_, opt, shard_parameters,
                                                     options_.offload_optimizer,
                                                     options_.offload_parameters && shard_parameters);
    cut_for_ = opt.group_of();
  }

  // Backward from loss, with `then` (the reducer's hook, or nothing) called for each leaf. Throws when
  // backward reaches none of the optimizer's parameters: the step would change nothing.
  void backward_counted(const Tensor& loss, const GradReadyHook& then = {}) {
    int64_t reached = 0;
    // Released gradients: each bucket allocated as backward first reaches one of its parameters.
    const GradBufferProvider buffers = [this](const Tensor& leaf) { reducer_.grad_buffer(leaf); };
    GradBufferScope scope(reducer_.releases_gradients() ? &buffers : nullptr);
    backward(loss, [&](const Tensor& leaf) {
      reached += param_impls_.count(leaf.impl());
      reducer_.mark_used(leaf);
      if (then) then(leaf);
    });
    TANDEM_CHECK(reached > 0, "DistOpt: the loss does not depend on any of the optimizer's ",
                 param_impls_.size(), " parameters (was it computed from detached tensors or another model?)");
  }

  // Makes `s` the settings of the next step. A codec is made only when they change; residuals
  // survive a change of settings within one codec (a top-K flush with spars 1 keeps them) but not
  // a change of codec.
  void use(const SyncOptions& s) {
    SyncOptions want = s;
    want.method = parse_sync_method(s.method);
    if (ready_ && want == active_) return;
    TANDEM_CHECK(options_.shard == Shard::none || want.method != kPartial, "-d partialUpdate cannot be combined with "
                 "--shard ", shard_name(options_.shard), ": its ranks step whole replicas of the model (use -d plain or "
                 "-d half, or --shard none)");
    TANDEM_CHECK(!options_.uneven_inputs || want.method != kPartial, "-d partialUpdate cannot take uneven inputs: "
                 "its ranks step replicas on their own data (use a method that averages gradients)");
    if (want.method != kPartial) {
      bool same_codec = !codec_method_.empty() && codec_method_ == want.method;
      reducer_.set_codec(detail::make_codec(env_, want), same_codec);
      codec_method_ = want.method;
    }
    active_ = want;
    ready_ = true;
  }
  bool partial() const { return active_.method == kPartial; }

  // Uneven inputs: every rank's synchronisation starts with this all-reduce. Returns how many ranks
  // have data for it, and how many of those apply an update after it (the step's last micro-batch).
  std::pair<int64_t, int64_t> count_active(bool has_data, bool last) {
    Tensor t = Tensor::from_vector<int64_t>({has_data ? 1 : 0, has_data && last ? 1 : 0}, {2}).to(env_.device);
    WorkPtr w = env_.comm.all_reduce(t, ReduceOp::Sum);
    detail::count_all_reduce(stats_, 16, env_.world);
    detail::timed_wait(w, stats_);
    std::vector<int64_t> v = t.to_vector<int64_t>();
    return {v[0], v[1]};
  }

  DistOptOptions options_;
  CommStats stats_;
  detail::Reducer reducer_;
  std::unique_ptr<detail::ParamAverager> averager_;  // unsharded: the parameters' flat buffer
  std::shared_ptr<detail::ShardedStep> sharded_;     // sharded: the same, and the step of this rank's slices
  bool layers_found_ = false;  // sharded parameters: sync_parameters found the model's layer groups
  std::vector<int> cut_for_;   // sharded: the wrapped optimizer's group of each parameter when the slices were cut
  bool layers_attached_ = false;  // overlap_gather: the model's layers wait for the sharded step's gathers
  bool copies_kept_ = false;      // sharded: keep_parameter_copies handed out the sharded step's copies
  detail::CodecEnv env_;
  Tensor one_;
  // clip_grad_norm_in_update's coefficient, for the next update's optimizer to apply as it reads the gradients.
  Tensor pending_factor_;
  SyncOptions active_;
  std::string codec_method_;  // the method of the codec the reducer holds
  bool ready_ = false;
  int no_sync_depth_ = 0;
  bool accumulating_ = false;  // a backward ran since the last update: the next one adds to its gradients
  nn::NamedTensors buffers_;
  nn::NamedTensors frozen_;  // the model's parameters the optimizer does not hold, from sync_parameters
  std::vector<std::string> names_;  // per parameter, from sync_parameters
  bool synced_ = false;             // sync_parameters ran
  // partialUpdate: this rank's own replica from its saved state, taken after sync_parameters' broadcast.
  std::vector<Tensor> loaded_replica_;
  Tensor skipped_;  // skip_nonfinite: i64 [1] on the device, the steps skipped since reset_stats
  std::unordered_set<const void*> param_impls_;  // the optimizer's parameters, as backward's leaves name them
};

}  // namespace tandem::dist
