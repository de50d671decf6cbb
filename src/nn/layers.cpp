#include "tandem/nn/layers.h"

#include "tandem/autograd.h"

#include <cmath>

namespace tandem::nn {

namespace {
// Gaussian with std sqrt(2 / (fan_in + fan_out)): the guide's initialisation.
Tensor gaussian_init(const Shape& shape, int64_t fan_in, int64_t fan_out, Generator& gen) {
  double std = std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return Tensor::normal(shape, 0.0, std, gen);
}

Pool2dOptions pool_options(int kernel, int stride, int padding) {
  TANDEM_CHECK(kernel >= 1, "pooling kernel must be at least 1, got ", kernel);
  if (stride < 0) stride = kernel;
  return Pool2dOptions{{kernel, kernel}, {stride, stride}, {padding, padding}};
}
}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int kernel, Generator& gen, int stride, int padding,
               bool with_bias, bool relu, int groups)
    : opt_{{stride, stride}, {padding, padding}, relu, groups} {
  TANDEM_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0, "Conv2d: channels and kernel must be positive");
  TANDEM_CHECK(groups >= 1 && in_channels % groups == 0 && out_channels % groups == 0, "Conv2d: groups (", groups,
               ") must be positive and divide both the input channels (", in_channels, ") and the output channels (",
               out_channels, ")");
  const int64_t k2 = static_cast<int64_t>(kernel) * kernel, in_group = in_channels / groups;
  weight = register_parameter("weight", gaussian_init({out_channels, in_group, kernel, kernel}, in_group * k2,
                                                      out_channels / groups * k2, gen));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({out_channels}));
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, opt_); }

std::string Conv2d::describe() const {
  return detail::cat("Conv2d(", weight.size(1) * opt_.groups, " -> ", weight.size(0), ", ", weight.size(2), "x",
                     weight.size(3), ", stride ", opt_.stride[0], ", padding ", opt_.padding[0],
                     opt_.groups > 1 ? detail::cat(", groups ", opt_.groups) : std::string(),
                     opt_.relu ? ", ReLU" : "", ")");
}

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, bool with_bias, bool relu) : relu_(relu) {
  TANDEM_CHECK(in_features > 0 && out_features > 0, "Linear: feature counts must be positive");
  weight = register_parameter("weight", gaussian_init({out_features, in_features}, in_features, out_features, gen));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({out_features}));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias, relu_); }

std::string Linear::describe() const {
  return detail::cat("Linear(", weight.size(1), " -> ", weight.size(0), relu_ ? ", ReLU" : "", ")");
}

MaxPool2d::MaxPool2d(int kernel, int stride, int padding) : opt_(pool_options(kernel, stride, padding)) {}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, opt_); }
std::string MaxPool2d::describe() const {
  return detail::cat("MaxPool2d(", opt_.kernel[0], "x", opt_.kernel[1], ", stride ", opt_.stride[0], ")");
}

AvgPool2d::AvgPool2d(int kernel, int stride, int padding) : opt_(pool_options(kernel, stride, padding)) {}
Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, opt_); }
std::string AvgPool2d::describe() const {
  return detail::cat("AvgPool2d(", opt_.kernel[0], "x", opt_.kernel[1], ", stride ", opt_.stride[0], ")");
}

BatchNorm2d::BatchNorm2d(int64_t channels, double momentum, double eps) : momentum_(momentum), eps_(eps) {
  TANDEM_CHECK(channels > 0, "BatchNorm2d: channels must be positive");
  gamma = register_parameter("gamma", Tensor::ones({channels}));
  beta = register_parameter("beta", Tensor::zeros({channels}));
  running_mean = register_buffer("running_mean", Tensor::zeros({channels}));
  running_var = register_buffer("running_var", Tensor::ones({channels}));
}

namespace {
// Under recompute's second run a batch norm normalises with the batch's statistics again, and its running
// statistics are put back where the first run left them: they move once a step.
class KeepRunningStats {
 public:
  KeepRunningStats(BatchNorm2d& bn) : bn_(bn), on_(bn.is_training() && recomputing()) {  // NOLINT
    if (!on_) return;
    NoGradGuard no_grad;
    mean_ = bn.running_mean.clone();
    var_ = bn.running_var.clone();
  }
  ~KeepRunningStats() {
    if (!on_) return;
    NoGradGuard no_grad;
    bn_.running_mean.copy_(mean_);
    bn_.running_var.copy_(var_);
  }
  KeepRunningStats(const KeepRunningStats&) = delete;
  KeepRunningStats& operator=(const KeepRunningStats&) = delete;

 private:
  BatchNorm2d& bn_;
  bool on_;
  Tensor mean_, var_;
};
}  // namespace

Tensor BatchNorm2d::forward(const Tensor& x) {
  KeepRunningStats keep(*this);
  if (is_training() && train_forward_) return train_forward_(*this, x);
  return batch_norm2d(x, gamma, beta, running_mean, running_var, is_training(), momentum_, eps_);
}

Tensor BatchNorm2d::forward_act(const Tensor& x, const Tensor& residual, bool relu) {
  KeepRunningStats keep(*this);
  if (is_training() && train_forward_) {  // a replaced computation, then the residual and ReLU unfused
    Tensor y = train_forward_(*this, x);
    if (residual.defined()) y = add(y, residual);
    return relu ? tandem::relu(y) : y;
  }
  return batch_norm2d_act(x, residual, gamma, beta, running_mean, running_var, is_training(), relu, momentum_, eps_);
}

std::string BatchNorm2d::describe() const { return detail::cat("BatchNorm2d(", gamma.size(0), ")"); }

Dropout::Dropout(double p, uint64_t seed) : p_(p), gen_(seed) {
  TANDEM_CHECK(p >= 0.0 && p < 1.0, "Dropout: probability ", p, " outside [0, 1)");
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), gen_); }
std::string Dropout::describe() const { return detail::cat("Dropout(", p_, ")"); }

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Module& layer = *layers_[i];
    if (i < groups_.size() && !groups_[i].params().empty())
      h = groups_[i].run(h, [&layer](const Tensor& in) { return layer.forward(in); });
    else
      h = layer.forward(h);
  }
  return h;
}

void Sequential::group_layers() {
  groups_.clear();
  for (size_t i = 0; i < layers_.size(); ++i) groups_.emplace_back(std::to_string(i), layers_[i]->parameters());
}

std::vector<LayerGroup*> Sequential::layer_groups() {
  std::vector<LayerGroup*> out;
  for (LayerGroup& g : groups_)
    if (!g.params().empty()) out.push_back(&g);
  return out;
}

std::string Sequential::describe() const {
  std::string out;
  for (size_t i = 0; i < layers_.size(); ++i) out += std::to_string(i) + ": " + layers_[i]->describe() + "\n";
  return out;
}

}  // namespace tandem::nn
