// Embedding, the recurrent networks, optimizer steps and learning-rate schedules against PyTorch
// (tests/fixtures/pytorch/rnn.json, written by tests/fixtures/make_rnn.py).
#include <fstream>

#include "tandem/optim/optimizer.h"
#include "torch_fixture.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;
using nlohmann::json;

const std::vector<FixtureCase>& cases() {
  static const std::vector<FixtureCase> c = load_fixtures("rnn");
  return c;
}

const json& document() {
  static const json doc = [] {
    std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/pytorch/rnn.json");
    return in ? json::parse(in) : json::object();
  }();
  return doc;
}

void check(const std::string& name, const FixtureFn& fn) {
  const FixtureCase* c = find_case(cases(), name);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(check_case(*c, fn));
}

TEST(TorchRnn, Embedding) {
  auto f = [](const Ts& x, const json&) { return Ts{embedding(x[0], x[1])}; };
  for (const char* name : {"embedding_duplicates", "embedding_random_3d", "embedding_noncontiguous_weight",
                           "embedding_empty_indices"})
    check(name, f);
}

RnnMode mode_of(const std::string& s) {
  if (s == "rnn_tanh") return RnnMode::RnnTanh;
  if (s == "rnn_relu") return RnnMode::RnnRelu;
  if (s == "lstm") return RnnMode::Lstm;
  return RnnMode::Gru;
}

// The network of a case: inputs x, flat weight, then hx (and cx) when the case has states; outputs
// y, hy (and cy), as torch's module returns them.
Ts run_case(const Ts& x, const json& a) {
  RnnOptions o;
  o.mode = mode_of(a.at("mode").get<std::string>());
  o.hidden_size = a.at("hidden").get<int64_t>();
  o.num_layers = a.at("layers").get<int64_t>();
  o.bidirectional = a.at("bidirectional").get<bool>();
  o.batch_first = a.at("batch_first").get<bool>();
  o.bias = a.at("bias").get<bool>();
  const bool states = a.at("with_h").get<bool>(), lstm = o.mode == RnnMode::Lstm;
  RnnResult r = rnn(x[0], x[1], states ? x[2] : Tensor(), states && lstm ? x[3] : Tensor(), o);
  Ts out{r.y, r.hy};
  if (lstm) out.push_back(r.cy);
  return out;
}

TEST(TorchRnn, ElmanRnn) {
  check("rnn_tanh_2layer_bidirectional", run_case);
  check("rnn_relu_batch_first_no_state", run_case);
}

TEST(TorchRnn, Lstm) {
  for (const char* name : {"lstm_2layer_bidirectional", "lstm_batch_first_transposed_input", "lstm_no_bias",
                           "lstm_size1_axes"})
    check(name, run_case);
}

TEST(TorchRnn, Gru) {
  check("gru_2layer", run_case);
  check("gru_bidirectional_batch_first", run_case);
}

Tensor from(const json& j) { return fixture_detail::from_json(j); }

// An optimizer of the case's kind over params, with the case's groups (a group's lr becomes its factor).
std::unique_ptr<optim::Optimizer> make_optimizer(const json& c, const std::vector<Tensor>& params) {
  const json& o = c.at("options");
  const std::string kind = o.at("kind").get<std::string>();
  const double lr = o.at("lr").get<double>();
  std::vector<optim::ParamGroup> groups;
  if (c.at("groups").is_null()) {
    groups.push_back({params, 1.0, std::nullopt});
  } else {
    for (const json& g : c.at("groups")) {
      optim::ParamGroup pg;
      for (int64_t i : g.at("params").get<std::vector<int64_t>>()) pg.params.push_back(params[static_cast<size_t>(i)]);
      if (g.contains("lr")) pg.lr_scale = g.at("lr").get<double>() / lr;
      if (g.contains("weight_decay")) pg.weight_decay = g.at("weight_decay").get<double>();
      groups.push_back(pg);
    }
  }
  if (kind == "rmsprop")
    return std::make_unique<optim::RMSProp>(
        groups, optim::RmsPropOptions{lr, o.at("alpha").get<double>(), o.at("eps").get<double>(),
                                      o.at("weight_decay").get<double>(), false});
  if (kind == "adagrad")
    return std::make_unique<optim::AdaGrad>(
        groups, optim::AdagradOptions{lr, o.at("lr_decay").get<double>(), o.at("weight_decay").get<double>(),
                                      o.at("initial_accumulator_value").get<double>(), o.at("eps").get<double>(),
                                      false});
  return std::make_unique<optim::Adam>(groups, optim::AdamOptions{lr, o.at("beta1").get<double>(),
                                                                  o.at("beta2").get<double>(), o.at("eps").get<double>(),
                                                                  o.at("weight_decay").get<double>(), true});
}

TEST(TorchRnn, OptimizerSteps) {
  const json& doc = document();
  ASSERT_TRUE(doc.contains("optim")) << "rnn.json has no optimizer cases";
  for (const json& c : doc.at("optim")) {
    const std::string name = c.at("name").get<std::string>();
    std::vector<Tensor> params;
    for (const json& p : c.at("initial")) params.push_back(from(p).requires_grad_());
    auto opt = make_optimizer(c, params);
    for (size_t s = 0; s < c.at("grads").size(); ++s) {
      for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(from(c.at("grads")[s][i]));
      opt->step();
      for (size_t i = 0; i < params.size(); ++i) {
        auto r = fixture_detail::close(from(c.at("after")[s][i]), params[i], 1e-10, 1e-12,
                                       name + " step " + std::to_string(s + 1) + " parameter " + std::to_string(i));
        EXPECT_TRUE(r);
      }
    }
  }
}

TEST(TorchRnn, Schedules) {
  const json& doc = document();
  ASSERT_TRUE(doc.contains("schedules")) << "rnn.json has no schedules";
  for (const json& s : doc.at("schedules")) {
    std::unique_ptr<optim::LrSchedule> sched;
    const std::string kind = s.at("kind").get<std::string>();
    if (kind == "exponential")
      sched = std::make_unique<optim::ExponentialDecay>(s.at("init").get<double>(), s.at("decay_steps").get<int64_t>(),
                                                        s.at("rate").get<double>(), s.at("staircase").get<bool>());
    else
      sched = std::make_unique<optim::WarmupCosine>(s.at("peak").get<double>(), s.at("warmup").get<int64_t>(),
                                                    s.at("total").get<int64_t>(), s.at("min_lr").get<double>());
    const auto rates = s.at("rates").get<std::vector<double>>();
    for (size_t k = 0; k < rates.size(); ++k)
      EXPECT_NEAR(sched->lr(static_cast<int64_t>(k)), rates[k], 1e-12 + 1e-9 * rates[k])
          << s.at("name").get<std::string>() << " step " << k;
  }
}

}  // namespace
}  // namespace tandem::testing
