// The basic ops against PyTorch's values and gradients (tests/fixtures/pytorch/core.json).
#include "torch_fixture.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;
using nlohmann::json;

const std::vector<FixtureCase>& cases() {
  static const std::vector<FixtureCase> c = load_fixtures("core");
  return c;
}

void check(const std::string& name, const FixtureFn& fn) {
  const FixtureCase* c = find_case(cases(), name);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(check_case(*c, fn));
}

TEST(TorchCore, Arithmetic) {
  check("add_broadcast", [](const Ts& x, const json&) { return Ts{add(x[0], x[1])}; });
  check("sub_both_stretched", [](const Ts& x, const json&) { return Ts{sub(x[0], x[1])}; });
  check("mul_noncontiguous", [](const Ts& x, const json&) { return Ts{mul(x[0], x[1])}; });
  check("div", [](const Ts& x, const json&) { return Ts{div(x[0], x[1])}; });
  check("exp", [](const Ts& x, const json&) { return Ts{exp(x[0])}; });
  check("log", [](const Ts& x, const json&) { return Ts{log(x[0])}; });
}

TEST(TorchCore, SumsAndShapes) {
  auto summed = [](const Ts& x, const json& a) {
    return Ts{sum(x[0], a.at("dims").get<std::vector<int64_t>>(), a.at("keepdim").get<bool>())};
  };
  check("sum_dims_keepdim", summed);
  check("sum_dim_size1", summed);
  check("permute", [](const Ts& x, const json& a) { return Ts{permute(x[0], a.at("perm").get<std::vector<int64_t>>())}; });
  check("concat", [](const Ts& x, const json& a) { return Ts{concat({x[0], x[1]}, a.at("dim").get<int64_t>())}; });
  check("slice", [](const Ts& x, const json& a) {
    return Ts{slice(x[0], a.at("dim").get<int64_t>(), a.at("start").get<int64_t>(), a.at("length").get<int64_t>())};
  });
  check("softmax_dim0", [](const Ts& x, const json& a) { return Ts{softmax(x[0], a.at("dim").get<int64_t>())}; });
}

TEST(TorchCore, MatrixProducts) {
  check("matmul", [](const Ts& x, const json&) { return Ts{matmul(x[0], x[1])}; });
  check("matmul_transposed_operand", [](const Ts& x, const json&) { return Ts{matmul(x[0], x[1])}; });
}

}  // namespace
}  // namespace tandem::testing
