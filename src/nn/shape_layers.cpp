// Shape layers and products: SINGA's Gemm, Reshape, and pooling over one dimension.
#include <cmath>

#include "tandem/nn/layers.h"

namespace tandem::nn {

namespace {
Pool2dOptions pool1d_options(int kernel, int stride, int padding, const char* layer) {
  TANDEM_CHECK(kernel >= 1 && padding >= 0, layer, ": kernel ", kernel, " and padding ", padding,
               " must be positive and non-negative");
  if (stride < 0) stride = kernel;
  TANDEM_CHECK(stride >= 1, layer, ": stride must be at least 1, got ", stride);
  return Pool2dOptions{{1, kernel}, {1, stride}, {0, padding}};
}

// [N, C, W] pooled as [N, C, 1, W].
template <typename Pool>
Tensor pool1d(const Tensor& x, const Pool2dOptions& opt, Pool pool, const char* layer) {
  TANDEM_CHECK(x.dim() == 3 || (x.dim() == 4 && x.size(2) == 1), layer, ": expects [N, C, W] or [N, C, 1, W], got ",
               x.str());
  if (x.dim() == 4) return pool(x, opt);
  return squeeze(pool(unsqueeze(x, {2}), opt), {2});
}
}  // namespace

Gemm::Gemm(int64_t in_features, int64_t out_features, Generator& gen, double alpha, double beta, bool trans_a,
           bool trans_b, bool with_bias)
    : alpha_(alpha), beta_(beta), trans_a_(trans_a), trans_b_(trans_b) {
  TANDEM_CHECK(in_features > 0 && out_features > 0, "Gemm: feature counts must be positive, got ", in_features,
               " and ", out_features);
  const double std = std::sqrt(2.0 / static_cast<double>(in_features + out_features));
  const Shape w = trans_b ? Shape{out_features, in_features} : Shape{in_features, out_features};
  weight = register_parameter("W", Tensor::normal(w, 0.0, std, gen));
  if (with_bias) bias = register_parameter("b", Tensor::zeros({1, out_features}));
}

Tensor Gemm::forward(const Tensor& x) { return gemm(x, weight, bias, alpha_, beta_, trans_a_, trans_b_); }

std::string Gemm::describe() const {
  const int64_t in = trans_b_ ? weight.size(1) : weight.size(0), out = trans_b_ ? weight.size(0) : weight.size(1);
  return detail::cat("Gemm(", in, " -> ", out, ", alpha ", alpha_, ", beta ", beta_, trans_a_ ? ", transA" : "",
                     trans_b_ ? ", transB" : "", ")");
}

std::string Reshape::describe() const { return detail::cat("Reshape(", shape_str(shape_), ")"); }

MaxPool1d::MaxPool1d(int kernel, int stride, int padding) : opt_(pool1d_options(kernel, stride, padding, "MaxPool1d")) {}
Tensor MaxPool1d::forward(const Tensor& x) {
  return pool1d(x, opt_, [](const Tensor& t, const Pool2dOptions& o) { return max_pool2d(t, o); }, "MaxPool1d");
}
std::string MaxPool1d::describe() const {
  return detail::cat("MaxPool1d(", opt_.kernel[1], ", stride ", opt_.stride[1], ")");
}

AvgPool1d::AvgPool1d(int kernel, int stride, int padding) : opt_(pool1d_options(kernel, stride, padding, "AvgPool1d")) {}
Tensor AvgPool1d::forward(const Tensor& x) {
  return pool1d(x, opt_, [](const Tensor& t, const Pool2dOptions& o) { return avg_pool2d(t, o); }, "AvgPool1d");
}
std::string AvgPool1d::describe() const {
  return detail::cat("AvgPool1d(", opt_.kernel[1], ", stride ", opt_.stride[1], ")");
}

}  // namespace tandem::nn
