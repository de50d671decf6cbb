// Elementwise ops as module functions: math, rounding, activations, comparisons and logical masks,
// selection and casts (tandem/ops.h's elementwise section).
#include <nanobind/stl/optional.h>

#include <limits>
#include <optional>

#include "binding.h"
#include "tandem/ops.h"

namespace tandem::py {

namespace {
using Unary = Tensor (*)(const Tensor&);
using Binary = Tensor (*)(const Tensor&, const Tensor&);
using WithNumber = Tensor (*)(const Tensor&, double);
template <typename F>
struct Named {
  const char* name;
  F f;
};
}  // namespace

void bind_elementwise(nb::module_& m) {
  // One operand: math and rounding (floating tensors, gradients recorded).
  const Named<Unary> unary[] = {
      {"sqrt", &tandem::sqrt},       {"reciprocal", &reciprocal}, {"abs", &tandem::abs},
      {"neg", &neg},                 {"sign", &sign},             {"erf", &tandem::erf},
      {"sin", &tandem::sin},         {"cos", &tandem::cos},       {"tan", &tandem::tan},
      {"asin", &tandem::asin},       {"acos", &tandem::acos},     {"atan", &tandem::atan},
      {"sinh", &tandem::sinh},       {"cosh", &tandem::cosh},     {"asinh", &tandem::asinh},
      {"acosh", &tandem::acosh},     {"atanh", &tandem::atanh},   {"ceil", &tandem::ceil},
      {"floor", &tandem::floor},     {"round", &tandem::round},   {"rounde", &rounde},
      {"softplus", &softplus},       {"softsign", &softsign},     {"silu", &silu},
      {"logical_not", &logical_not},
  };
  for (const auto& u : unary) m.def(u.name, u.f, nb::arg("x"), release_gil());

  m.def("pow", static_cast<Binary>(&tandem::pow), nb::arg("a"), nb::arg("b"), release_gil(),
        "a^b elementwise, broadcast.");
  m.def("pow", static_cast<WithNumber>(&tandem::pow), nb::arg("a"), nb::arg("b"), release_gil(), "a^b for a number b.");
  m.def("pow", static_cast<Tensor (*)(double, const Tensor&)>(&tandem::pow), nb::arg("a"), nb::arg("b"), release_gil(),
        "a^b for a number a.");
  m.def("leaky_relu", &leaky_relu, nb::arg("x"), nb::arg("alpha") = 0.01, release_gil(),
        "x for x > 0, alpha x below.");
  m.def("elu", &elu, nb::arg("x"), nb::arg("alpha") = 1.0, release_gil(), "x for x > 0, alpha (e^x - 1) below.");
  m.def("selu", &selu, nb::arg("x"), nb::arg("alpha") = 1.6732632423543772, nb::arg("scale") = 1.0507009873554805,
        release_gil(), "scale * elu(x, alpha).");
  m.def("hard_sigmoid", &hard_sigmoid, nb::arg("x"), nb::arg("alpha") = 0.2, nb::arg("beta") = 0.5, release_gil(),
        "max(0, min(1, alpha x + beta)).");
  m.def("gelu", &gelu, nb::arg("x"), nb::arg("tanh_approximation") = false, release_gil(),
        "x Phi(x) (erf form), or its tanh approximation.");
  m.def(
      "clip",
      [](const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
        constexpr double inf = std::numeric_limits<double>::infinity();
        return clip(x, lo.value_or(-inf), hi.value_or(inf));
      },
      nb::arg("x"), nb::arg("min").none() = nb::none(), nb::arg("max").none() = nb::none(), release_gil(),
      "x limited to [min, max] (None: no bound).");

  // Two operands, broadcast.
  const Named<Binary> binary[] = {
      {"maximum", &maximum},         {"minimum", &minimum},         {"prelu", &prelu},
      {"less", &less},               {"less_equal", &less_equal},   {"greater", &greater},
      {"greater_equal", &greater_equal}, {"equal", &equal},         {"not_equal", &not_equal},
      {"logical_and", &logical_and}, {"logical_or", &logical_or},   {"logical_xor", &logical_xor},
  };
  for (const auto& b : binary) m.def(b.name, b.f, nb::arg("a"), nb::arg("b"), release_gil());
  const Named<WithNumber> compare_number[] = {
      {"less", &less},   {"less_equal", &less_equal}, {"greater", &greater}, {"greater_equal", &greater_equal},
      {"equal", &equal}, {"not_equal", &not_equal},
  };
  for (const auto& c : compare_number) m.def(c.name, c.f, nb::arg("a"), nb::arg("b"), release_gil());
  m.def("where", &where, nb::arg("condition"), nb::arg("a"), nb::arg("b"), release_gil(),
        "a where condition is nonzero, else b (all three broadcast).");
  m.def("cast", &cast, nb::arg("x"), nb::arg("dtype"), release_gil(),
        "x converted to dtype; the gradient is converted back.");
}

}  // namespace tandem::py
