// The session shared by `tandem train` and `tandem bench train`.
#include "cli/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "cli/commands.h"
#include "ops/padded_rows.h"
#include "ops/param_copies.h"
#include "tandem/distributed/loss_scaler.h"
#include "tandem/distributed/sync_batch_norm.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem::cli {

namespace {

dist::DistOptOptions dist_options(const SessionConfig& cfg) {
  dist::DistOptOptions o;
  o.bucket_bytes = static_cast<size_t>(cfg.bucket_mb * 1048576.0);
  o.first_bucket_bytes = static_cast<size_t>(cfg.first_bucket_mb * 1048576.0);
  o.sync.method = dist::parse_sync_method(cfg.dist_option);
  o.sync.half_dtype = parse_dtype(cfg.half_dtype);
  o.sync.clip = cfg.clip;
  o.sync.spars = cfg.spars;
  o.sync.error_feedback = cfg.error_feedback;
  if (cfg.low_rank > 0) o.sync.rank = cfg.low_rank;
  o.shard = dist::parse_shard(cfg.shard);
  if (cfg.master_weights != "none") o.master_weights = parse_dtype(cfg.master_weights);
  o.release_gradients = true;  // nothing reads a gradient after its step: the peak holds none beside activations
  o.offload_optimizer = cfg.offload == "optimizer" || cfg.offload == "parameters";
  o.offload_parameters = cfg.offload == "parameters";
  return o;
}

}  // namespace

std::shared_ptr<optim::Optimizer> make_optimizer(const SessionConfig& cfg, const nn::Module& model) {
  if (cfg.optimizer == "adam" || cfg.optimizer == "adamw") {
    optim::AdamOptions o;
    o.lr = cfg.lr;
    o.beta1 = cfg.beta1;
    o.beta2 = cfg.beta2;
    o.weight_decay = cfg.weight_decay;
    if (cfg.optimizer == "adam") return std::make_shared<optim::Adam>(model.parameters(), o);
    o.decoupled = true;
    std::vector<optim::ParamGroup> groups(2);
    groups[0].weight_decay = cfg.weight_decay;
    groups[1].weight_decay = 0.0;
    for (const Tensor& p : model.parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
    return std::make_shared<optim::Adam>(std::move(groups), o);
  }
  TANDEM_CHECK(cfg.optimizer == "sgd", "unknown optimizer '", cfg.optimizer, "' (use sgd, adam or adamw)");
  optim::SgdOptions o;
  o.lr = cfg.lr;
  o.momentum = cfg.momentum;
  o.weight_decay = cfg.weight_decay;
  o.nesterov = cfg.nesterov;
  return std::make_shared<optim::SGD>(model.parameters(), o);
}

Session::Session(const SessionConfig& cfg) : cfg_(cfg) {
  // Settings are checked before joining the job: a bad flag fails at once on every rank.
  const std::string method = dist::parse_sync_method(cfg.dist_option);
  if (method == "sparseTopK")
    TANDEM_CHECK(cfg.spars > 0.0 && cfg.spars <= 1.0, "--spars for sparseTopK is the fraction of gradients sent, in ",
                 "(0, 1]; got ", cfg.spars);
  TANDEM_CHECK(cfg.clip == 0.0 || method == "half", "--clip bounds the values -d half sends; with -d ", method,
               " it would do nothing (--clip-norm bounds the gradients' norm in every mode)");
  TANDEM_CHECK(cfg.low_rank == 0 || method == "powerSGD", "--rank sets the approximation of -d powerSGD; with -d ",
               method, " it would do nothing");
  env_ = dist::detect_env();
  // Ranks sharing a machine share its cores.
  set_num_threads(cfg.threads > 0 ? cfg.threads : default_threads_per_rank(env_.local_size));
  device_ = device_for_rank(cfg.device, env_);
  if (cfg.deterministic) set_deterministic_algorithms(true);
  precision_ = cfg.precision.empty() ? default_precision(device_) : parse_precision(cfg.precision);
  TANDEM_CHECK(device_.is_cuda() || activation_dtype(precision_) == DType::f32, "--precision ",
               precision_name(precision_), " needs a CUDA device: the CPU computes in f32 (use --precision f32)");
  comm_ = dist::init_communicator(device_, std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000)));
  sums_.loss = Tensor::zeros({1}, DType::f32, device_);
  sums_.correct = Tensor::zeros({1}, DType::i64, device_);
  eval_sums_.loss = Tensor::zeros({1}, DType::f32, device_);
  eval_sums_.correct = Tensor::zeros({1}, DType::i64, device_);
}

// A recording that reads one batch (the training step, the evaluation pass).
struct Session::RecordedBatch {
  std::unique_ptr<DeviceGraph> graph;
  Tensor x, y;  // the batch every replay reads
  bool fits(const Tensor& bx, const Tensor& by, Device d) const {
    return bx.shape() == x.shape() && by.shape() == y.shape() && bx.dtype() == x.dtype() && by.dtype() == y.dtype() &&
           bx.device() == d && by.device() == d;
  }
  /// Replays on the batch (bx, by), copied into the recorded one unless it is that batch.
  void replay(const Tensor& bx, const Tensor& by) {
    if (bx.data_ptr() != x.data_ptr()) x.copy_(bx);
    if (by.data_ptr() != y.data_ptr()) y.copy_(by);
    graph->replay();
  }
};

// The recorded step: what its replays read and write.
struct Session::Recorded : RecordedBatch {
  StepResult out;  // rewritten by every replay
  bool track = false, training = true;
  bool fills = false;  // the batch's gather is part of the recording
  double lr = 0;
  dist::CommStats delta;  // what one step adds to the communication counters
};

Session::~Session() = default;

void Session::build_model(nn::ModelConfig mc) {
  mc.hidden = cfg_.hidden;
  mc.seed = cfg_.seed;
  model_ = nn::make_model(cfg_.model, mc);
  model_->to(device_);
  if (cfg_.sync_bn)
    TANDEM_CHECK(dist::convert_sync_batch_norm(*model_, comm_) > 0, "--sync-bn: model ", cfg_.model,
                 " has no batch normalisation (the resnet models have)");
  dist::DistOptOptions o = dist_options(cfg_);
  // f16 trains with dynamic loss scaling: overflowing steps are found on every rank and skipped.
  o.skip_nonfinite = precision_ == Precision::f16;
  opt_ = std::make_unique<dist::DistOpt>(make_optimizer(cfg_, *model_), comm_, o);
  if (o.skip_nonfinite) scaler_ = std::make_unique<dist::LossScaler>(*opt_);
  if (o.offload_optimizer && device_.is_cpu() && lead())
    std::fprintf(stderr, "tandem: --offload %s on the CPU: the host is the device, so nothing leaves it (the offloaded "
                         "copies come beside the rest); it pays on GPUs\n",
                 dist::offload_name(o));
  // 16-bit products on a GPU read 16-bit copies of the weights that are written as the weights change (by
  // SGD and AdamW as they step, or once per sharded step after the gather on more than one rank), instead of
  // converting every weight at every step; DistOpt says where it cannot keep them (partialUpdate, sharded
  // parameters, an unsharded optimizer that writes none). TANDEM_PARAM_COPIES=0 converts at every step instead (the same values).
  const char* env = std::getenv("TANDEM_PARAM_COPIES");
  copies_wanted_ = device_.is_cuda() && activation_dtype(precision_) != DType::f32 &&
                   !(env && std::strcmp(env, "0") == 0);
}

void Session::sync_model() { opt_->sync_parameters(*model_); }

std::vector<dist::AgreementField> Session::agreement_fields() const {
  // The parameters' names and shapes, hashed: ranks that built different models stop here, by name.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](const std::string& t) {
    for (unsigned char c : t) h = (h ^ c) * 0x100000001b3ull;
  };
  for (const auto& [name, t] : model_->named_parameters()) mix(name + shape_str(t.shape()) + dtype_name(t.dtype()));
  const dist::SyncOptions& s = sync();
  auto num = [](double v) { return detail::cat(v); };
  auto on_off = [](bool b) { return std::string(b ? "on" : "off"); };
  // Replicas whose optimizers differ drift apart: an error unless the user asked for it.
  const bool hp_match = !cfg_.per_rank_optimizer_settings;
  return {
      {"--model", cfg_.model},
      {"parameter names and shapes", std::to_string(h)},
      {"--optimizer", cfg_.optimizer},
      {"--nesterov", on_off(cfg_.nesterov)},
      {"-d/--dist-option", s.method},
      {"-s/--spars", num(s.spars)},
      {"--clip", num(s.clip)},
      {"--rank", std::to_string(s.rank)},
      {"--half-dtype", dtype_name(s.half_dtype)},
      {"--shard", dist::shard_name(opt_->options().shard)},
      {"--master-weights", dtype_name(opt_->options().master_weights)},
      {"--offload", dist::offload_name(opt_->options())},
      {"--no-error-feedback", on_off(!s.error_feedback)},
      {"--sync-bn", on_off(cfg_.sync_bn)},
      {"--bucket-mb", num(cfg_.bucket_mb)},
      {"--first-bucket-mb", num(cfg_.first_bucket_mb)},
      {"--precision", precision_name(precision_)},
      {"--per-rank-optimizer-settings", on_off(cfg_.per_rank_optimizer_settings)},
      {"--lr", num(cfg_.lr), hp_match},
      {"--momentum", num(cfg_.momentum), hp_match},
      {"--weight-decay", num(cfg_.weight_decay), hp_match},
      {"--beta1", num(cfg_.beta1), hp_match},
      {"--beta2", num(cfg_.beta2), hp_match},
      {"--seed", std::to_string(cfg_.seed), false},
  };
}

StepResult Session::forward_backward(const Tensor& x, const Tensor& y, double weight, bool last) {
  if (copies_wanted_) {
    // Made at the first step, after any checkpoint is loaded and the ranks synchronised: from here on only
    // the steps write the parameters, and their copies are written with them.
    copies_wanted_ = false;
    const DType dt = activation_dtype(precision_);
    std::vector<Tensor> copies = opt_->keep_parameter_copies(dt);
    if (!copies.empty()) copies_ = std::make_unique<ParamCopies>(opt_->optimizer().params(), std::move(copies), dt);
  }
  ParamCopiesScope copies_scope(copies_.get());
  Tensor logits, loss;
  {
    PrecisionScope scope(precision_);
    if (auto* lm = dynamic_cast<nn::CausalLm*>(model_.get())) {
      // The mean over every position's next token, the head taken with the loss (its logits not kept).
      loss = lm->loss(x, y);
    } else {
      logits = model_->forward(x);
      // A language model's logits [B, T, V]: the mean over every position's next token.
      loss = logits.dim() == 2 ? softmax_cross_entropy(logits, y) : softmax_cross_entropy(logits, y, Reduction::Mean);
    }
    if (weight != 1.0) loss = scale(loss, weight);
  }
  const Tensor to_backward = scaler_ ? scaler_->scale_loss(loss) : loss;
  if (last) {
    opt_->backward_and_sync(to_backward);
  } else {
    auto local_only = opt_->no_sync();
    opt_->backward_and_sync(to_backward);
  }
  return {logits.defined() ? logits.detach() : Tensor(), loss.detach(), Tensor()};
}

Tensor Session::apply_update() {
  Tensor norm;
  // The clipping coefficient is applied by the optimizer as it reads the gradients, where it can.
  if (cfg_.clip_norm > 0.0) norm = opt_->clip_grad_norm_in_update(cfg_.clip_norm);
  if (scaler_)
    scaler_->update();
  else
    opt_->update();
  return norm;
}

namespace {

// Steps of one batch shape run eagerly before the next is recorded: the first creates the optimizer's
// state, the first two settle the convolution algorithms and the memory the step needs.
constexpr int64_t kEagerStepsBeforeRecording = 3;

}  // namespace

StepResult Session::train_step(const Tensor& x, const Tensor& y, bool track, const std::function<void()>& fill) {
  sums_.samples += x.size(0);
  auto eager = [&] {
    if (fill) fill();
    return eager_step(x, y, track);
  };
  if (recorded_) {
    if (fits_recording(x, y, track, static_cast<bool>(fill))) return replay_step(x, y);
    // Another batch shape (an epoch's last, smaller batch) runs eagerly and the recording stays;
    // a new learning rate or mode is recorded again after the warm-up.
    if (x.shape() != recorded_->x.shape() || y.shape() != recorded_->y.shape()) return eager();
    recorded_.reset();
    steady_steps_ = 0;
  }
  if (!cfg_.cuda_graph || graph_given_up_ || !device_.is_cuda()) return eager();
  steady_steps_ = x.shape() == steady_shape_ ? steady_steps_ + 1 : 1;
  steady_shape_ = x.shape();
  if (steady_steps_ <= kEagerStepsBeforeRecording) return eager();
  std::string why = opt_->replay_blocker();
  if (why.empty() && cfg_.clip_norm > 0.0 && world() > 1) why = "--clip-norm agrees on the norm across ranks";
  if (!why.empty()) {
    run_eagerly_because(why);
    return eager();
  }
  return record_step(x, y, track, fill);
}

StepResult Session::eager_step(const Tensor& x, const Tensor& y, bool track) {
  StepResult r = forward_backward(x, y, 1.0, true);
  r.grad_norm = apply_update();
  if (track) add_loss_and_correct(r.loss, r.logits, y, sums_.loss, sums_.correct);
  return r;
}

StepResult Session::record_step(const Tensor& x, const Tensor& y, bool track, const std::function<void()>& fill) {
  auto rec = std::make_unique<Recorded>();
  rec->x = x;
  rec->y = y;
  rec->track = track;
  rec->fills = static_cast<bool>(fill);
  rec->training = model_->is_training();
  rec->lr = opt_->optimizer().lr();
  const dist::CommStats before = opt_->stats();
  try {
    rec->graph = std::make_unique<DeviceGraph>(device_, [&] {
      if (fill) fill();
      rec->out = eager_step(rec->x, rec->y, track);
    });
  } catch (const Error& e) {
    // Nothing ran: the step is taken again, eagerly, from the start.
    opt_->abandon_step();
    run_eagerly_because(std::string("recording the step failed: ") + e.what());
    if (fill) fill();
    return eager_step(x, y, track);
  }
  rec->delta = opt_->stats() - before;
  recorded_ = std::move(rec);
  opt_->after_recording();  // the recorded step's rate, where the optimizer reads it on the device
  recorded_->graph->replay();  // this batch's step
  comm_->watch("a recorded training step");
  ++replays_;
  return recorded_->out;
}

StepResult Session::replay_step(const Tensor& x, const Tensor& y) {
  Recorded& rec = *recorded_;
  opt_->prepare_replay();  // the next step's rate, where the optimizer reads it on the device
  rec.replay(x, y);  // with the gather recorded, x and y are the recorded tensors (fits_recording)
  comm_->watch("a recorded training step");  // its collectives, held to the timeout
  opt_->count_replayed_step(rec.delta);
  ++replays_;
  return rec.out;
}

bool Session::fits_recording(const Tensor& x, const Tensor& y, bool track, bool fill) const {
  const Recorded& rec = *recorded_;
  // A recorded gather writes the recorded tensors: a batch that brings its own gather must be those.
  const bool same_gather = fill == rec.fills && (!fill || (x.data_ptr() == rec.x.data_ptr() &&
                                                           y.data_ptr() == rec.y.data_ptr()));
  return rec.fits(x, y, device_) && same_gather && track == rec.track && model_->is_training() == rec.training &&
         (opt_->optimizer().replays_follow_the_rate() || opt_->optimizer().lr() == rec.lr);
}

void Session::run_eagerly_because(const std::string& why) {
  graph_given_up_ = true;
  if (lead()) std::fprintf(stderr, "tandem: steps run eagerly: %s\n", why.c_str());
}

void Session::reset_sums() {
  sums_.loss.zero_();
  sums_.correct.zero_();
  sums_.samples = 0;
}

void Session::eval_batch(const Tensor& x, const Tensor& y) {
  eval_sums_.samples += x.size(0);
  auto eager = [&](const Tensor& bx, const Tensor& by) { add_correct(model_->forward(bx), by, eval_sums_.correct); };
  if (recorded_eval_) {
    if (recorded_eval_->fits(x, y, device_)) return recorded_eval_->replay(x, y);
    return eager(x, y);  // another shape (the last, smaller batch): the recording stays
  }
  if (!cfg_.cuda_graph || eval_given_up_ || !device_.is_cuda()) return eager(x, y);
  eval_steady_ = x.shape() == eval_shape_ ? eval_steady_ + 1 : 1;
  eval_shape_ = x.shape();
  if (eval_steady_ <= 2) return eager(x, y);
  auto rec = std::make_unique<RecordedBatch>();
  rec->x = x;
  rec->y = y;
  try {
    rec->graph = std::make_unique<DeviceGraph>(device_, [&] { eager(rec->x, rec->y); });
  } catch (const Error& e) {
    eval_given_up_ = true;
    if (lead()) std::fprintf(stderr, "tandem: evaluation runs eagerly: recording it failed: %s\n", e.what());
    return eager(x, y);
  }
  recorded_eval_ = std::move(rec);
  recorded_eval_->graph->replay();
}

void Session::reset_eval_sums() {
  eval_sums_.correct.zero_();
  eval_sums_.samples = 0;
}

void Session::aim_at_recorded_eval_batch(Tensor& x, Tensor& y) const {
  if (!recorded_eval_) return;
  x = recorded_eval_->x;
  y = recorded_eval_->y;
}

void Session::aim_at_recorded_batch(Tensor& x, Tensor& y) const {
  if (!recorded_) return;
  x = recorded_->x;
  y = recorded_->y;
}

std::string Session::memory_line() const {
  const dist::MemoryReport m = opt_->memory_report();
  auto mb = [](int64_t bytes) {
    const double b = static_cast<double>(bytes);
    char buf[32];
    if (b < 1e6)
      std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
    else if (b < 1e9)
      std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
    else
      std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
    return std::string(buf);
  };
  return std::string("model state per rank (--shard ") + dist::shard_name(opt_->options().shard) +
         "): parameters " + mb(m.parameters) + ", gradients " + mb(m.gradients) + ", optimizer state " +
         mb(m.optimizer_state) + ", master weights " + mb(m.master_weights) + "; " + mb(m.total()) + " in all";
}

namespace {
bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && e[0] == '0';
}
}  // namespace

MemoryPlanSettings Session::memory_plan_settings() const {
  MemoryPlanSettings p;
  p.device = device_;
  p.precision = precision_;
  p.world = comm_->size();
  p.local_ranks = std::max(env_.local_size, 1);
  p.method = dist::parse_sync_method(cfg_.dist_option);
  p.half_dtype = parse_dtype(cfg_.half_dtype);
  p.spars = cfg_.spars;
  p.low_rank = cfg_.low_rank > 0 ? cfg_.low_rank : dist::SyncOptions{}.rank;
  p.error_feedback = cfg_.error_feedback;
  p.shard = dist::parse_shard(cfg_.shard);
  p.master_weights = cfg_.master_weights == "none" ? DType::f32 : parse_dtype(cfg_.master_weights);
  p.optimizer = cfg_.optimizer;
  p.momentum = cfg_.momentum;
  p.param_copies = !env_off("TANDEM_PARAM_COPIES");
  p.bias_from_product = ops::bias_from_product(device_);
  p.column_sums = !env_off("TANDEM_LN_COLUMN_SUMS");
  if (const char* e = std::getenv("TANDEM_LOGIT_CHUNK_MB"); e && std::atoll(e) > 0)
    p.logit_chunk_bytes = static_cast<int64_t>(std::atoll(e)) << 20;
  const dist::DistOptOptions o = dist_options(cfg_);
  p.bucket_bytes = o.bucket_bytes;
  p.first_bucket_bytes = o.first_bucket_bytes;
  p.release_gradients = o.release_gradients;
  p.offload_optimizer = o.offload_optimizer;
  p.offload_parameters = o.offload_parameters;
  return p;
}

int64_t Session::memory_budget() const { return usable_memory(device_, std::max(env_.local_size, 1)); }

MemoryPlan Session::plan_memory_or_refuse(const MemoryPlanSettings& given, bool total_batch_tokens, bool check) {
  MemoryPlanSettings ps = given;
  // Attention takes the fused kernels where the backend takes this geometry (the CPU's f32 kernel, cuDNN's
  // 16-bit flash attention), else the math with its probabilities.
  {
    const bool llama = ps.model == "llama";
    const int64_t heads = llama ? ps.llama.heads : ps.gpt.heads, kv = llama ? ps.llama.kv_heads : heads;
    const int64_t width = llama ? ps.llama.width : ps.gpt.width, d = width / heads, t = ps.context;
    const DType cdt = device_.is_cuda() ? activation_dtype(precision_) : DType::f32;
    const int64_t w = (heads + 2 * kv) * d;
    backend::AttentionGeom g;
    g.batch = ps.batch;
    g.heads = heads;
    g.kv_heads = kv;
    g.tq = g.tk = t;
    g.d = g.dv = d;
    g.causal = true;
    g.scale = 1.0 / std::sqrt(static_cast<double>(d));
    g.q_strides = {t * w, d, w, 1};
    g.k_strides = g.v_strides = g.q_strides;
    g.grads_like_inputs = true;
    g.dropout_p = llama ? ps.llama.dropout : ps.gpt.dropout;
    const bool kind = device_.is_cuda() ? cdt != DType::f32 : cdt == DType::f32;
    ps.fused_attention = kind && backend::backend_for(device_).fused_attention_supported(g, cdt, device_.index);
  }
  const MemoryPlan plan = plan_memory(ps);
  const int64_t budget = memory_budget();
  const bool fits = budget == 0 || plan.peak <= budget;
  std::string where = device_.str();
  if (device_.is_cpu() && env_.local_size > 1)
    where += " (shared by " + std::to_string(env_.local_size) + " ranks on this host)";
  if (lead()) {
    std::string memory = device_.str();
    if (device_.is_cpu())
      memory += env_.local_size > 1 ? " (the host's memory, shared by " + std::to_string(env_.local_size) + " ranks)"
                                    : " (the host's memory)";
    std::fprintf(stderr, "%s\n", memory_table(plan, ps, budget, memory).c_str());
    std::fflush(stderr);
  }
  if (!check) return plan;
  // Every rank stops if any would not fit: one verdict for the job.
  Tensor over = Tensor::full({1}, fits ? 0.0 : 1.0, DType::f32, device_);
  comm_->all_reduce(over)->wait();
  const bool some_rank_over = over.item<float>() > 0.0f;
  if (!some_rank_over || !cfg_.memory_check) {
    if (some_rank_over && lead())
      std::fprintf(stderr, "tandem: the plan's peak is beyond what %s has available; --no-memory-check runs it all "
                   "the same\n", where.c_str());
    return plan;
  }
  if (fits) throw Error(Error::Kind::Input, "another rank's device cannot hold the planned peak (see rank 0's plan)");
  const char* limit = std::getenv("TANDEM_MEMORY_LIMIT_MIB");
  std::string msg = "the planned peak of " + format_bytes(plan.peak) + " per rank (at " + plan.peak_at +
                    ") does not fit the " + format_bytes(budget) + " available on " + where +
                    (limit && *limit ? " (TANDEM_MEMORY_LIMIT_MIB)" : "");
  const std::vector<std::string> flags = fitting_flags(ps, budget, total_batch_tokens);
  if (!flags.empty()) {
    msg += "; planned to fit:";
    for (size_t i = 0; i < flags.size(); ++i) msg += (i ? ", " : " ") + flags[i];
  } else {
    msg += "; no smaller batch, recompute or sharding the plan tries fits: a smaller model, or devices with more memory";
    // Sharded over many ranks, what remains is what every rank holds while it builds the model whole.
    MemoryPlanSettings many = ps;
    many.shard = dist::Shard::parameters;
    many.world = 1024;
    many.recompute = RecomputePolicy::full;
    many.gpt.dropout = many.llama.dropout = 0.0;
    const MemoryPlan sharded = plan_memory(many);
    if (sharded.peak_at.rfind("building the model", 0) == 0)
      msg += " (each rank builds the model whole before --shard parameters cuts it: " + format_bytes(sharded.peak) +
             " per rank however many ranks share it)";
  }
  msg += " (--no-memory-check runs it all the same; docs/memory.md)";
  throw Error(Error::Kind::Input, msg);
}

std::string Session::where() const {
  std::string s = device_.is_cpu() ? "cpu, " + std::to_string(num_threads()) + " threads"
                                   : device_.str() + ", " + precision_name(precision_);
  if (comm_->size() > 1)
    s += ", " + std::to_string(comm_->size()) + " ranks (" + comm_->backend_name() + ", " + sync().method +
         (opt_->options().shard == dist::Shard::none ? std::string()
                                                     : std::string(", shard ") + dist::shard_name(opt_->options().shard)) +
         ")";
  return s;
}

void apply_recompute(Session& s, const std::string& policy) {
  if (policy == "none" || policy.empty()) return;
  const nn::RecomputePolicy p = nn::parse_recompute(policy);
  if (auto* lm = dynamic_cast<nn::CausalLm*>(&s.model())) return lm->set_recompute(p);
  auto* blocks = dynamic_cast<nn::BlockRecompute*>(&s.model());
  TANDEM_CHECK(blocks != nullptr, "--recompute ", policy, " runs a model's blocks again in backward: it takes --model ",
               "gpt, llama or a resnet");
  blocks->set_recompute(p);
}

}  // namespace tandem::cli
