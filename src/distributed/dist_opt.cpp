// DistOpt: the public face of the reducer. It picks the codec a step's settings ask for, runs
// backward with the reducer's hook, and applies the averages with the wrapped optimizer; the
// guide's calls are each one step with their own settings.
#include "tandem/distributed/dist_opt.h"

#include <cctype>
#include <unordered_set>

#include "backend/backend.h"
#include "distributed/grad_codec.h"
#include "distributed/param_averager.h"
#include "distributed/reducer.h"
#include "distributed/sync_check.h"
#include "tandem/autograd.h"

namespace tandem::dist {

namespace {

std::string normalise(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '-' && c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

constexpr const char* kPartial = "partialUpdate";

}  // namespace

std::vector<std::string> sync_method_names() {
  std::vector<std::string> out;
  for (const detail::CodecName& c : detail::codec_names()) out.push_back(c.name);
  out.push_back(kPartial);
  return out;
}

std::string parse_sync_method(const std::string& s) {
  const std::string n = normalise(s);
  if (n == normalise(kPartial) || n == "partial") return kPartial;
  for (const detail::CodecName& c : detail::codec_names()) {
    if (normalise(c.name) == n) return c.name;
    for (const char* alias : c.aliases)
      if (normalise(alias) == n) return c.name;
  }
  std::string all;
  std::vector<std::string> names = sync_method_names();
  for (size_t i = 0; i < names.size(); ++i) all += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  TANDEM_CHECK(false, "unknown distributed option '", s, "' (choose ", all, ")");
}

class DistOpt::Impl {
 public:
  Impl(const std::vector<Tensor>& params, const std::shared_ptr<Communicator>& comm, const DistOptOptions& options)
      : options_(options),
        reducer_(params, comm,
                 {options.bucket_bytes, options.first_bucket_bytes, options.rebuild_buckets, options.skip_nonfinite},
                 stats_),
        averager_(params, comm, options.bucket_bytes, stats_),
        env_{*comm, stats_, comm->device(), comm->rank(), comm->size(), DType::f32, {}},
        one_(Tensor::ones({1}, DType::f32, comm->device())) {
    for (const Tensor& p : params) {
      env_.shapes.push_back(p.shape());
      param_impls_.insert(p.impl());
    }
    use(options.sync);
  }

  // Backward from loss, with `then` (the reducer's hook, or nothing) called for each leaf. Throws when
  // backward reaches none of the optimizer's parameters: the step would change nothing.
  void backward_counted(const Tensor& loss, const GradReadyHook& then = {}) {
    int64_t reached = 0;
    backward(loss, [&](const Tensor& leaf) {
      reached += param_impls_.count(leaf.impl());
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
    if (want.method != kPartial) {
      bool same_codec = !codec_method_.empty() && codec_method_ == want.method;
      reducer_.set_codec(detail::make_codec(env_, want), same_codec);
      codec_method_ = want.method;
    }
    active_ = want;
    ready_ = true;
  }
  bool partial() const { return active_.method == kPartial; }

  DistOptOptions options_;
  CommStats stats_;
  detail::Reducer reducer_;
  detail::ParamAverager averager_;
  detail::CodecEnv env_;
  Tensor one_;
  SyncOptions active_;
  std::string codec_method_;  // the method of the codec the reducer holds
  bool ready_ = false;
  int no_sync_depth_ = 0;
  bool accumulating_ = false;  // a backward ran since the last update: the next one adds to its gradients
  nn::NamedTensors buffers_;
  std::vector<std::string> names_;  // per parameter, from sync_parameters
  std::unordered_set<const void*> param_impls_;  // the optimizer's parameters, as backward's leaves name them
};

DistOpt::DistOpt(std::shared_ptr<optim::Optimizer> opt, std::shared_ptr<Communicator> comm, DistOptOptions options)
    : opt_(std::move(opt)), comm_(std::move(comm)) {
  TANDEM_CHECK(opt_ != nullptr, "DistOpt needs an optimizer");
  TANDEM_CHECK(comm_ != nullptr, "DistOpt needs a communicator");
  TANDEM_CHECK(options.bucket_bytes >= 1024 && options.first_bucket_bytes >= 1024,
               "DistOpt bucket sizes must be at least 1 KiB");
  const auto& ps = opt_->params();
  for (size_t i = 0; i < ps.size(); ++i)
    TANDEM_CHECK(ps[i].dtype() == DType::f32, "DistOpt: parameter ", i, " is ", ps[i].str(),
                 "; f32 parameters are required");
  impl_ = std::make_unique<Impl>(ps, comm_, options);
}

DistOpt::~DistOpt() = default;

int DistOpt::rank_in_local() const { return comm_->local_rank(); }
int DistOpt::rank_in_global() const { return comm_->rank(); }
int DistOpt::world_size() const { return comm_->size(); }

void DistOpt::sync_parameters(nn::Module& model) {
  Impl& m = *impl_;
  const auto& ps = opt_->params();
  std::vector<std::string> names(ps.size());
  for (auto& [name, t] : model.named_parameters())
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i].is_same(t)) names[i] = name;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].empty()) names[i] = "parameter " + std::to_string(i);
  m.buffers_ = model.named_buffers();
  for (auto& [name, t] : m.buffers_)
    TANDEM_CHECK(t.device() == comm_->device(), "sync_parameters: buffer ", name, " is on ", t.device().str(),
                 " but the model's parameters are on ", comm_->device().str());
  m.names_ = names;
  check_same_model(*comm_, names, ps, m.buffers_);
  if (comm_->size() == 1) return;
  m.averager_.broadcast(0);
  for (auto& [name, t] : m.buffers_) {
    WorkPtr w = comm_->broadcast(t, 0);
    detail::timed_wait(w, m.stats_);
  }
}

// ---- a step

void DistOpt::backward_and_sync(const Tensor& loss) { backward_and_sync_with(impl_->options_.sync, loss); }

void DistOpt::backward_and_sync_with(const SyncOptions& sync, const Tensor& loss) {
  Impl& m = *impl_;
  m.use(sync);
  const bool accumulating = m.accumulating_;
  m.reducer_.begin(accumulating);
  if (m.no_sync_depth_ > 0) {
    m.backward_counted(loss);
    m.accumulating_ = true;
    return;
  }
  if (m.partial()) {
    m.backward_counted(loss);
  } else if (comm_->size() == 1) {
    m.backward_counted(loss);
    m.reducer_.finish_locally();
  } else {
    m.backward_counted(loss, [&m](const Tensor& leaf) { m.reducer_.on_ready(leaf); });
    m.reducer_.finish();
  }
  // Counted once backward succeeded: a failed one leaves no step for update() to apply.
  m.stats_.steps++;
  m.accumulating_ = true;
}

Tensor DistOpt::clip_grad_norm(double max_norm) {
  TANDEM_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  Impl& m = *impl_;
  // partialUpdate's gradients are each rank's own, and so is their norm.
  Tensor norm = m.reducer_.grad_norm(/*agree=*/!m.partial());
  // coef = min(1, max_norm / (norm + 1e-6)), computed on the device: no host wait.
  backend::Backend& be = backend::backend_for(comm_->device());
  Tensor coef = Tensor::empty({1}, DType::f32, comm_->device());
  be.affine(norm, 1.0 / max_norm, 1e-6 / max_norm, coef);
  be.binary(backend::Binary::Div, m.one_, coef, coef);
  be.binary(backend::Binary::Min, coef, m.one_, coef);
  m.reducer_.scale_grads(coef);
  return norm;
}

void DistOpt::scale_gradients(const Tensor& coef) {
  TANDEM_CHECK(coef.numel() == 1 && coef.dtype() == DType::f32 && coef.device() == comm_->device(),
               "scale_gradients: the factor must be one f32 value on ", comm_->device().str(), ", got ", coef.str());
  impl_->reducer_.scale_grads(coef.view({1}));
}

bool DistOpt::update() {
  Impl& m = *impl_;
  TANDEM_CHECK(m.accumulating_, "update() called without backward_and_sync since the last update: its gradients "
               "were applied already (call backward_and_sync(loss) before each update)");
  m.accumulating_ = false;
  if (m.reducer_.found_nonfinite()) {
    m.stats_.skipped_updates++;
    return false;
  }
  opt_->step();
  if (m.partial()) m.averager_.average_next_chunk();
  return true;
}

void DistOpt::step(const Tensor& loss) {
  backward_and_sync(loss);
  update();
}

DistOpt::NoSync::NoSync(DistOpt& opt) : opt_(opt) { opt_.impl_->no_sync_depth_++; }
DistOpt::NoSync::~NoSync() { opt_.impl_->no_sync_depth_--; }

// ---- the guide's calls: one step each, with their own settings

namespace {

SyncOptions with_method(SyncOptions s, const char* method) {
  s.method = method;
  return s;
}

}  // namespace

void DistOpt::backward_and_update(const Tensor& loss) {
  backward_and_sync_with(with_method(impl_->options_.sync, "plain"), loss);
  update();
}

void DistOpt::backward_and_update_half(const Tensor& loss, bool clipping, double clip_value) {
  TANDEM_CHECK(!clipping || clip_value > 0.0, "backward_and_update_half: clip value must be positive, got ",
               clip_value);
  SyncOptions s = with_method(impl_->options_.sync, "half");
  s.clip = clipping ? clip_value : 0.0;
  backward_and_sync_with(s, loss);
  update();
}

void DistOpt::backward_and_partial_update(const Tensor& loss) {
  backward_and_sync_with(with_method(impl_->options_.sync, kPartial), loss);
  update();
}

void DistOpt::backward_and_sparse_update(const Tensor& loss, double spars, bool topK, bool corr) {
  SyncOptions s = with_method(impl_->options_.sync, topK ? "sparseTopK" : "sparseThreshold");
  s.spars = spars;
  s.error_feedback = corr;
  backward_and_sync_with(s, loss);
  update();
}

// ---- agreement between ranks

void DistOpt::average_parameters() {
  if (comm_->size() == 1) return;
  impl_->averager_.average_all();
  average_buffers();
}

void DistOpt::average_buffers() {
  Impl& m = *impl_;
  if (comm_->size() == 1) return;
  for (auto& [name, t] : m.buffers_) {
    if (!is_floating(t.dtype())) continue;
    WorkPtr w = comm_->all_reduce(t, ReduceOp::Avg);
    detail::count_all_reduce(m.stats_, static_cast<int64_t>(t.nbytes()), comm_->size());
    detail::timed_wait(w, m.stats_);
  }
}

void DistOpt::check_consistency(bool include_buffers) {
  Impl& m = *impl_;
  const auto& ps = opt_->params();
  std::vector<std::string> names = m.names_;
  std::vector<Tensor> tensors(ps.begin(), ps.end());
  for (size_t i = names.size(); i < ps.size(); ++i) names.push_back("parameter " + std::to_string(i));
  if (include_buffers)
    for (auto& [name, t] : m.buffers_) {
      tensors.push_back(t);
      names.push_back(name);
    }
  check_identical_values(*comm_, tensors, names);
}

// ---- introspection

const CommStats& DistOpt::stats() const { return impl_->stats_; }
void DistOpt::reset_stats() { impl_->stats_ = CommStats{}; }
void DistOpt::set_trace(bool on) { impl_->reducer_.set_trace(on); }
const std::vector<std::string>& DistOpt::trace() const { return impl_->reducer_.trace(); }
const DistOptOptions& DistOpt::options() const { return impl_->options_; }
const SyncOptions& DistOpt::active_sync() const { return impl_->active_; }
bool DistOpt::step_capturable() const { return impl_->partial() || impl_->reducer_.codec().capturable(); }
std::string DistOpt::replay_blocker() const {
  const Impl& m = *impl_;
  if (!comm_->device().is_cuda()) return "steps on " + comm_->device().str() + " run their kernels as they come";
  if (comm_->size() > 1 && !comm_->records_collectives())
    return "steps of more than one rank over " + comm_->backend_name() + " are not recorded: its collectives run as issued";
  if (m.options_.skip_nonfinite) return "f16 loss scaling decides on the host whether a step is skipped";
  if (m.no_sync_depth_ > 0 || m.accumulating_) return "gradients are being accumulated over micro-batches";
  if (!step_capturable()) return m.active_.method + " sends a number of values known only on the host";
  return opt_->replay_blocker();
}

void DistOpt::abandon_step() { impl_->accumulating_ = false; }

void DistOpt::count_replayed_step(const CommStats& d) {
  CommStats& s = impl_->stats_;
  s.steps += d.steps;
  s.collectives += d.collectives;
  s.bytes_sent += d.bytes_sent;
  s.bytes_received += d.bytes_received;
  s.skipped_updates += d.skipped_updates;
  opt_->count_replayed_step();
}

std::vector<double> DistOpt::residual_norms() const { return impl_->reducer_.residual_norms(); }

std::vector<int64_t> DistOpt::bucket_sizes() const {
  std::vector<int64_t> out;
  for (const auto& b : impl_->reducer_.buckets()) out.push_back(b.numel);
  return out;
}

std::vector<BucketInfo> DistOpt::bucket_layout() const {
  std::vector<BucketInfo> out;
  for (const auto& b : impl_->reducer_.buckets()) {
    BucketInfo info{b.offset, b.numel, b.params, {}};
    for (int64_t start : b.starts) info.offsets.push_back(b.offset + start);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace tandem::dist
