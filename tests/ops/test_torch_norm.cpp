// The softmax, normalisation, loss and attention ops against PyTorch's values and gradients
// (tests/fixtures/pytorch/norm.json, written by tests/fixtures/make_norm.py).
#include "torch_fixture.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;
using nlohmann::json;

const std::vector<FixtureCase>& cases() {
  static const std::vector<FixtureCase> c = load_fixtures("norm");
  return c;
}

void check(const std::string& name, const FixtureFn& fn) {
  const FixtureCase* c = find_case(cases(), name);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(check_case(*c, fn));
}

Reduction reduction_of(const json& a) { return parse_reduction(a.at("reduction").get<std::string>()); }

TEST(TorchNorm, SoftmaxAndLogSoftmax) {
  auto sm = [](const Ts& x, const json& a) { return Ts{softmax(x[0], a.at("dim").get<int64_t>())}; };
  auto lsm = [](const Ts& x, const json& a) { return Ts{log_softmax(x[0], a.at("dim").get<int64_t>())}; };
  for (const char* d : {"0", "1", "-1"}) {
    check(std::string("softmax_dim") + d, sm);
    check(std::string("log_softmax_dim") + d, lsm);
  }
  check("log_softmax_transposed", lsm);
  check("softmax_size1_axis", sm);
}

TEST(TorchNorm, LayerAndRmsNorm) {
  auto ln = [](const Ts& x, const json& a) {
    const Shape s = a.at("shape").get<Shape>();
    return Ts{layer_norm(x[0], s, x.size() > 1 ? x[1] : Tensor(), x.size() > 2 ? x[2] : Tensor(),
                         a.at("eps").get<double>())};
  };
  auto rms = [](const Ts& x, const json& a) {
    return Ts{rms_norm(x[0], a.at("shape").get<Shape>(), x.size() > 1 ? x[1] : Tensor(), a.at("eps").get<double>())};
  };
  for (const char* n : {"layer_norm_affine", "layer_norm_plain", "layer_norm_two_dims", "layer_norm_transposed"})
    check(n, ln);
  for (const char* n : {"rms_norm_affine", "rms_norm_plain"}) check(n, rms);
}

TEST(TorchNorm, LossesWithEachReduction) {
  for (const char* red : {"none", "mean", "sum"}) {
    const std::string r = red;
    check("cross_entropy_" + r, [](const Ts& x, const json& a) {
      return Ts{softmax_cross_entropy(x[0], x[1], reduction_of(a), a.at("ignore_index").get<int64_t>())};
    });
    check("nll_loss_" + r, [](const Ts& x, const json& a) {
      return Ts{nll_loss(x[0], x[1], reduction_of(a), a.at("ignore_index").get<int64_t>())};
    });
    check("mse_" + r, [](const Ts& x, const json& a) { return Ts{mse_loss(x[0], x[1], reduction_of(a))}; });
    check("bce_" + r, [](const Ts& x, const json& a) { return Ts{binary_cross_entropy(x[0], x[1], reduction_of(a))}; });
    check("bce_logits_" + r, [](const Ts& x, const json& a) {
      return Ts{binary_cross_entropy_with_logits(x[0], x[1], reduction_of(a))};
    });
  }
  check("cross_entropy_2d", [](const Ts& x, const json& a) {
    return Ts{softmax_cross_entropy(x[0], x[1], reduction_of(a), a.at("ignore_index").get<int64_t>())};
  });
  check("mse_transposed", [](const Ts& x, const json& a) { return Ts{mse_loss(x[0], x[1], reduction_of(a))}; });
}

TEST(TorchNorm, Attention) {
  auto attn = [](const Ts& x, const json& a) {
    return Ts{scaled_dot_product_attention(x[0], x[1], x[2], a.at("causal").get<bool>(), 0.0,
                                           a.at("scale").get<double>())};
  };
  for (const char* n : {"attention", "attention_causal_scaled", "attention_causal_longer_keys",
                        "attention_transposed_query"})
    check(n, attn);
}

}  // namespace
}  // namespace tandem::testing
