#pragma once
// Finite-difference gradient checking for differentiable ops, in f64.
//
// gradcheck(f, inputs) runs f once with autograd and back-propagates a fixed random weighting w of
// its output (so every output element matters, not only a sum); it then perturbs every element of
// every input that requires a gradient by +-eps, re-runs f without autograd, and compares the
// central difference of sum(w * f) with the autograd gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "tandem/autograd.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

namespace tandem::testing {

struct GradCheckOptions {
  double eps = 1e-6;
  double rtol = 1e-6;
  double atol = 1e-8;
  uint64_t seed = 99;  // for the output weighting
};

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

/// The largest |a - b| over the elements (a and b of one shape, expected).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.contiguous().to_vector<double>(), y = b.contiguous().to_vector<double>();
  double m = 0.0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

/// A fresh f64 leaf with uniform values in [lo, hi) that requires a gradient.
inline Tensor leaf(const Shape& shape, Generator& gen, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::uniform(shape, lo, hi, gen, DType::f64);
  t.requires_grad_();
  return t;
}

/// Compares autograd's gradients of f with central differences for each input that requires one.
inline ::testing::AssertionResult gradcheck(const GradFn& f, const std::vector<Tensor>& inputs,
                                            const GradCheckOptions& opt = {}) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (t.dtype() != DType::f64 || !t.is_contiguous() || !t.is_leaf())
      return ::testing::AssertionFailure() << "input " << i << " must be a contiguous f64 leaf, got " << t.str();
    Tensor(t).set_grad(Tensor());  // a handle shares the tensor: clears the leaf's gradient
  }
  Tensor out = f(inputs);
  if (!out.requires_grad()) return ::testing::AssertionFailure() << "the output does not require a gradient";
  Generator gen(opt.seed);
  const Tensor w = Tensor::uniform(out.shape(), -1.0, 1.0, gen, DType::f64);
  const std::vector<double> wv = w.to_vector<double>();
  backward(out, {}, w);

  auto projected = [&] {
    NoGradGuard no_grad;
    const std::vector<double> ov = f(inputs).to_vector<double>();
    double s = 0;
    for (size_t k = 0; k < ov.size(); ++k) s += ov[k] * wv[k];
    return s;
  };
  int64_t checked = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.requires_grad()) continue;
    const Tensor g = t.grad();
    std::vector<double> gv = g.defined() ? g.to_vector<double>() : std::vector<double>(t.numel(), 0.0);
    double* p = t.data<double>();
    for (int64_t j = 0; j < t.numel(); ++j) {
      const double orig = p[j];
      p[j] = orig + opt.eps;
      const double fp = projected();
      p[j] = orig - opt.eps;
      const double fm = projected();
      p[j] = orig;
      const double num = (fp - fm) / (2 * opt.eps), ana = gv[j];
      const double err = std::abs(num - ana);
      if (!(err <= opt.atol + opt.rtol * std::max(std::abs(num), std::abs(ana))))
        return ::testing::AssertionFailure()
               << "input " << i << " " << t.str() << " element " << j << ": autograd " << ana << ", finite difference "
               << num << " (error " << err << ")" << (g.defined() ? "" : "; autograd gave no gradient");
      ++checked;
    }
  }
  if (checked == 0) return ::testing::AssertionFailure() << "no input requires a gradient";
  return ::testing::AssertionSuccess() << checked << " gradient elements checked";
}

/// Shorthand for a one-input op.
inline ::testing::AssertionResult gradcheck1(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                                             const GradCheckOptions& opt = {}) {
  return gradcheck([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x}, opt);
}

}  // namespace tandem::testing
