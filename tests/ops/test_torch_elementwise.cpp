// The elementwise ops against PyTorch's values and gradients (tests/fixtures/pytorch/elementwise.json):
// every case names its op in attrs["op"]; broadcast, non-contiguous, size-1 and empty operands, ties of
// maximum and minimum, rounding at halves, masks.
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "torch_fixture.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;
using nlohmann::json;

const std::vector<FixtureCase>& cases() {
  static const std::vector<FixtureCase> c = load_fixtures("elementwise");
  return c;
}

using Unary = std::function<Tensor(const Tensor&)>;
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

FixtureFn unary(Unary f) {
  return [f](const Ts& x, const json&) { return Ts{f(x.at(0))}; };
}
FixtureFn binary(Binary f) {
  return [f](const Ts& x, const json&) { return Ts{f(x.at(0), x.at(1))}; };
}

double num(const json& a, const char* key, double fallback) { return a.contains(key) ? a.at(key).get<double>() : fallback; }

// tandem's op for each op name the fixtures use.
const std::map<std::string, FixtureFn>& ops() {
  constexpr double inf = std::numeric_limits<double>::infinity();
  static const std::map<std::string, FixtureFn> m = {
      {"exp", unary([](const Tensor& x) { return exp(x); })},
      {"log", unary([](const Tensor& x) { return log(x); })},
      {"sqrt", unary([](const Tensor& x) { return sqrt(x); })},
      {"reciprocal", unary([](const Tensor& x) { return reciprocal(x); })},
      {"abs", unary([](const Tensor& x) { return abs(x); })},
      {"neg", unary([](const Tensor& x) { return -x; })},
      {"sign", unary([](const Tensor& x) { return sign(x); })},
      {"erf", unary([](const Tensor& x) { return erf(x); })},
      {"sin", unary([](const Tensor& x) { return sin(x); })},
      {"cos", unary([](const Tensor& x) { return cos(x); })},
      {"tan", unary([](const Tensor& x) { return tan(x); })},
      {"asin", unary([](const Tensor& x) { return asin(x); })},
      {"acos", unary([](const Tensor& x) { return acos(x); })},
      {"atan", unary([](const Tensor& x) { return atan(x); })},
      {"sinh", unary([](const Tensor& x) { return sinh(x); })},
      {"cosh", unary([](const Tensor& x) { return cosh(x); })},
      {"asinh", unary([](const Tensor& x) { return asinh(x); })},
      {"acosh", unary([](const Tensor& x) { return acosh(x); })},
      {"atanh", unary([](const Tensor& x) { return atanh(x); })},
      {"ceil", unary([](const Tensor& x) { return ceil(x); })},
      {"floor", unary([](const Tensor& x) { return floor(x); })},
      {"round", unary([](const Tensor& x) { return round(x); })},
      {"rounde", unary([](const Tensor& x) { return rounde(x); })},
      {"relu", unary([](const Tensor& x) { return relu(x); })},
      {"sigmoid", unary([](const Tensor& x) { return sigmoid(x); })},
      {"tanh", unary([](const Tensor& x) { return tanh(x); })},
      {"softplus", unary([](const Tensor& x) { return softplus(x); })},
      {"softsign", unary([](const Tensor& x) { return softsign(x); })},
      {"silu", unary([](const Tensor& x) { return silu(x); })},
      {"gelu", unary([](const Tensor& x) { return gelu(x); })},
      {"gelu_tanh", unary([](const Tensor& x) { return gelu(x, true); })},
      {"selu",
       [](const Ts& x, const json& a) {
         return Ts{selu(x.at(0), num(a, "alpha", 1.6732632423543772), num(a, "scale", 1.0507009873554805))};
       }},
      {"leaky_relu", [](const Ts& x, const json& a) { return Ts{leaky_relu(x.at(0), num(a, "alpha", 0.01))}; }},
      {"elu", [](const Ts& x, const json& a) { return Ts{elu(x.at(0), num(a, "alpha", 1.0))}; }},
      {"hard_sigmoid",
       [](const Ts& x, const json& a) { return Ts{hard_sigmoid(x.at(0), num(a, "alpha", 0.2), num(a, "beta", 0.5))}; }},
      {"clip", [](const Ts& x, const json& a) { return Ts{clip(x.at(0), num(a, "lo", -inf), num(a, "hi", inf))}; }},
      {"pow_scalar", [](const Ts& x, const json& a) { return Ts{pow(x.at(0), num(a, "p", 1.0))}; }},
      {"scalar_pow", [](const Ts& x, const json& a) { return Ts{pow(num(a, "s", 1.0), x.at(0))}; }},
      {"pow", binary([](const Tensor& a, const Tensor& b) { return pow(a, b); })},
      {"div", binary([](const Tensor& a, const Tensor& b) { return a / b; })},
      {"sub", binary([](const Tensor& a, const Tensor& b) { return a - b; })},
      {"mul", binary([](const Tensor& a, const Tensor& b) { return a * b; })},
      {"add", binary([](const Tensor& a, const Tensor& b) { return a + b; })},
      {"maximum", binary([](const Tensor& a, const Tensor& b) { return maximum(a, b); })},
      {"minimum", binary([](const Tensor& a, const Tensor& b) { return minimum(a, b); })},
      {"prelu", binary([](const Tensor& a, const Tensor& b) { return prelu(a, b); })},
      {"where", [](const Ts& x, const json&) { return Ts{where(x.at(0), x.at(1), x.at(2))}; }},
      {"less", binary([](const Tensor& a, const Tensor& b) { return less(a, b); })},
      {"less_equal", binary([](const Tensor& a, const Tensor& b) { return less_equal(a, b); })},
      {"greater", binary([](const Tensor& a, const Tensor& b) { return greater(a, b); })},
      {"greater_equal", binary([](const Tensor& a, const Tensor& b) { return greater_equal(a, b); })},
      {"equal", binary([](const Tensor& a, const Tensor& b) { return equal(a, b); })},
      {"not_equal", binary([](const Tensor& a, const Tensor& b) { return not_equal(a, b); })},
      {"logical_and", binary([](const Tensor& a, const Tensor& b) { return logical_and(a, b); })},
      {"logical_or", binary([](const Tensor& a, const Tensor& b) { return logical_or(a, b); })},
      {"logical_xor", binary([](const Tensor& a, const Tensor& b) { return logical_xor(a, b); })},
      {"logical_not", unary([](const Tensor& x) { return logical_not(x); })},
      {"cast_f32", unary([](const Tensor& x) { return cast(cast(x, DType::f32), DType::f64); })},
  };
  return m;
}

TEST(TorchElementwise, EveryCaseMatchesPyTorch) {
  ASSERT_FALSE(cases().empty());
  for (const FixtureCase& c : cases()) {
    const std::string op = c.attrs.at("op").get<std::string>();
    auto it = ops().find(op);
    ASSERT_NE(it, ops().end()) << c.name << ": no tandem op for '" << op << "'";
    EXPECT_TRUE(check_case(c, it->second)) << c.name;
  }
}

TEST(TorchElementwise, EveryOpHasCases) {
  std::set<std::string> covered;
  for (const FixtureCase& c : cases()) covered.insert(c.attrs.at("op").get<std::string>());
  for (const auto& [op, fn] : ops()) EXPECT_TRUE(covered.count(op)) << op << " has no PyTorch fixture";
}

// The cases that exercise layouts and edge shapes are there (a regenerated file keeps them).
TEST(TorchElementwise, EdgeShapesAreCovered) {
  for (const char* name : {"exp_noncontiguous", "maximum_noncontiguous", "where_noncontiguous", "prelu_noncontiguous",
                           "add_empty", "mul_empty_broadcast", "minimum_empty", "where_empty", "mul_size1",
                           "sub_scalar_operand", "maximum_ties", "minimum_ties", "pow_zero_base", "round", "rounde"})
    EXPECT_NE(find_case(cases(), name), nullptr) << name;
}

}  // namespace
}  // namespace tandem::testing
