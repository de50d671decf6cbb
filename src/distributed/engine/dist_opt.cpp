// DistOpt: the public face of the reducer. It picks the codec a step's settings ask for, runs
// backward with the reducer's hook, and applies the averages with the wrapped optimizer; the
// guide's calls are each one step with their own settings.
#include "tandem/distributed/dist_opt.h"

#include <algorithm>
#include <cctype>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "backend/backend.h"
#include "distributed/engine/dist_opt_impl.h"
#include "distributed/engine/sync_check.h"
#include "tandem/distributed/sharded_layer.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem::dist {

namespace {

std::string normalise(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '-' && c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

const char* offload_name(const DistOptOptions& o) {
  return o.offload_parameters ? "parameters" : o.offload_optimizer ? "optimizer" : "none";
}

const char* shard_name(Shard s) {
  switch (s) {
    case Shard::none: return "none";
    case Shard::optimizer: return "optimizer";
    case Shard::gradients: return "gradients";
    case Shard::parameters: return "parameters";
  }
  return "none";
}

Shard parse_shard(const std::string& s) {
  const std::string n = normalise(s);
  for (Shard k : {Shard::none, Shard::optimizer, Shard::gradients, Shard::parameters})
    if (n == shard_name(k) || n == std::to_string(static_cast<int>(k))) return k;
  TANDEM_CHECK(false, "unknown --shard '", s, "' (choose none, optimizer, gradients or parameters: ZeRO stages 0 to 3)");
}

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
  TANDEM_CHECK(!options.overlap_gather || options.shard == Shard::optimizer || options.shard == Shard::gradients,
               "overlap_gather overlaps the all-gathers of --shard optimizer and gradients with the next forward; with "
               "--shard ", shard_name(options.shard), options.shard == Shard::parameters ?
               " each group is gathered for its own forward already" : " nothing is gathered");
  TANDEM_CHECK(!(options.uneven_inputs && options.shard == Shard::parameters), "uneven inputs cannot be combined "
               "with --shard parameters: a rank without data would have to take part in every layer's gathers (use "
               "--shard gradients)");
  TANDEM_CHECK(options.master_weights == DType::f32 || options.master_weights == DType::bf16 ||
                   options.master_weights == DType::f16,
               "master weights: bf16 or f16 parameters (f32: none), not ", dtype_name(options.master_weights));
  // Offloaded parameters are stage 3's slices kept on the host, stepped there.
  if (options.offload_parameters) {
    TANDEM_CHECK(options.shard == Shard::none || options.shard == Shard::parameters, "--offload parameters keeps ",
                 "--shard parameters' slices in host memory: it takes --shard parameters (or none, which it makes ",
                 "parameters), not --shard ", shard_name(options.shard));
    TANDEM_CHECK(options.master_weights == DType::f32 && opt_->master_weights() == DType::f32, "--offload parameters ",
                 "keeps f32 parameters on the host (the values the host's step writes): it cannot be combined with ",
                 "master weights; use --offload optimizer for those");
    options.shard = Shard::parameters;
    options.offload_optimizer = true;
  }
  // Offload steps this rank's slices on the host: the state is cut as under --shard optimizer.
  if (options.offload_optimizer && options.shard == Shard::none) options.shard = Shard::optimizer;
  // An optimizer that keeps master weights already (Optimizer::keep_master_weights) keeps them under DistOpt.
  if (options.master_weights == DType::f32) options.master_weights = opt_->master_weights();
  TANDEM_CHECK(options.master_weights == DType::f32 || options.sync.method != kPartial,
               "master weights cannot be combined with partialUpdate: its averages of the parameters would leave "
               "the masters behind");
  // Rounds the parameters before they are shared or moved (and keeps masters made by earlier steps).
  if (opt_->master_weights() != options.master_weights) opt_->keep_master_weights(options.master_weights);
  impl_ = std::make_unique<Impl>(ps, comm_, options, *opt_);
  if (options.skip_nonfinite) {
    opt_->set_step_guard(impl_->reducer_.verdict());
    impl_->skipped_ = Tensor::zeros({1}, DType::i64, comm_->device());
  }
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
  // The model's parameters the optimizer does not hold are frozen (requires_grad off, a pretrained table
  // kept as it is): nothing steps them, so ranks that started from different values would keep them.
  // They are broadcast and compared as the buffers are.
  m.frozen_.clear();
  for (auto& [name, t] : model.named_parameters())
    if (std::none_of(ps.begin(), ps.end(), [&t = t](const Tensor& p) { return p.is_same(t); }))
      m.frozen_.emplace_back(name, t);
  m.buffers_ = model.named_buffers();
  for (const nn::NamedTensors* list : {&m.frozen_, &m.buffers_})
    for (auto& [name, t] : *list)
      TANDEM_CHECK(t.device() == comm_->device(), "sync_parameters: ", list == &m.frozen_ ? "frozen parameter " :
                   "buffer ", name, " is on ", t.device().str(), " but the model's parameters are on ",
                   comm_->device().str());
  m.names_ = names;
  check_same_model(*comm_, names, ps, m.frozen_, m.buffers_);
  if (m.options_.shard == Shard::parameters && !m.layers_found_) find_layer_groups(model);
  if (m.options_.overlap_gather) overlap_layer_groups(model);
  if (comm_->size() > 1) {
    if (m.sharded_)
      m.sharded_->broadcast(0);
    else
      m.averager_->broadcast(0);
  }
  if (m.sharded_) m.sharded_->shard_parameters();  // sharded parameters: from now on each rank keeps its blocks
  m.synced_ = true;
  take_loaded_replica();
  if (comm_->size() == 1) return;
  for (nn::NamedTensors* list : {&m.frozen_, &m.buffers_})
    for (auto& [name, t] : *list) {
      WorkPtr w = comm_->broadcast(t, 0);
      detail::timed_wait(w, m.stats_);
    }
}

// partialUpdate resumed: the replicas differed when they were saved, and differ again.
void DistOpt::take_loaded_replica() {
  Impl& m = *impl_;
  if (m.loaded_replica_.empty() || !m.synced_) return;
  NoGradGuard no_grad;
  const auto& ps = opt_->params();
  for (size_t i = 0; i < ps.size(); ++i) ps[i].detach().copy_(m.loaded_replica_[i]);
  m.loaded_replica_.clear();
}

namespace {
// The model's layer groups, in the order forward runs them, and each of `ps`'s groups among them (empty: in
// none; several: a parameter that several parts use, a tied token table). Groups come from the modules that
// declare them (nn::LayerGroups: tandem's models, ShardedLayer), in the order the model registers those; a
// module's groups inside another's that already cover its parameters are the outer module's business.
std::pair<std::vector<nn::LayerGroup*>, std::vector<std::vector<int>>> layer_groups(nn::Module& model,
                                                                                const std::vector<Tensor>& ps) {
  std::vector<nn::LayerGroup*> groups;
  std::vector<std::vector<int>> of(ps.size());
  std::unordered_set<const void*> covered;
  std::unordered_map<const void*, int> index;
  for (size_t i = 0; i < ps.size(); ++i) index.emplace(ps[i].impl(), static_cast<int>(i));
  model.apply([&](nn::Module& mod) {
    auto* provider = dynamic_cast<nn::LayerGroups*>(&mod);
    if (!provider) return;
    std::vector<nn::LayerGroup*> mine = provider->layer_groups();
    bool inside = !groups.empty();
    for (nn::LayerGroup* g : mine)
      for (const Tensor& t : g->params()) inside = inside && covered.count(t.impl()) > 0;
    if (inside) return;
    for (nn::LayerGroup* g : mine) {
      const int k = static_cast<int>(groups.size());
      groups.push_back(g);
      for (const Tensor& t : g->params()) {
        covered.insert(t.impl());
        auto it = index.find(t.impl());
        if (it == index.end()) continue;  // not trained (frozen): kept whole
        std::vector<int>& list = of[static_cast<size_t>(it->second)];
        if (list.empty() || list.back() != k) list.push_back(k);
      }
    }
  });
  return {std::move(groups), std::move(of)};
}
}  // namespace

// Sharded parameters: the model's layer groups. The buckets are laid out again along them (before any step),
// and the parameters' side of the sharding made anew on that layout.
void DistOpt::find_layer_groups(nn::Module& model) {
  Impl& m = *impl_;
  const auto& ps = opt_->params();
  auto [groups, of] = layer_groups(model, ps);
  TANDEM_CHECK(!groups.empty(), "--shard parameters: the model declares no layer groups (nn::LayerGroups, as "
               "tandem's models do); wrap each layer (or block of layers) whose parameters are to be sharded in "
               "dist::ShardedLayer");
  for (size_t i = 0; i < ps.size(); ++i)
    TANDEM_CHECK(!of[i].empty(), "--shard parameters: parameter ", m.names_[i], " is in no layer group; every "
                 "parameter the optimizer holds must be (wrap the layer it belongs to in dist::ShardedLayer, or "
                 "freeze it)");
  // Buckets hold the parameters of one group each, in the order backward finishes them: the groups from the
  // last to the first. A parameter of several groups has buckets of its own, after those of the first group
  // using it (whose backward completes its gradient): each group gathers it, and it is freed when none holds it.
  std::vector<int> keys(ps.size());
  for (size_t i = 0; i < ps.size(); ++i)
    keys[i] = of[i].size() == 1 ? 2 * of[i][0] : 2 * *std::min_element(of[i].begin(), of[i].end()) - 1;
  m.reducer_.set_groups(keys);
  m.cut(comm_, ps, *opt_, /*shard_parameters=*/true);
  m.sharded_->set_layer_groups(of);
  for (size_t g = 0; g < groups.size(); ++g) groups[g]->attach(m.sharded_, static_cast<int>(g));
  m.layers_found_ = true;
}

// Stages 1 and 2 with overlap_gather: the groups' gathers are waited for by their layers (a parameter of
// several groups, by the first).
void DistOpt::overlap_layer_groups(nn::Module& model) {
  Impl& m = *impl_;
  auto [groups, of] = layer_groups(model, opt_->params());
  std::vector<int> first(of.size(), -1);
  for (size_t i = 0; i < of.size(); ++i)
    if (!of[i].empty()) first[i] = *std::min_element(of[i].begin(), of[i].end());
  m.sharded_->wait_all();
  m.sharded_->overlap_groups(first);
  for (size_t g = 0; g < groups.size(); ++g) groups[g]->attach(m.sharded_, static_cast<int>(g));
  m.layers_attached_ = true;
}

void DistOpt::set_param_groups(const std::vector<optim::ParamGroup>& groups) {
  // The grouping in force, to go back to where the slices cannot be cut again.
  std::vector<optim::ParamGroup> before(opt_->groups().size());
  for (size_t g = 0; g < before.size(); ++g) {
    before[g].lr_scale = opt_->groups()[g].lr_scale;
    before[g].weight_decay = opt_->groups()[g].weight_decay;
  }
  for (size_t i = 0; i < opt_->params().size(); ++i)
    before[static_cast<size_t>(opt_->group_of()[i])].params.push_back(opt_->params()[i]);
  opt_->set_param_groups(groups);
  try {
    recut_slices();
  } catch (...) {
    opt_->set_param_groups(before);
    throw;
  }
}

// The slices' optimizer has as many groups as the wrapped one had when they were cut, and each slice the
// group of its parameter then: a new grouping needs new slices. Their state goes back into the wrapped
// optimizer whole first (regrouping kept each parameter's), and the next step moves it into the new slices.
void DistOpt::recut_slices() {
  Impl& m = *impl_;
  if (!m.sharded_ || opt_->group_of() == m.cut_for_) return;
  const char* when = m.layers_found_      ? "sync_parameters sharded the parameters (--shard parameters)"
                     : m.layers_attached_ ? "sync_parameters gave the model's layers the step's gathers (overlap_gather)"
                     : m.copies_kept_     ? "keep_parameter_copies handed out the 16-bit copies the sharded step writes"
                                          : nullptr;
  TANDEM_CHECK(when == nullptr, "the optimizer's parameter groups changed after ", when, ", which holds on to the "
               "slices of the parameters cut along the old groups: set the groups (set_param_groups) before ",
               m.copies_kept_ && !m.layers_found_ && !m.layers_attached_ ? "keep_parameter_copies" : "sync_parameters");
  gather_optimizer_state();
  m.cut(comm_, opt_->params(), *opt_);
}

void DistOpt::wait_parameters() {
  if (impl_->sharded_) impl_->sharded_->wait_all();
}

// ---- a step

void DistOpt::backward_and_sync(const Tensor& loss) { backward_and_sync_with(impl_->options_.sync, loss); }

void DistOpt::backward_and_sync_with(const SyncOptions& sync, const Tensor& loss) {
  Impl& m = *impl_;
  TANDEM_CHECK(m.options_.shard != Shard::parameters || m.layers_found_, "--shard parameters: call "
               "sync_parameters(model) before the first step; it finds the model's ShardedLayers, whose parameters "
               "it shards");
  TANDEM_CHECK(sync.method != kPartial || m.options_.master_weights == DType::f32,
               "partialUpdate averages the parameters, which would leave the master weights (master_weights ",
               dtype_name(m.options_.master_weights), ") behind: choose another method, or no master weights");
  TANDEM_CHECK(sync.method != kPartial || opt_->parameter_copies().empty(),
               "partialUpdate averages the parameters behind the 16-bit copies that keep_parameter_copies keeps (they "
               "would go stale): choose partialUpdate before asking for copies, which it then does not keep");
  m.use(sync);
  const bool accumulating = m.accumulating_;
  // Sharded gradients keep no whole gradient to accumulate into: every micro-batch is reduced.
  const bool local = m.no_sync_depth_ > 0 && m.reducer_.whole_arena();
  if (!local && m.options_.uneven_inputs && comm_->size() > 1) {
    // This rank has data: counted among the active ranks, whose average the others' zeros must not dilute.
    const std::pair<int64_t, int64_t> active = m.count_active(true, m.no_sync_depth_ == 0);
    m.reducer_.set_contribution_scale(static_cast<double>(comm_->size()) / static_cast<double>(active.first));
  }
  m.reducer_.begin(accumulating);
  if (local) {
    m.backward_counted(loss);
    m.accumulating_ = true;
    return;
  }
  if (m.partial()) {
    m.backward_counted(loss);
    m.reducer_.finish_unsynced();
  } else if (comm_->size() == 1 && !m.sharded_) {
    m.backward_counted(loss);
    m.reducer_.finish_locally();
  } else {
    m.backward_counted(loss, [&m](const Tensor& leaf) { m.reducer_.on_ready(leaf); });
    m.reducer_.finish();
    if (m.sharded_) m.sharded_->release_all();  // groups whose backward freed nothing (an input needing no gradient)
  }
  // Counted once backward succeeded: a failed one leaves no step for update() to apply.
  m.stats_.steps++;
  m.accumulating_ = true;
}

Tensor DistOpt::clip_grad_norm(double max_norm) {
  Tensor coef;
  Tensor norm = clip_coefficient(max_norm, coef);
  impl_->reducer_.scale_grads(coef);
  return norm;
}

Tensor DistOpt::clip_grad_norm_in_update(double max_norm) {
  Impl& m = *impl_;
  Tensor coef;
  Tensor norm = clip_coefficient(max_norm, coef);
  // The optimizer that steps reads the averaged gradients (the wrapped one, or the slices' under --shard);
  // partialUpdate's own chunk is not what the norm was taken over.
  const optim::Optimizer& stepping = m.sharded_ ? m.sharded_->stepper() : *opt_;
  if (!m.partial() && stepping.takes_gradient_factor())
    m.pending_factor_ = coef;
  else
    m.reducer_.scale_grads(coef);
  return norm;
}

std::vector<Tensor> DistOpt::keep_parameter_copies(DType dtype) {
  TANDEM_CHECK(dtype == DType::bf16 || dtype == DType::f16, "keep_parameter_copies: bf16 or f16, not ",
               dtype_name(dtype));
  Impl& m = *impl_;
  if (m.partial()) return {};
  if (m.sharded_) {
    recut_slices();  // the copies are the slices' step's: cut along the groups in force first
    std::vector<Tensor> copies = m.sharded_->keep_copies(dtype);
    m.copies_kept_ = !copies.empty();
    return copies;
  }
  if (!opt_->keeps_parameter_copies()) return {};
  std::vector<Tensor> copies;
  for (const Tensor& p : opt_->params()) copies.push_back(p.detach().contiguous().to(dtype));
  opt_->set_parameter_copies(copies);
  return copies;
}

Tensor DistOpt::clip_coefficient(double max_norm, Tensor& coef) {
  TANDEM_CHECK(max_norm > 0.0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  Impl& m = *impl_;
  // partialUpdate's gradients are each rank's own, and so is their norm.
  Tensor norm = m.reducer_.grad_norm(/*agree=*/!m.partial());
  // coef = min(1, max_norm / (norm + 1e-6)), computed on the device: no host wait.
  backend::Backend& be = backend::backend_for(comm_->device());
  coef = Tensor::empty({1}, DType::f32, comm_->device());
  be.affine(norm, 1.0 / max_norm, 1e-6 / max_norm, coef);
  be.binary(backend::Binary::Div, m.one_, coef, coef);
  be.binary(backend::Binary::Min, coef, m.one_, coef);
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
  // With skip_nonfinite the optimizer reads the verdict where it lies (its guard); the skip count grows
  // on the device as well. partialUpdate's chunk still travels on a skipped step (the ranks agree on
  // the verdict, but a collective is issued regardless of it) and is then not written back.
  if (m.skipped_.defined()) backend::backend_for(comm_->device()).count_nonfinite(m.reducer_.verdict(), m.skipped_);
  // The clipping coefficient, if clip_grad_norm_in_update left one: applied by the stepping optimizer as it
  // reads the gradients (no pass over them).
  const Tensor factor = std::exchange(m.pending_factor_, Tensor());
  // Parameters no rank used in this step are left alone, as an optimizer leaves a parameter without a gradient.
  const std::vector<int>& unused = m.reducer_.unused();
  if (m.sharded_) {
    recut_slices();  // the wrapped optimizer regrouped behind DistOpt's back (a checkpoint loaded into it)
    m.sharded_->step(*opt_, factor, unused);
  } else {
    const std::vector<Tensor>& ps = opt_->params();
    std::vector<std::pair<size_t, Tensor>> hidden;
    for (int i : unused) {
      Tensor p = ps[static_cast<size_t>(i)];  // a handle: its gradient is the parameter's
      hidden.emplace_back(static_cast<size_t>(i), p.grad());
      p.set_grad(Tensor());
    }
    struct Restore {
      const std::vector<Tensor>& ps;
      std::vector<std::pair<size_t, Tensor>>& hidden;
      ~Restore() {
        for (auto& [i, g] : hidden) Tensor(ps[i]).set_grad(g);
      }
    } restore{ps, hidden};
    opt_->step_with_gradient_factor(factor);
  }
  if (m.partial()) m.averager_->average_next_chunk(m.skipped_.defined() ? m.reducer_.verdict() : Tensor());
  m.reducer_.release();  // release_gradients: the step has read them
  if (!m.skipped_.defined() || backend::backend_for(comm_->device()).recording(comm_->device().index)) return true;
  return !m.reducer_.found_nonfinite();
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

bool DistOpt::join_step(double clip_norm) {
  Impl& m = *impl_;
  TANDEM_CHECK(m.options_.uneven_inputs, "join(): DistOpt was built without DistOptOptions::uneven_inputs, so the "
               "other ranks do not count who still has data (set uneven_inputs on every rank)");
  TANDEM_CHECK(!m.partial(), "join(): partialUpdate steps replicas on their own data; uneven inputs need a method "
               "that averages gradients");
  TANDEM_CHECK(clip_norm >= 0.0, "join(): clip_norm must not be negative, got ", clip_norm);
  TANDEM_CHECK(!m.accumulating_ || !m.reducer_.whole_arena(), "join() called with gradients accumulated since the "
               "last update: finish the step (update()) before this rank joins");
  if (comm_->size() == 1) return false;
  for (;;) {
    const auto [active, updating] = m.count_active(false, false);
    if (active == 0) return false;  // every rank has joined
    // The others' synchronisation, with zeros from this rank: the same collectives in the same order.
    m.reducer_.begin(m.accumulating_);
    m.reducer_.zero_contribution();
    m.reducer_.finish();
    if (m.sharded_) m.sharded_->release_all();
    m.stats_.steps++;
    m.accumulating_ = true;
    if (updating == 0) continue;  // a micro-batch reduced on its own (sharded gradients): more follow
    if (clip_norm > 0.0) clip_grad_norm(clip_norm);
    return true;
  }
}

int64_t DistOpt::join(double clip_norm) {
  int64_t steps = 0;
  while (join_step(clip_norm)) {
    update();
    ++steps;
  }
  return steps;
}

// ---- agreement between ranks

void DistOpt::average_parameters() {
  TANDEM_CHECK(impl_->options_.master_weights == DType::f32, "average_parameters: under master weights the parameters "
               "are the rounding of the optimizer's f32 masters, which an average of the parameters would leave behind "
               "(every rank steps the same masters: nothing drifts to average)");
  if (comm_->size() == 1) return;
  if (impl_->sharded_) {
    impl_->sharded_->average();  // and its copies
  } else {
    impl_->averager_->average_all();
    // The 16-bit copies the optimizer keeps follow the averages.
    const std::vector<Tensor>& copies = opt_->parameter_copies();
    NoGradGuard no_grad;
    for (size_t i = 0; i < copies.size(); ++i) {
      Tensor copy = copies[i];
      if (copy.defined()) copy.copy_(opt_->params()[i].detach());
    }
  }
  average_buffers();
}

DistOpt::AveragedReplicas::AveragedReplicas(DistOpt& opt) : opt_(opt) {
  if (!opt_.impl_->partial() || opt_.world_size() == 1) return;
  NoGradGuard no_grad;
  for (const Tensor& p : opt_.opt_->params()) replica_.push_back(p.detach().clone());
  opt_.impl_->averager_->average_all();
}

DistOpt::AveragedReplicas::~AveragedReplicas() {
  NoGradGuard no_grad;
  const auto& ps = opt_.opt_->params();
  for (size_t i = 0; i < replica_.size(); ++i) ps[i].detach().copy_(replica_[i]);
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
  wait_parameters();
  Impl& m = *impl_;
  const auto& ps = opt_->params();
  std::vector<std::string> names = m.names_;
  std::vector<Tensor> tensors(ps.begin(), ps.end());
  for (size_t i = names.size(); i < ps.size(); ++i) names.push_back("parameter " + std::to_string(i));
  for (auto& [name, t] : m.frozen_) {  // frozen parameters: never stepped, and never allowed to differ
    tensors.push_back(t);
    names.push_back(name + " (frozen)");
  }
  if (include_buffers)
    for (auto& [name, t] : m.buffers_) {
      tensors.push_back(t);
      names.push_back(name);
    }
  if (m.sharded_) m.sharded_->gather_all();  // sharded parameters: compared whole
  check_identical_values(*comm_, tensors, names);
  if (m.sharded_) m.sharded_->release_all();
}

// ---- introspection

const CommStats& DistOpt::stats() const {
  Impl& m = *impl_;
  if (m.skipped_.defined() && !backend::backend_for(comm_->device()).recording(comm_->device().index))
    m.stats_.skipped_updates = m.skipped_.item<int64_t>();
  return m.stats_;
}

void DistOpt::reset_stats() {
  impl_->stats_ = CommStats{};
  if (impl_->skipped_.defined()) impl_->skipped_.zero_();
}
void DistOpt::set_trace(bool on) { impl_->reducer_.set_trace(on); }
const std::vector<std::string>& DistOpt::trace() const { return impl_->reducer_.trace(); }
const DistOptOptions& DistOpt::options() const { return impl_->options_; }

MemoryReport DistOpt::memory_report() const {
  const Impl& m = *impl_;
  MemoryReport r;
  r.gradients = m.reducer_.gradient_bytes();
  int64_t stepped = 0;  // elements whose optimizer state this rank keeps
  if (m.sharded_) {
    r.parameters = m.sharded_->parameter_bytes();
    stepped = m.sharded_->stepped_elements();
  } else {
    for (const Tensor& p : opt_->params()) {
      r.parameters += static_cast<int64_t>(p.nbytes());
      stepped += p.numel();
    }
  }
  r.optimizer_state = static_cast<int64_t>(opt_->state_copies()) * stepped * static_cast<int64_t>(sizeof(float));
  if (m.options_.master_weights != DType::f32) r.master_weights = stepped * static_cast<int64_t>(sizeof(float));
  if (m.sharded_ && m.sharded_->offloads()) {
    r.host = m.sharded_->host_bytes();
    r.optimizer_state = r.master_weights = 0;
  }
  return r;
}

optim::Optimizer& DistOpt::stepping_optimizer() { return impl_->sharded_ ? impl_->sharded_->stepper() : *opt_; }
const SyncOptions& DistOpt::active_sync() const { return impl_->active_; }
bool DistOpt::step_capturable() const { return impl_->partial() || impl_->reducer_.codec().capturable(); }
std::string DistOpt::replay_blocker() const {
  const Impl& m = *impl_;
  if (!comm_->device().is_cuda()) return "steps on " + comm_->device().str() + " run their kernels as they come";
  if (comm_->size() > 1 && !comm_->records_collectives())
    return "steps of more than one rank over " + comm_->backend_name() + " are not recorded: its collectives run as issued";
  if (m.no_sync_depth_ > 0 || m.accumulating_) return "gradients are being accumulated over micro-batches";
  if (m.options_.offload_optimizer)
    return "steps with the optimizer offloaded are not recorded (its step runs on the host between the device's work)";
  if (m.options_.shard == Shard::parameters)
    return "steps with --shard parameters are not recorded (their layers' gathers fill and free buffers as they run)";
  if (m.options_.overlap_gather)
    return "steps with overlapped gathers are not recorded (each layer group waits for the last step's gather)";
  if (!step_capturable()) return m.active_.method + " sends a number of values known only on the host";
  if (m.sharded_ && opt_->group_of() != m.cut_for_)
    return "the optimizer's parameter groups changed: the next update cuts the slices again";
  // State loaded into the wrapped optimizer is taken into the slices by host code of the next step: a
  // recording of it would copy the loaded state again at every replay.
  if (m.sharded_ && m.sharded_->state_to_adopt(*opt_))
    return "the optimizer state loaded into the wrapped optimizer is taken into this rank's slices by an eager step";
  // Under --shard the slices' optimizer steps: its state and counts decide (the wrapped one holds none).
  const optim::Optimizer& stepping = m.sharded_ ? m.sharded_->stepper() : *opt_;
  if (std::string why = stepping.master_weights_blocker(); !why.empty()) return why;
  return stepping.replay_blocker();
}

void DistOpt::after_recording() {
  Impl& m = *impl_;
  if (m.sharded_)
    m.sharded_->stepper().after_recording();
  else
    opt_->after_recording();
}

void DistOpt::prepare_replay() {
  Impl& m = *impl_;
  if (m.sharded_) {
    TANDEM_CHECK(opt_->group_of() == m.cut_for_, "the optimizer's parameter groups changed after the step was "
                 "recorded: record the step again");
    m.sharded_->prepare_replay(*opt_);
  } else {
    opt_->prepare_replay();
  }
}

void DistOpt::abandon_step() {
  impl_->accumulating_ = false;
  impl_->pending_factor_ = Tensor();
}

void DistOpt::count_replayed_step(const CommStats& d) {
  CommStats& s = impl_->stats_;
  s.steps += d.steps;
  s.collectives += d.collectives;
  s.bytes_sent += d.bytes_sent;
  s.bytes_received += d.bytes_received;
  if (!impl_->skipped_.defined()) s.skipped_updates += d.skipped_updates;  // else counted on the device
  opt_->count_replayed_step();
  if (impl_->sharded_) impl_->sharded_->stepper().count_replayed_step();  // the slices' step counts
}

const Tensor& DistOpt::step_verdict() const { return impl_->reducer_.verdict(); }

void DistOpt::set_gradient_scale(const Tensor& factor) {
  TANDEM_CHECK(!factor.defined() || (factor.numel() == 1 && factor.dtype() == DType::f32 &&
                                     factor.device() == comm_->device()),
               "set_gradient_scale: the factor must be one f32 value on ", comm_->device().str(), ", got ",
               factor.str());
  impl_->reducer_.set_gradient_scale(factor.defined() ? factor.view({1}) : Tensor());
}

int64_t DistOpt::partial_chunk() const { return impl_->averager_ ? impl_->averager_->next_chunk() : 0; }

std::vector<double> DistOpt::residual_norms() const { return impl_->reducer_.residual_norms(); }

std::vector<int64_t> DistOpt::bucket_sizes() const {
  std::vector<int64_t> out;
  for (const auto& b : impl_->reducer_.buckets()) out.push_back(b.numel);
  return out;
}

std::vector<BucketInfo> DistOpt::bucket_layout() const {
  std::vector<BucketInfo> out;
  for (const auto& b : impl_->reducer_.buckets()) {
    BucketInfo info{b.offset, b.numel, b.span, b.params, {}};
    for (int64_t start : b.starts) info.offsets.push_back(b.offset + start);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace tandem::dist
