// Finite-difference gradient checks of embedding and the recurrent networks, their errors, and their
// empty and size-1 cases.
#include <functional>
#include <string>

#include "gradcheck.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;

// Every output of an rnn as one tensor, so that one weighting covers y, hy and cy.
Tensor joined(const RnnResult& r) {
  std::vector<Tensor> parts{reshape(r.y, {r.y.numel()}), reshape(r.hy, {r.hy.numel()})};
  if (r.cy.defined()) parts.push_back(reshape(r.cy, {r.cy.numel()}));
  return concat(parts, 0);
}

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one mentioning '" << *fragments.begin() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
    for (const char* frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << "'" << frag << "' missing from: " << e.what();
  }
}

TEST(GradCheckRnn, EmbeddingAddsDuplicateIndices) {
  Generator gen(31);
  Tensor w = leaf({5, 3}, gen);
  for (DType it : {DType::i32, DType::i64}) {
    Tensor idx = Tensor::from_vector<int64_t>({0, 2, 2, 4, 0, 2}, {2, 3}).to(it);
    EXPECT_TRUE(gradcheck([&](const Ts& t) { return embedding(t[0], idx); }, {w})) << dtype_name(it);
  }
  // The gradient of a row picked k times is k times the output gradient's row.
  w.set_grad(Tensor());
  Tensor idx = Tensor::from_vector<int32_t>({1, 1, 1, 3}, {4});
  Tensor y = embedding(w, idx);
  backward(sum(y));
  std::vector<double> g = w.grad().to_vector<double>();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(g[0 * 3 + c], 0.0);
    EXPECT_EQ(g[1 * 3 + c], 3.0);
    EXPECT_EQ(g[3 * 3 + c], 1.0);
  }
}

TEST(GradCheckRnn, EmbeddingOfManyDimensions) {
  Generator gen(32);
  Tensor w = leaf({7, 2}, gen);
  Tensor idx = Tensor::from_vector<int64_t>({6, 0, 3, 3, 1, 6, 2, 0}, {2, 2, 2});
  Tensor y = embedding(w, idx);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2, 2}));
  EXPECT_TRUE(gradcheck([&](const Ts& t) { return embedding(t[0], idx); }, {w}));
  // Strided indices and weight are read as their logical values, and the strided weight gets its gradient.
  Tensor idx_t = Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);
  Tensor base = Tensor::uniform({2, 7}, -1, 1, gen, DType::f64);
  Tensor wt = base.transpose(0, 1);
  wt.requires_grad_();
  Tensor dense_w = base.transpose(0, 1).contiguous();
  dense_w.requires_grad_();
  Tensor dy = Tensor::uniform({3, 2, 2}, -1, 1, gen, DType::f64);
  Tensor y_strided = embedding(wt, idx_t), y_dense = embedding(dense_w, idx_t.contiguous());
  EXPECT_EQ(y_strided.to_vector<double>(), y_dense.to_vector<double>());
  backward(y_strided, {}, dy);
  backward(y_dense, {}, dy);
  EXPECT_EQ(wt.grad().to_vector<double>(), dense_w.grad().to_vector<double>());
}

TEST(GradCheckRnn, EmbeddingEmptyAndErrors) {
  Generator gen(33);
  Tensor w = leaf({4, 3}, gen);
  Tensor y = embedding(w, Tensor::zeros({0, 2}, DType::i64));
  EXPECT_EQ(y.shape(), (Shape{0, 2, 3}));
  backward(sum(y));
  for (double v : w.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
  expect_error([&] { embedding(w, Tensor::from_vector<int64_t>({0, 4}, {2})); },
               {"embedding", "index 4", "position 1", "[0, 4)"});
  expect_error([&] { embedding(w, Tensor::from_vector<int32_t>({-1}, {1})); }, {"embedding", "index -1"});
  expect_error([&] { embedding(w, Tensor::zeros({2}, DType::f32)); }, {"embedding", "i32 or i64", "f32[2]"});
  expect_error([&] { embedding(Tensor::zeros({4}), Tensor::zeros({2}, DType::i64)); },
               {"embedding", "weight", "2 dimensions"});
}

struct RnnCase {
  RnnMode mode;
  int64_t T, N, I, H, layers;
  bool bidirectional, batch_first, bias, with_states;
};

std::string describe(const RnnCase& c) {
  static const char* names[] = {"tanh", "relu", "lstm", "gru"};
  return std::string(names[static_cast<int>(c.mode)]) + " T" + std::to_string(c.T) + " N" + std::to_string(c.N) +
         " L" + std::to_string(c.layers) + (c.bidirectional ? " bidirectional" : "") +
         (c.batch_first ? " batch_first" : "") + (c.bias ? "" : " no bias") + (c.with_states ? " states" : "");
}

void check_rnn(const RnnCase& c, uint64_t seed) {
  Generator gen(seed);
  RnnOptions o;
  o.mode = c.mode;
  o.hidden_size = c.H;
  o.num_layers = c.layers;
  o.bidirectional = c.bidirectional;
  o.batch_first = c.batch_first;
  o.bias = c.bias;
  const int64_t D = c.bidirectional ? 2 : 1;
  Tensor x = leaf(c.batch_first ? Shape{c.N, c.T, c.I} : Shape{c.T, c.N, c.I}, gen);
  Tensor w = leaf({rnn_weight_size(c.mode, c.I, c.H, c.layers, c.bidirectional, c.bias)}, gen, -0.7, 0.7);
  Ts inputs{x, w};
  if (c.with_states) {
    inputs.push_back(leaf({c.layers * D, c.N, c.H}, gen));
    if (c.mode == RnnMode::Lstm) inputs.push_back(leaf({c.layers * D, c.N, c.H}, gen));
  }
  const bool lstm = c.mode == RnnMode::Lstm;
  auto f = [o, lstm, n = inputs.size()](const Ts& t) {
    Tensor hx = n > 2 ? t[2] : Tensor(), cx = n > 3 && lstm ? t[3] : Tensor();
    return joined(rnn(t[0], t[1], hx, cx, o));
  };
  GradCheckOptions opt;
  opt.rtol = 1e-5;
  opt.atol = 1e-7;
  EXPECT_TRUE(gradcheck(f, inputs, opt)) << describe(c);
}

TEST(GradCheckRnn, ElmanRnn) {
  check_rnn({RnnMode::RnnTanh, 3, 2, 3, 2, 2, true, false, true, true}, 41);
  check_rnn({RnnMode::RnnRelu, 4, 2, 2, 3, 1, false, true, true, false}, 42);
}

TEST(GradCheckRnn, Lstm) {
  check_rnn({RnnMode::Lstm, 3, 2, 2, 2, 2, true, false, true, true}, 43);
  check_rnn({RnnMode::Lstm, 2, 3, 3, 2, 1, false, true, false, true}, 44);
  check_rnn({RnnMode::Lstm, 1, 1, 1, 1, 1, false, false, true, false}, 45);  // size-1 axes
}

TEST(GradCheckRnn, Gru) {
  check_rnn({RnnMode::Gru, 3, 2, 2, 3, 2, false, false, true, true}, 46);
  check_rnn({RnnMode::Gru, 2, 2, 3, 2, 1, true, true, true, true}, 47);
}

TEST(GradCheckRnn, NonContiguousInputAndStates) {
  // Strided x and hx give the values and gradients of their contiguous copies.
  Generator gen(48);
  RnnOptions o;
  o.mode = RnnMode::Lstm;
  o.hidden_size = 2;
  Tensor xb = Tensor::uniform({2, 3, 2}, -1, 1, gen, DType::f64), hb = Tensor::uniform({2, 1, 2}, -1, 1, gen, DType::f64);
  Tensor w = Tensor::uniform({rnn_weight_size(RnnMode::Lstm, 2, 2, 1, false)}, -0.7, 0.7, gen, DType::f64);
  Tensor dy = Tensor::uniform({3, 2, 2}, -1, 1, gen, DType::f64);
  std::vector<Tensor> grads[2];
  std::vector<double> ys[2];
  for (int dense = 0; dense < 2; ++dense) {
    Tensor x = dense ? xb.transpose(0, 1).contiguous() : xb.transpose(0, 1);
    Tensor h = dense ? hb.transpose(0, 1).contiguous() : hb.transpose(0, 1);
    x.requires_grad_();
    h.requires_grad_();
    EXPECT_EQ(x.is_contiguous(), dense == 1);
    RnnResult r = rnn(x, w, h, Tensor(), o);
    ys[dense] = r.y.to_vector<double>();
    backward(r.y, {}, dy);
    grads[dense] = {x.grad(), h.grad()};
  }
  EXPECT_EQ(ys[0], ys[1]);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(grads[0][i].to_vector<double>(), grads[1][i].to_vector<double>()) << i;
}

TEST(GradCheckRnn, DropoutBetweenLayers) {
  // The same generator state gives the same masks: the network is then a fixed function of its inputs.
  Generator gen(49);
  RnnOptions o;
  o.mode = RnnMode::Gru;
  o.hidden_size = 3;
  o.num_layers = 2;
  o.dropout = 0.4;
  Tensor x = leaf({3, 2, 2}, gen);
  Tensor w = leaf({rnn_weight_size(RnnMode::Gru, 2, 3, 2, false)}, gen, -0.7, 0.7);
  auto f = [o](const Ts& t) {
    Generator masks(5);
    return joined(rnn(t[0], t[1], Tensor(), Tensor(), o, &masks));
  };
  GradCheckOptions opt;
  opt.rtol = 1e-5;
  opt.atol = 1e-7;
  EXPECT_TRUE(gradcheck(f, {x, w}, opt));
  // Dropout changes the output in training and not in evaluation.
  Generator g1(5);
  Tensor y_train = rnn(x.detach(), w.detach(), Tensor(), Tensor(), o, &g1).y;
  RnnOptions eval = o;
  eval.training = false;
  Tensor y_eval = rnn(x.detach(), w.detach(), Tensor(), Tensor(), eval, nullptr).y;
  RnnOptions plain = o;
  plain.dropout = 0.0;
  Tensor y_plain = rnn(x.detach(), w.detach(), Tensor(), Tensor(), plain).y;
  EXPECT_EQ(y_eval.to_vector<double>(), y_plain.to_vector<double>());
  EXPECT_NE(y_train.to_vector<double>(), y_plain.to_vector<double>());
}

TEST(GradCheckRnn, EmptySequenceAndBatch) {
  Generator gen(50);
  RnnOptions o;
  o.mode = RnnMode::Lstm;
  o.hidden_size = 3;
  o.num_layers = 2;
  Tensor w = leaf({rnn_weight_size(RnnMode::Lstm, 2, 3, 2, false)}, gen);
  Tensor h = leaf({2, 4, 3}, gen), c = leaf({2, 4, 3}, gen);
  RnnResult r = rnn(Tensor::zeros({0, 4, 2}, DType::f64), w, h, c, o);
  EXPECT_EQ(r.y.shape(), (Shape{0, 4, 3}));
  EXPECT_EQ(r.hy.to_vector<double>(), h.to_vector<double>());  // no step: the states pass through
  EXPECT_EQ(r.cy.to_vector<double>(), c.to_vector<double>());
  RnnResult e = rnn(Tensor::zeros({5, 0, 2}, DType::f64), w, Tensor(), Tensor(), o);
  EXPECT_EQ(e.y.shape(), (Shape{5, 0, 3}));
  EXPECT_EQ(e.hy.shape(), (Shape{2, 0, 3}));
  EXPECT_EQ(e.cy.shape(), (Shape{2, 0, 3}));
}

TEST(GradCheckRnn, Errors) {
  RnnOptions o;
  o.mode = RnnMode::Lstm;
  o.hidden_size = 3;
  o.num_layers = 2;
  o.bidirectional = true;
  Tensor x = Tensor::zeros({4, 2, 5});
  const int64_t size = rnn_weight_size(RnnMode::Lstm, 5, 3, 2, true);
  Tensor w = Tensor::zeros({size});
  expect_error([&] { rnn(x, Tensor::zeros({size - 1}), Tensor(), Tensor(), o); },
               {"rnn", "weight", std::to_string(size - 1).c_str(), "an LSTM of input size 5, hidden size 3, 2 layer(s), "
                                                                   "bidirectional needs"});
  expect_error([&] { rnn(Tensor::zeros({4, 5}), w, Tensor(), Tensor(), o); }, {"rnn", "input", "3 dimensions"});
  expect_error([&] { rnn(x, w, Tensor::zeros({2, 2, 3}), Tensor(), o); },
               {"rnn", "hidden state", "[2, 2, 3]", "[4, 2, 3]"});
  expect_error([&] { rnn(x, w, Tensor(), Tensor::zeros({4, 3, 3}), o); }, {"rnn", "cell state", "[4, 2, 3]"});
  expect_error([&] { rnn(x, Tensor::zeros({size}, DType::f64), Tensor(), Tensor(), o); }, {"rnn", "dtype"});
  expect_error([&] { rnn(x, Tensor::zeros({2, size / 2}), Tensor(), Tensor(), o); }, {"rnn", "flat"});
  RnnOptions gru = o;
  gru.mode = RnnMode::Gru;
  Tensor wg = Tensor::zeros({rnn_weight_size(RnnMode::Gru, 5, 3, 2, true)});
  expect_error([&] { rnn(x, wg, Tensor(), Tensor::zeros({4, 2, 3}), gru); }, {"rnn", "cell state", "a GRU"});
  RnnOptions drop = o;
  drop.dropout = 0.5;
  expect_error([&] { rnn(x, w, Tensor(), Tensor(), drop); }, {"rnn", "dropout", "generator"});
  drop.dropout = 1.0;
  expect_error([&] { rnn(x, w, Tensor(), Tensor(), drop); }, {"rnn", "dropout", "[0, 1)"});
  RnnOptions none = o;
  none.hidden_size = 0;
  expect_error([&] { rnn(x, w, Tensor(), Tensor(), none); }, {"rnn", "hidden_size"});
}

}  // namespace
}  // namespace tandem::testing
