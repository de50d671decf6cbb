#pragma once
// Values from PyTorch, kept in tests/fixtures/pytorch/*.json (written by tests/fixtures/make_*.py with
// tests/fixtures/torch_fixtures.py): each case holds an op's inputs, outputs, the weighting dy of each
// output and the gradient of every input that requires one. check_case runs tandem's op on the same
// inputs (f64, CPU), compares the outputs, back-propagates sum_k <output_k, dy_k> and compares the
// gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/autograd.h"
#include "tandem/ops.h"
#include "tandem/tensor.h"

namespace tandem::testing {

struct FixtureCase {
  std::string name;
  nlohmann::json attrs;
  std::vector<Tensor> inputs;   // leaves (f64 ones require a gradient where the case says so)
  std::vector<Tensor> outputs;  // f64
  std::vector<Tensor> dy;       // undefined for outputs without a gradient
  std::vector<Tensor> grads;    // undefined for inputs without one
};

namespace fixture_detail {
inline Tensor from_json(const nlohmann::json& j, DType dtype = DType::f64) {
  const Shape shape = j.at("shape").get<Shape>();
  const std::vector<double> v = j.at("data").get<std::vector<double>>();
  Tensor t = Tensor::from_vector(v, shape);
  return dtype == DType::f64 ? t : t.to(dtype);
}
}  // namespace fixture_detail

/// The cases of tests/fixtures/pytorch/<area>.json; fails the test (and returns none) when it is missing.
inline std::vector<FixtureCase> load_fixtures(const std::string& area) {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/pytorch/" + area + ".json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing fixture file " << path;
    return {};
  }
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<FixtureCase> cases;
  for (const auto& c : doc.at("cases")) {
    FixtureCase fc;
    fc.name = c.at("name").get<std::string>();
    fc.attrs = c.at("attrs");
    for (const auto& i : c.at("inputs")) {
      const std::string dt = i.at("dtype").get<std::string>();
      Tensor base = fixture_detail::from_json(i, dt == "f64" ? DType::f64 : dt == "i64" ? DType::i64 : DType::u8);
      if (i.contains("transpose")) {
        const auto tr = i.at("transpose").get<std::vector<int64_t>>();
        base = base.transpose(tr.at(0), tr.at(1));
      }
      if (i.at("grad").get<bool>()) base.requires_grad_();
      fc.inputs.push_back(base);
    }
    for (const auto& o : c.at("outputs")) fc.outputs.push_back(fixture_detail::from_json(o));
    for (const auto& d : c.at("dy")) fc.dy.push_back(d.is_null() ? Tensor() : fixture_detail::from_json(d));
    for (const auto& g : c.at("grads")) fc.grads.push_back(g.is_null() ? Tensor() : fixture_detail::from_json(g));
    cases.push_back(std::move(fc));
  }
  return cases;
}

/// The case named `name` of a loaded file (fails the test when absent).
inline const FixtureCase* find_case(const std::vector<FixtureCase>& cases, const std::string& name) {
  for (const auto& c : cases)
    if (c.name == name) return &c;
  ADD_FAILURE() << "no fixture case named " << name;
  return nullptr;
}

namespace fixture_detail {
inline ::testing::AssertionResult close(const Tensor& expected, const Tensor& actual, double rtol, double atol,
                                        const std::string& what) {
  if (!actual.defined()) return ::testing::AssertionFailure() << what << ": tandem gave no tensor";
  if (expected.shape() != actual.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape()) << ", PyTorch's "
                                         << shape_str(expected.shape());
  const std::vector<double> e = expected.to_vector<double>(), a = actual.cpu().to_vector<double>();
  for (size_t k = 0; k < e.size(); ++k) {
    const bool both_nan = std::isnan(e[k]) && std::isnan(a[k]);
    const bool same_inf = std::isinf(e[k]) && e[k] == a[k];
    if (both_nan || same_inf) continue;
    if (!(std::fabs(e[k] - a[k]) <= atol + rtol * std::fabs(e[k])))
      return ::testing::AssertionFailure() << what << ": element " << k << " is " << a[k] << ", PyTorch's " << e[k];
  }
  return ::testing::AssertionSuccess();
}
}  // namespace fixture_detail

using FixtureFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const nlohmann::json& attrs)>;

/// Runs fn on the case's inputs and compares outputs and gradients with PyTorch's.
inline ::testing::AssertionResult check_case(const FixtureCase& c, const FixtureFn& fn, double rtol = 1e-9,
                                             double atol = 1e-11) {
  for (const Tensor& t : c.inputs)
    if (t.requires_grad()) Tensor(t).set_grad(Tensor());
  std::vector<Tensor> outs = fn(c.inputs, c.attrs);
  if (outs.size() != c.outputs.size())
    return ::testing::AssertionFailure() << c.name << ": " << outs.size() << " outputs, PyTorch's "
                                         << c.outputs.size();
  Tensor total;
  for (size_t k = 0; k < outs.size(); ++k) {
    auto r = fixture_detail::close(c.outputs[k], outs[k].to(DType::f64), rtol, atol,
                                   c.name + " output " + std::to_string(k));
    if (!r) return r;
    if (c.dy[k].defined()) {
      if (!outs[k].requires_grad())
        return ::testing::AssertionFailure() << c.name << ": output " << k << " records no gradient";
      Tensor term = sum(mul(outs[k], c.dy[k]));
      total = total.defined() ? add(total, term) : term;
    }
  }
  if (!total.defined()) return ::testing::AssertionSuccess();
  backward(total);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.grads[i].defined()) continue;
    Tensor g = c.inputs[i].grad();
    if (!g.defined()) g = Tensor::zeros(c.inputs[i].shape(), DType::f64);  // no path: PyTorch's zeros
    auto r = fixture_detail::close(c.grads[i], g, rtol, atol, c.name + " gradient of input " + std::to_string(i));
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tandem::testing
