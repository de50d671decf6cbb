// RMSProp and AdaGrad (SINGA's and PyTorch's forms), parameter groups, learning-rate schedules, the
// weight-decay split, and their composition with DistOpt and checkpoints (resume equals uninterrupted).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unistd.h>

#include "tandem/autograd.h"
#include "tandem/checkpoint.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/distributed/dist_opt.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one mentioning '" << *fragments.begin() << "'";
  } catch (const Error& e) {
    for (const char* frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << "'" << frag << "' missing from: " << e.what();
  }
}

Tensor param(std::vector<double> v) {
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  t.requires_grad_();
  return t;
}

// Steps opt `steps` times with the gradient g_k[i] = sin(k + i) and compares with `expect`, which
// updates its own copy of the values the same way, in double.
void run_against(optim::Optimizer& opt, Tensor p, std::vector<double> ref, int steps,
                 const std::function<void(std::vector<double>&, const std::vector<double>&, int)>& expect) {
  for (int k = 1; k <= steps; ++k) {
    std::vector<double> g(ref.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(k + static_cast<double>(i));
    p.set_grad(Tensor::from_vector(g, p.shape()));
    opt.step();
    expect(ref, g, k);
    std::vector<double> got = p.to_vector<double>();
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-12) << "step " << k << " element " << i;
  }
}

TEST(Optimizers, RmsPropInBothForms) {
  for (bool inside : {false, true}) {
    Tensor p = param({0.5, -1.0, 2.0});
    optim::RMSProp opt({p}, {.lr = 0.1, .alpha = 0.9, .eps = 1e-3, .weight_decay = 0.05, .eps_inside_sqrt = inside});
    std::vector<double> v(3, 0.0);
    run_against(opt, p, p.to_vector<double>(), 4, [&](std::vector<double>& x, const std::vector<double>& g, int) {
      for (size_t i = 0; i < x.size(); ++i) {
        const double gi = g[i] + 0.05 * x[i];
        v[i] = 0.9 * v[i] + 0.1 * gi * gi;
        x[i] -= 0.1 * gi / (inside ? std::sqrt(v[i] + 1e-3) : std::sqrt(v[i]) + 1e-3);
      }
    });
    EXPECT_EQ(opt.state_lists().at(0).kind, "square_avg");
    EXPECT_EQ(opt.replay_blocker(), "");
  }
}

TEST(Optimizers, AdaGradInBothFormsWithDecay) {
  for (bool inside : {false, true}) {
    Tensor p = param({0.5, -1.0, 2.0, 0.0});
    optim::AdaGrad opt({p}, {.lr = 0.2, .lr_decay = 0.5, .weight_decay = 0.1, .initial_accumulator_value = 0.3,
                             .eps = 1e-4, .eps_inside_sqrt = inside});
    std::vector<double> s(4, 0.3);
    run_against(opt, p, p.to_vector<double>(), 4, [&](std::vector<double>& x, const std::vector<double>& g, int k) {
      const double lr = 0.2 / (1.0 + (k - 1) * 0.5);
      for (size_t i = 0; i < x.size(); ++i) {
        const double gi = g[i] + 0.1 * x[i];
        s[i] += gi * gi;
        x[i] -= lr * gi / (inside ? std::sqrt(s[i] + 1e-4) : std::sqrt(s[i]) + 1e-4);
      }
    });
    EXPECT_EQ(opt.state_lists().at(0).kind, "sum");
    EXPECT_EQ(*opt.step_counts(), std::vector<int64_t>{4});
    EXPECT_NE(opt.replay_blocker(), "");  // the decaying rate reads a host-side count
  }
}

TEST(Optimizers, OptionErrors) {
  Tensor p = param({1.0});
  expect_error([&] { optim::RMSProp({p}, {.alpha = 1.0}); }, {"RMSProp", "alpha"});
  expect_error([&] { optim::RMSProp({p}, {.eps = 0.0}); }, {"RMSProp", "eps"});
  expect_error([&] { optim::AdaGrad({p}, {.lr_decay = -1.0}); }, {"AdaGrad", "lr_decay"});
  expect_error([&] { optim::AdaGrad({p}, {.initial_accumulator_value = -0.5}); }, {"AdaGrad", "initial"});
}

TEST(Optimizers, GuardSkipsTheStep) {
  Tensor p = param({1.0, 2.0});
  Tensor guard = Tensor::full({1}, std::numeric_limits<double>::infinity());
  for (int kind = 0; kind < 2; ++kind) {
    std::unique_ptr<optim::Optimizer> opt;
    if (kind == 0)
      opt = std::make_unique<optim::RMSProp>(std::vector<Tensor>{p}, optim::RmsPropOptions{});
    else
      opt = std::make_unique<optim::AdaGrad>(std::vector<Tensor>{p}, optim::AdagradOptions{});
    opt->set_step_guard(guard);
    p.set_grad(Tensor::ones({2}, DType::f64));
    opt->step();
    EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1.0, 2.0})) << kind;
    EXPECT_EQ(opt->steps(), 1);
  }
}

TEST(Optimizers, ParameterGroupsHaveTheirOwnRateAndDecay) {
  // Two groups under SGD: the second at half the rate and without weight decay.
  Tensor a = param({1.0, -1.0}), b = param({2.0}), c = param({3.0});
  optim::SGD sgd(std::vector<optim::ParamGroup>{{{a}, 1.0, std::nullopt}, {{b, c}, 0.5, 0.0}},
                 {.lr = 0.1, .weight_decay = 0.2});
  ASSERT_EQ(sgd.groups().size(), 2u);
  EXPECT_EQ(sgd.group_of(), (std::vector<int>{0, 1, 1}));
  for (Tensor t : {a, b, c}) t.set_grad(Tensor::ones(t.shape(), DType::f64));
  sgd.step();
  EXPECT_NEAR(a.to_vector<double>()[0], 1.0 - 0.1 * (1.0 + 0.2 * 1.0), 1e-15);
  EXPECT_NEAR(a.to_vector<double>()[1], -1.0 - 0.1 * (1.0 - 0.2 * 1.0), 1e-15);
  EXPECT_NEAR(b.to_vector<double>()[0], 2.0 - 0.05, 1e-15);
  EXPECT_NEAR(c.to_vector<double>()[0], 3.0 - 0.05, 1e-15);

  // Regrouping keeps the order and names the rest as one more group.
  optim::Adam adam({a, b, c}, {.lr = 0.01});
  adam.set_param_groups({{{c}, 2.0, 0.1}});
  EXPECT_EQ(adam.group_of(), (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(adam.groups().size(), 2u);
  EXPECT_EQ(adam.groups()[0].lr_scale, 2.0);
  EXPECT_FALSE(adam.groups()[1].weight_decay.has_value());
  Tensor stranger = param({0.0});
  expect_error([&] { adam.set_param_groups({{{stranger}, 1.0, std::nullopt}}); },
               {"set_param_groups", "not one of the optimizer's 3 parameters"});
  expect_error([&] { adam.set_param_groups({{{a}, 1.0, std::nullopt}, {{a}, 1.0, std::nullopt}}); },
               {"set_param_groups", "in groups 0 and 1"});
  expect_error([&] { adam.set_param_groups({{{a}, -1.0, std::nullopt}}); }, {"learning-rate factor"});
}

TEST(Optimizers, DecayGroupsSplitMatricesFromBiasesNormsAndTables) {
  Generator gen(3);
  nn::Sequential model;
  auto emb = model.add(std::make_shared<nn::Embedding>(10, 4, gen));
  auto lstm = model.add(std::make_shared<nn::LSTM>(4, 3, gen));
  auto lin = model.add(std::make_shared<nn::Linear>(3, 2, gen));
  auto bn = model.add(std::make_shared<nn::BatchNorm2d>(2));
  std::vector<optim::ParamGroup> g = optim::decay_groups(model, 0.1);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].weight_decay, 0.1);
  EXPECT_EQ(g[1].weight_decay, 0.0);
  auto in = [](const optim::ParamGroup& grp, const Tensor& t) {
    for (const Tensor& p : grp.params)
      if (p.is_same(t)) return true;
    return false;
  };
  EXPECT_TRUE(in(g[1], emb->weight));
  EXPECT_TRUE(in(g[0], lin->weight));
  EXPECT_TRUE(in(g[1], lin->bias));
  EXPECT_TRUE(in(g[1], bn->gamma) && in(g[1], bn->beta));
  for (auto& [name, t] : lstm->named_parameters()) EXPECT_EQ(in(g[0], t), name.rfind("weight", 0) == 0) << name;
  EXPECT_EQ(g[0].params.size() + g[1].params.size(), model.parameters().size());
}

TEST(Optimizers, ScheduleSetsEachStepsRate) {
  Tensor p = param({0.0});
  optim::SGD sgd({p}, {.lr = 1.0});
  auto sched = std::make_shared<optim::WarmupCosine>(0.4, 2, 6, 0.1);
  sgd.set_schedule(sched);
  EXPECT_DOUBLE_EQ(sgd.lr(), 0.2);
  double expected_p = 0.0;
  for (int k = 0; k < 8; ++k) {
    EXPECT_DOUBLE_EQ(sgd.lr(), sched->lr(k)) << k;
    p.set_grad(Tensor::ones({1}, DType::f64));
    sgd.step();
    expected_p -= sched->lr(k);
    EXPECT_NEAR(p.to_vector<double>()[0], expected_p, 1e-15);
  }
  EXPECT_DOUBLE_EQ(sgd.lr(), 0.1);  // past the end: min_lr
  sgd.set_steps(1);
  EXPECT_DOUBLE_EQ(sgd.lr(), 0.4);
  optim::ExponentialDecay stairs(1.0, 3, 0.5, true);
  EXPECT_DOUBLE_EQ(stairs.lr(2), 1.0);
  EXPECT_DOUBLE_EQ(stairs.lr(3), 0.5);
  EXPECT_DOUBLE_EQ(optim::ConstantLr(0.3).lr(100), 0.3);
  expect_error([] { optim::WarmupCosine(0.1, 5, 5); }, {"WarmupCosine", "warmup_steps < total_steps"});
  expect_error([] { optim::ExponentialDecay(0.1, 0, 0.5); }, {"ExponentialDecay", "decay_steps"});
}

// A small model of every family member: embedding, LSTM, linear head.
struct Net : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::Linear> head;
  explicit Net(uint64_t seed) {
    Generator gen(seed);
    emb = register_module("emb", std::make_shared<nn::Embedding>(6, 3, gen));
    lstm = register_module("lstm", std::make_shared<nn::LSTM>(3, 4, gen));
    head = register_module("head", std::make_shared<nn::Linear>(4, 6, gen));
  }
  Tensor forward(const Tensor& tokens) override {  // tokens i64 [T, N] -> logits [T * N, 6]
    Tensor y = lstm->forward(emb->forward(tokens));
    return head->forward(reshape(y, {y.size(0) * y.size(1), y.size(2)}));
  }
};

Tensor batch_tokens(int step) {
  std::vector<int64_t> v(8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((step * 5 + i * 3) % 6);
  return Tensor::from_vector(v, {4, 2});
}

Tensor batch_labels(int step) {
  std::vector<int64_t> v(8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((step + i) % 6);
  return Tensor::from_vector(v, {8});
}

void train(Net& net, optim::Optimizer& opt, int from, int to) {
  for (int s = from; s < to; ++s) {
    opt.zero_grad(true);
    backward(softmax_cross_entropy(net.forward(batch_tokens(s)), batch_labels(s)));
    opt.step();
  }
}

std::vector<float> values(const nn::Module& m) {
  std::vector<float> out;
  for (const Tensor& t : m.parameters())
    for (float v : t.to_vector<float>()) out.push_back(v);
  return out;
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(Net&)>;

void check_resume(const MakeOpt& make, const std::string& what) {
  Net whole(1);
  auto opt_whole = make(whole);
  train(whole, *opt_whole, 0, 6);

  Net first(1);
  auto opt_first = make(first);
  train(first, *opt_first, 0, 3);
  const fs::path path = fs::temp_directory_path() / ("tandem_optim_resume_" + std::to_string(getpid()));
  save_checkpoint(path.string(), first, opt_first.get());

  Net second(2);  // other initial values; the optimizer without groups: the checkpoint restores them
  auto opt_second = make(second);
  opt_second->set_param_groups({});
  load_checkpoint(path.string(), second, opt_second.get());
  fs::remove(path);
  ASSERT_EQ(opt_second->groups().size(), opt_first->groups().size()) << what;
  for (size_t g = 0; g < opt_first->groups().size(); ++g) {
    EXPECT_EQ(opt_second->groups()[g].lr_scale, opt_first->groups()[g].lr_scale) << what;
    EXPECT_EQ(opt_second->groups()[g].weight_decay, opt_first->groups()[g].weight_decay) << what;
  }
  EXPECT_EQ(opt_second->group_of(), opt_first->group_of()) << what;
  EXPECT_EQ(opt_second->steps(), 3) << what;
  EXPECT_EQ(opt_second->lr(), opt_first->lr()) << what;
  train(second, *opt_second, 3, 6);
  EXPECT_EQ(values(second), values(whole)) << what << ": the resumed run differs from the uninterrupted one";
}

TEST(Optimizers, ResumeEqualsUninterrupted) {
  auto schedule = std::make_shared<optim::WarmupCosine>(0.05, 2, 6, 0.005);
  check_resume(
      [&](Net& n) {
        auto o = std::make_unique<optim::RMSProp>(optim::decay_groups(n, 0.01), optim::RmsPropOptions{.lr = 0.05});
        o->set_schedule(schedule);
        return o;
      },
      "rmsprop, decay groups, warm-up cosine");
  check_resume(
      [&](Net& n) {
        auto o = std::make_unique<optim::AdaGrad>(n.parameters(), optim::AdagradOptions{.lr = 0.1, .lr_decay = 0.2});
        o->set_param_groups({{{n.head->weight, n.head->bias}, 0.5, 0.02}});
        o->set_schedule(std::make_shared<optim::ExponentialDecay>(0.1, 2, 0.7));
        return o;
      },
      "adagrad, a head group, exponential decay");
  check_resume(
      [&](Net& n) {
        return std::make_unique<optim::Adam>(optim::decay_groups(n, 0.1),
                                             optim::AdamOptions{.lr = 0.01, .decoupled = true});
      },
      "adamw, decay groups");
  check_resume(
      [&](Net& n) {
        auto o = std::make_unique<optim::Adam>(optim::decay_groups(n, 0.1),
                                               optim::AdamOptions{.lr = 0.01, .decoupled = true});
        o->keep_master_weights(DType::bf16);
        return o;
      },
      "adamw, master weights");
}

// Master weights: the parameter holds the bf16 rounding of an f32 master that takes every update. Steps of
// 2^-12 to a weight of 1 (below bf16's half unit there, 2^-8) add up in the master and move the parameter
// once they pass it; the master is optimizer state ("master"), made at the parameter's first step, which a
// recording would make again at every replay (master_weights_blocker).
TEST(Optimizers, MasterWeightsAddUpUpdatesTheParametersCannotHold) {
  Tensor p = Tensor::from_vector<float>({1.0f + 0.0009765625f, 3.0f}, {2});  // 1 + 2^-10 is no bf16 value
  p.requires_grad_();
  optim::SGD sgd({p}, optim::SgdOptions{.lr = 1.0});
  sgd.keep_master_weights(DType::bf16);
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{1.0f, 3.0f})) << "the parameter is rounded at once";
  EXPECT_EQ(sgd.all_state_lists().back().kind, "master");
  p.set_grad(Tensor::from_vector<float>({-0.000244140625f, 0.0f}, {2}));  // -2^-12: p += 2^-12 a step
  EXPECT_NE(sgd.master_weights_blocker(), "") << "the first step makes the master";
  for (int s = 1; s <= 24; ++s) {
    sgd.step();
    EXPECT_EQ(sgd.master_weights_blocker(), "");
    const float master = (*sgd.all_state_lists().back().tensors)[0].to_vector<float>()[0];
    EXPECT_EQ(master, 1.0f + static_cast<float>(s) * 0.000244140625f) << "step " << s;
    // bf16 holds 1 and 1 + 2^-7 here: the master's rounding (a tie, at 1 + 2^-8, goes to the even 1).
    EXPECT_EQ(p.to_vector<float>()[0], s * 0.000244140625 > 0.00390625 ? 1.0078125f : 1.0f) << "step " << s;
  }
  // Without masters the same updates, each rounded away, leave the parameter where it started.
  Tensor q = Tensor::from_vector<float>({1.0f}, {1});
  q.requires_grad_();
  optim::SGD plain({q}, optim::SgdOptions{.lr = 1.0});
  for (int s = 0; s < 24; ++s) {
    q.set_grad(Tensor::from_vector<float>({-0.000244140625f}, {1}));
    plain.step();
    q.detach().copy_(q.detach().to(DType::bf16));
  }
  EXPECT_EQ(q.to_vector<float>()[0], 1.0f);
  // f32 stops keeping masters; other types are refused.
  sgd.keep_master_weights(DType::f32);
  EXPECT_EQ(sgd.all_state_lists().size(), sgd.state_lists().size());
  EXPECT_THROW(sgd.keep_master_weights(DType::i64), std::exception);
}

TEST(Optimizers, DistOptStepsLikeItsOptimizer) {
  // A one-rank DistOpt wrapping a grouped, scheduled RMSProp takes the steps the optimizer takes alone.
  auto make = [](Net& n) {
    auto o = std::make_shared<optim::RMSProp>(optim::decay_groups(n, 0.05), optim::RmsPropOptions{.lr = 0.02});
    o->set_schedule(std::make_shared<optim::WarmupCosine>(0.02, 2, 5));
    return o;
  };
  Net alone(4), wrapped(4);
  auto opt_alone = make(alone);
  train(alone, *opt_alone, 0, 4);
  auto opt_inner = make(wrapped);
  dist::DistOpt dopt(opt_inner, dist::make_single_communicator());
  dopt.sync_parameters(wrapped);
  for (int s = 0; s < 4; ++s) dopt.step(softmax_cross_entropy(wrapped.forward(batch_tokens(s)), batch_labels(s)));
  EXPECT_EQ(values(wrapped), values(alone));
  EXPECT_EQ(opt_inner->steps(), 4);
  EXPECT_EQ(opt_inner->lr(), opt_alone->lr());
}

TEST(Optimizers, ClippingInTheUpdateStepsAsClippingFirst) {
  // clip_grad_norm_in_update leaves the coefficient to Adam's step (read as it reads the gradients) and
  // scales SGD's gradients itself: the parameters are those of clip_grad_norm's runs, bit for bit.
  for (const char* kind : {"adamw", "sgd"}) {
    auto make = [&](Net& n) -> std::shared_ptr<optim::Optimizer> {
      if (std::string(kind) == "sgd")
        return std::make_shared<optim::SGD>(n.parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
      return std::make_shared<optim::Adam>(optim::decay_groups(n, 0.1),
                                           optim::AdamOptions{.lr = 0.01, .beta2 = 0.95, .decoupled = true});
    };
    Net first(4), folded(4);
    auto o1 = make(first), o2 = make(folded);
    dist::DistOpt d1(o1, dist::make_single_communicator()), d2(o2, dist::make_single_communicator());
    d1.sync_parameters(first);
    d2.sync_parameters(folded);
    for (int s = 0; s < 5; ++s) {
      d1.backward_and_sync(softmax_cross_entropy(first.forward(batch_tokens(s)), batch_labels(s)));
      d2.backward_and_sync(softmax_cross_entropy(folded.forward(batch_tokens(s)), batch_labels(s)));
      const float n1 = d1.clip_grad_norm(0.05).item<float>(), n2 = d2.clip_grad_norm_in_update(0.05).item<float>();
      EXPECT_EQ(n1, n2);
      EXPECT_GT(n1, 0.05f) << "the bound should clip";
      d1.update();
      d2.update();
      EXPECT_FALSE(o2->gradient_factor().defined()) << "the factor outlived its step";
    }
    EXPECT_EQ(values(folded), values(first)) << kind;
  }
}

}  // namespace
}  // namespace tandem
