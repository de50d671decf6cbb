// The session shared by `tandem train` and `tandem bench train`.
#include "cli/session.h"

#include <chrono>

#include "cli/commands.h"
#include "tandem/distributed/loss_scaler.h"
#include "tandem/distributed/sync_batch_norm.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem::cli {

namespace {

std::shared_ptr<optim::Optimizer> make_optimizer(const SessionConfig& cfg, std::vector<Tensor> params) {
  if (cfg.optimizer == "adam") {
    optim::AdamOptions o;
    o.lr = cfg.lr;
    o.weight_decay = cfg.weight_decay;
    return std::make_shared<optim::Adam>(std::move(params), o);
  }
  optim::SgdOptions o;
  o.lr = cfg.lr;
  o.momentum = cfg.momentum;
  o.weight_decay = cfg.weight_decay;
  o.nesterov = cfg.nesterov;
  return std::make_shared<optim::SGD>(std::move(params), o);
}

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
  return o;
}

}  // namespace

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
  precision_ = cfg.precision.empty() ? default_precision(device_) : parse_precision(cfg.precision);
  TANDEM_CHECK(device_.is_cuda() || activation_dtype(precision_) == DType::f32, "--precision ",
               precision_name(precision_), " needs a CUDA device: the CPU computes in f32 (use --precision f32)");
  comm_ = dist::init_communicator(device_, std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000)));
}

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
  opt_ = std::make_unique<dist::DistOpt>(make_optimizer(cfg_, model_->parameters()), comm_, o);
  if (o.skip_nonfinite) scaler_ = std::make_unique<dist::LossScaler>(*opt_);
}

void Session::sync_model() { opt_->sync_parameters(*model_); }

StepResult Session::forward_backward(const Tensor& x, const Tensor& y, double weight, bool last) {
  Tensor logits, loss;
  {
    PrecisionScope scope(precision_);
    logits = model_->forward(x);
    loss = softmax_cross_entropy(logits, y);
    if (weight != 1.0) loss = scale(loss, weight);
  }
  const Tensor to_backward = scaler_ ? scaler_->scale_loss(loss) : loss;
  if (last) {
    opt_->backward_and_sync(to_backward);
  } else {
    auto local_only = opt_->no_sync();
    opt_->backward_and_sync(to_backward);
  }
  return {logits.detach(), loss.detach()};
}

void Session::apply_update() {
  if (scaler_) scaler_->unscale();
  if (cfg_.clip_norm > 0.0) opt_->clip_grad_norm(cfg_.clip_norm);
  if (scaler_)
    scaler_->update();
  else
    opt_->update();
}

StepResult Session::train_step(const Tensor& x, const Tensor& y) {
  StepResult r = forward_backward(x, y, 1.0, true);
  apply_update();
  return r;
}

std::string Session::where() const {
  std::string s = device_.is_cpu() ? "cpu, " + std::to_string(num_threads()) + " threads"
                                   : device_.str() + ", " + precision_name(precision_);
  if (comm_->size() > 1)
    s += ", " + std::to_string(comm_->size()) + " ranks (" + comm_->backend_name() + ", " +
         sync().method + ")";
  return s;
}

}  // namespace tandem::cli
