// The backward engine: accumulation, shared inputs, grad-ready hooks, grad mode and graph lifetime.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "autograd/column_sums.h"
#include "autograd/retain_graph.h"
#include "tandem/autograd.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

Tensor leaf(const std::vector<double>& v) {
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  t.requires_grad_();
  return t;
}

void expect_values(const Tensor& t, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_TRUE(t.defined());
  auto got = t.to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(Autograd, GradientsAccumulateAcrossBackwardPasses) {
  Tensor x = leaf({1.0, -2.0, 0.5});
  backward(sum(mul(x, x)));  // 2x
  expect_values(x.grad(), {2.0, -4.0, 1.0});
  backward(sum(scale(x, 3.0)));  // + 3
  expect_values(x.grad(), {5.0, -1.0, 4.0});
  x.set_grad(Tensor());
  backward(sum(x));
  expect_values(x.grad(), {1.0, 1.0, 1.0});
}

TEST(Autograd, TensorUsedTwice) {
  Tensor x = leaf({3.0, -1.0});
  backward(sum(add(x, x)));
  expect_values(x.grad(), {2.0, 2.0});
  x.set_grad(Tensor());
  backward(sum(mul(x, x)));
  expect_values(x.grad(), {6.0, -2.0});
  // Used at two depths of the graph: once directly, once through a chain.
  x.set_grad(Tensor());
  backward(sum(add(x, tanh(scale(x, 2.0)))));
  expect_values(x.grad(), {1 + 2 * (1 - std::pow(std::tanh(6.0), 2)), 1 + 2 * (1 - std::pow(std::tanh(-2.0), 2))});
}

TEST(Autograd, AGradientOwnedByTheLeafIsNotSharedWithAnother) {
  // add's backward hands the same gradient tensor to both inputs: accumulating into one leaf later
  // must not change the other.
  Tensor a = leaf({1.0, 2.0}), b = leaf({3.0, 4.0});
  backward(sum(add(a, b)));
  EXPECT_FALSE(a.grad().shares_storage(b.grad()));
  backward(sum(scale(a, 5.0)));
  expect_values(a.grad(), {6.0, 6.0});
  expect_values(b.grad(), {1.0, 1.0});
}

// A leaf whose gradient buffer is marked as holding zeros gets the gradient written into that buffer:
// an op may fill the engine's destination directly; otherwise the gradient is copied over the zeros.
// The next pass (no longer zeroed) adds as usual, and a leaf fed by two ops is offered no destination.
TEST(Autograd, ZeroedGradientBuffersTakeTheGradientInPlace) {
  Tensor w = leaf({1.0, 2.0, 3.0});
  Tensor buf = Tensor::zeros({3}, DType::f64);
  const void* where = buf.data_ptr();
  w.set_grad(buf, /*zeroed=*/true);
  bool offered = false;
  auto triple = [&](const Tensor& x) {
    Tensor out = x.detach().clone();
    return record_op(out, {x}, "triple_grad", [&](const Tensor& g) {
      Tensor d = grad_destination(0);
      offered = d.defined();
      if (!offered) return std::vector<Tensor>{scale(g, 3.0)};
      d.copy_(scale(g, 3.0));
      return std::vector<Tensor>{d};
    });
  };
  backward(sum(triple(w)));
  EXPECT_TRUE(offered);
  EXPECT_EQ(w.grad().data_ptr(), where);
  expect_values(w.grad(), {3.0, 3.0, 3.0});
  backward(sum(triple(w)));  // the buffer now holds a gradient: no destination, the engine adds
  EXPECT_FALSE(offered);
  expect_values(w.grad(), {6.0, 6.0, 6.0});
  // Used by two ops: neither may overwrite the buffer.
  w.set_grad(buf.zero_(), true);
  backward(sum(add(triple(w), scale(w, 2.0))));
  EXPECT_FALSE(offered);
  expect_values(w.grad(), {5.0, 5.0, 5.0});
  EXPECT_EQ(w.grad().data_ptr(), where);
  // Ops that do not take the destination: the gradient is copied over the zeros, then added.
  w.set_grad(buf.zero_(), true);
  backward(sum(mul(w, w)));
  expect_values(w.grad(), {2.0, 4.0, 6.0});
  backward(sum(w));
  expect_values(w.grad(), {3.0, 5.0, 7.0});
  EXPECT_EQ(w.grad().data_ptr(), where);
}

// linear and conv2d write weight and bias gradients straight into zeroed buffers, with the values of
// a fresh backward pass.
TEST(Autograd, LayersWriteParameterGradientsIntoZeroedBuffers) {
  Generator gen(7);
  Tensor x = Tensor::uniform({4, 2, 6, 6}, -1.0, 1.0, gen);
  Tensor cw = Tensor::uniform({3, 2, 3, 3}, -1.0, 1.0, gen).requires_grad_();
  Tensor cb = Tensor::uniform({3}, -1.0, 1.0, gen).requires_grad_();
  Tensor lw = Tensor::uniform({5, 12}, -1.0, 1.0, gen).requires_grad_();
  Tensor lb = Tensor::uniform({5}, -1.0, 1.0, gen).requires_grad_();
  auto loss = [&] {
    Conv2dOptions fused;
    fused.relu = true;
    Tensor h = max_pool2d(conv2d(x, cw, cb, fused));
    Tensor y = linear(reshape(h, {4, 12}), lw, lb, /*relu=*/false);
    return sum(mul(y, y));
  };
  backward(loss());
  std::vector<Tensor> params{cw, cb, lw, lb}, want, bufs;
  for (Tensor& p : params) {
    ASSERT_TRUE(p.grad().defined()) << p.str();
    want.push_back(p.grad().clone());
    bufs.push_back(Tensor::zeros(p.shape()));
    p.set_grad(bufs.back(), /*zeroed=*/true);
  }
  backward(loss());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].grad().data_ptr(), bufs[i].data_ptr()) << "parameter " << i;
    expect_values(params[i].grad(), want[i].to_vector<double>(), 1e-9);
  }
}

// When one op's gradient for a tensor has arrived and nothing else holds it, the next op that reads
// the tensor may add its share into it; an op that does not is added by the engine as before.
TEST(Autograd, AGradientBegunByOneOpTakesTheNextShareInPlace) {
  Tensor w = leaf({1.0, 2.0});
  Tensor h = scale(w, 1.0);  // an intermediate read by two ops below
  int offered = 0;
  auto doubling = [&](const Tensor& x) {
    return record_op(x.detach().clone(), {x}, "double_grad", [&](const Tensor& g) {
      Tensor acc = grad_add_target(0);
      if (!acc.defined()) return std::vector<Tensor>{scale(g, 2.0)};
      ++offered;
      acc.copy_(add(acc, scale(g, 2.0)));
      return std::vector<Tensor>{acc};
    });
  };
  // The later op's backward runs first and begins h's gradient; the earlier one adds into it.
  Tensor first = doubling(h);
  Tensor second = scale(h, 3.0);
  backward(sum(add(first, second)));
  EXPECT_EQ(offered, 1);
  expect_values(w.grad(), {5.0, 5.0});
  // add's backward hands one tensor to both its inputs: shared, so never offered.
  w.set_grad(Tensor());
  offered = 0;
  Tensor h2 = scale(w, 1.0);
  backward(sum(doubling(add(h2, h2))));
  EXPECT_EQ(offered, 0);
  expect_values(w.grad(), {4.0, 4.0});
}

// A table read by an embedding and by a tied output layer: whichever op's backward runs second adds its
// share into the gradient the first began (the embedding's rows added in place); the values are the sum of
// both shares, taken here by hand in f64.
TEST(Autograd, TiedEmbeddingAndOutputLayerSumTheirGradients) {
  const int64_t v = 5, d = 3, n = 4;
  Generator gen(21);
  const Tensor w0 = Tensor::uniform({v, d}, -1.0, 1.0, gen, DType::f64);
  const Tensor x = Tensor::uniform({n, d}, -1.0, 1.0, gen, DType::f64);
  const Tensor r = Tensor::uniform({n, v}, -1.0, 1.0, gen, DType::f64);
  const Tensor s = Tensor::uniform({n, d}, -1.0, 1.0, gen, DType::f64);
  const std::vector<int64_t> ids = {3, 0, 3, 4};
  const Tensor idx = Tensor::from_vector(ids, {n});
  // d/dw of sum(x w^T * r) is r^T x; of sum(w[ids] * s) the rows of s added at their ids.
  const std::vector<double> xv = x.to_vector<double>(), rv = r.to_vector<double>(), sv = s.to_vector<double>();
  std::vector<double> expected(v * d, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < d; ++k) {
      for (int64_t j = 0; j < v; ++j) expected[j * d + k] += rv[i * v + j] * xv[i * d + k];
      expected[ids[i] * d + k] += sv[i * d + k];
    }
  // The op recorded last runs its backward first: the embedding (as in a GPT) or the output layer.
  for (DType dt : {DType::f32, DType::f64})
    for (bool head_last : {true, false}) {
      Tensor w = w0.to(dt).clone().requires_grad_();
      auto head = [&] { return sum(mul(linear(x.to(dt), w, Tensor()), r.to(dt))); };
      auto table = [&] { return sum(mul(embedding(w, idx), s.to(dt))); };
      Tensor first = head_last ? table() : head();
      Tensor second = head_last ? head() : table();
      backward(add(first, second));
      const std::vector<double> got = w.grad().to_vector<double>();
      ASSERT_EQ(got.size(), expected.size());
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_NEAR(got[k], expected[k], dt == DType::f32 ? 1e-5 : 1e-12) << dtype_name(dt) << " " << k;
    }
}

// A convolution whose input also feeds a residual connection adds its input gradient into the one
// the connection brought, with the values of separate gradients added.
TEST(Autograd, ConvolutionAddsIntoAResidualGradient) {
  Generator gen(9);
  Tensor x0 = Tensor::uniform({2, 3, 5, 5}, -1.0, 1.0, gen).requires_grad_();
  Tensor w = Tensor::uniform({3, 3, 3, 3}, -1.0, 1.0, gen).requires_grad_();
  Conv2dOptions same;
  same.padding = {1, 1};
  auto loss = [&](bool residual) {
    Tensor h = scale(x0, 1.5);
    Tensor y = conv2d(h, w, Tensor(), same);
    Tensor out = residual ? add(mul(y, y), h) : mul(y, y);
    return sum(mul(out, out));
  };
  backward(loss(true));
  Tensor got = x0.grad().clone();
  // The same gradient by hand: the residual path's share computed apart, then added.
  x0.set_grad(Tensor());
  Tensor h = scale(x0.detach(), 1.5).requires_grad_();
  Tensor y = conv2d(h, w.detach(), Tensor(), same);
  Tensor out = add(mul(y, y), h.detach());
  backward(sum(mul(out, out)));  // the conv path
  Tensor want = add(scale(h.grad(), 1.5), scale(scale(out.detach(), 2.0), 1.5));
  const std::vector<double> g = got.to_vector<double>(), wv = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], wv[i], 1e-5 * std::fabs(wv[i]) + 1e-6) << i;
}

TEST(Autograd, GradReadyHookFiresOncePerLeafWithItsFinalGradient) {
  // loss = sum(tanh(a * b) * a + b): a and b are each used at two depths.
  const std::vector<double> av{0.3, -1.2, 0.8}, bv{1.5, 0.4, -0.7};
  Tensor a = leaf(av), b = leaf(bv), unused = leaf({1.0});
  Tensor loss = sum(add(mul(tanh(mul(a, b)), a), b));
  std::vector<double> da(3), db(3);
  for (int i = 0; i < 3; ++i) {
    const double t = std::tanh(av[i] * bv[i]);
    da[i] = (1 - t * t) * bv[i] * av[i] + t;
    db[i] = (1 - t * t) * av[i] * av[i] + 1;
  }
  std::map<TensorImpl*, int> calls;
  backward(loss, [&](const Tensor& l) {
    calls[l.impl()]++;
    // The gradient must already be final when the hook runs.
    if (l.is_same(a)) expect_values(l.grad(), da);
    else if (l.is_same(b)) expect_values(l.grad(), db);
    else ADD_FAILURE() << "hook called for a tensor that is not a leaf of the loss";
  });
  EXPECT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[a.impl()], 1);
  EXPECT_EQ(calls[b.impl()], 1);
  EXPECT_EQ(calls.count(unused.impl()), 0u);
  expect_values(a.grad(), da);
  expect_values(b.grad(), db);
}

TEST(Autograd, HookOrderFollowsReadiness) {
  // The last layer's parameter is final long before the first one's: its hook comes first.
  Tensor w1 = leaf({0.5, -0.5}), w2 = leaf({2.0, 1.0}), x = Tensor::from_vector<double>({1.0, 2.0}, {2});
  Tensor loss = sum(mul(tanh(mul(x, w1)), w2));
  std::vector<TensorImpl*> order;
  backward(loss, [&](const Tensor& l) { order.push_back(l.impl()); });
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], w2.impl());
  EXPECT_EQ(order[1], w1.impl());
}

TEST(Autograd, LeavesUnusedByTheLossKeepNoGradient) {
  Tensor used = leaf({1.0, 2.0}), unused = leaf({3.0, 4.0});
  Tensor other = mul(unused, unused);  // a graph of its own, never back-propagated
  backward(sum(used));
  EXPECT_TRUE(used.grad().defined());
  EXPECT_FALSE(unused.grad().defined());
  EXPECT_TRUE(other.requires_grad());
}

TEST(Autograd, NoGradGuard) {
  Tensor x = leaf({1.0, 2.0});
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    Tensor y = mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_FALSE(y.grad_fn());
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the inner guard restores the outer state, not "enabled"
    EXPECT_THROW(backward(sum(y)), Error);
  }
  EXPECT_TRUE(grad_enabled());
  Tensor z = mul(x, x);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_TRUE(z.grad_fn());
}

TEST(Autograd, BackwardTwiceThroughAFreedGraphIsAnError) {
  Tensor x = leaf({1.0, 2.0});
  Tensor loss = sum(mul(x, x));
  backward(loss);
  try {
    backward(loss);
    FAIL() << "second backward through a freed graph did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(Autograd, ARetainedGraphTakesBackwardAgain) {
  Tensor x = leaf({1.0, -2.0, 3.0});
  Tensor w = leaf({0.5, 0.25, 2.0});
  Tensor loss = sum(mul(mul(x, w), x));  // sum(w x^2): d/dx = 2 w x, d/dw = x^2
  {
    RetainGraphGuard keep;
    EXPECT_TRUE(retaining_graph());
    backward(loss);
  }
  EXPECT_FALSE(retaining_graph());
  expect_values(x.grad(), {1.0, -1.0, 12.0});
  expect_values(w.grad(), {1.0, 4.0, 9.0});
  x.set_grad(Tensor());
  w.set_grad(Tensor());
  backward(loss);  // over the kept graph, which this pass frees
  expect_values(x.grad(), {1.0, -1.0, 12.0});
  expect_values(w.grad(), {1.0, 4.0, 9.0});
  EXPECT_THROW(backward(loss), Error);
}

TEST(Autograd, RetainGraphGuardsNest) {
  {
    RetainGraphGuard outer;
    {
      RetainGraphGuard inner;
      EXPECT_TRUE(retaining_graph());
    }
    EXPECT_TRUE(retaining_graph());
  }
  EXPECT_FALSE(retaining_graph());
}

TEST(Autograd, LossWithoutGradientIsAnError) {
  Tensor c = Tensor::from_vector<double>({1.0, 2.0}, {2});
  try {
    backward(sum(mul(c, c)));
    FAIL() << "backward of a constant did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find("does not depend on any tensor that requires a gradient"), std::string::npos);
  }
  EXPECT_THROW(backward(Tensor()), Error);
}

TEST(Autograd, NonScalarLossNeedsGradOutput) {
  Tensor x = leaf({1.0, 2.0, 3.0});
  Tensor y = mul(x, x);
  EXPECT_THROW(backward(y), Error);
  Tensor y2 = mul(x, x);
  EXPECT_THROW(backward(y2, {}, Tensor::ones({2}, DType::f64)), Error);
  Tensor y3 = mul(x, x);
  backward(y3, {}, Tensor::from_vector<double>({1.0, 0.0, -1.0}, {3}));
  expect_values(x.grad(), {2.0, 0.0, -6.0});
}

TEST(Autograd, RequiresGradOnlyForFloatingLeaves) {
  Tensor i = Tensor::zeros({2}, DType::i32);
  EXPECT_THROW(i.requires_grad_(), Error);
  Tensor x = leaf({1.0});
  Tensor y = scale(x, 2.0);
  EXPECT_FALSE(y.is_leaf());
  EXPECT_THROW(y.requires_grad_(), Error);
}

TEST(Autograd, GradientFlowsIntoFloat32Leaves) {
  Tensor x = Tensor::from_vector<float>({1.f, 2.f}, {2});
  x.requires_grad_();
  backward(sum(mul(x, x)));
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2.f, 4.f}));
}

// Layer norm's backward hands on the column sums of the gradient it writes (f32 on the CPU): an op reading
// that gradient unchanged finds them, equal to the sums of its values; once the engine or an op has added
// another share into the gradient, or in a later backward pass, it finds none.
TEST(Autograd, LayerNormHandsOnTheColumnSumsOfTheGradientItWrites) {
  Generator gen(5);
  const int64_t rows = 6, cols = 8;
  Tensor x = Tensor::uniform({rows, cols}, -1.0, 1.0, gen, DType::f32).requires_grad_();
  Tensor w = Tensor::uniform({cols}, 0.5, 1.5, gen, DType::f32).requires_grad_();
  Tensor b = Tensor::uniform({cols}, -0.5, 0.5, gen, DType::f32).requires_grad_();
  Tensor r = Tensor::uniform({rows, cols}, -1.0, 1.0, gen, DType::f32);
  // Identity whose backward records what column_sums_of finds for its output's gradient.
  Tensor seen;
  int probed = 0;
  auto probe = [&](const Tensor& t) {
    return record_op(t.detach().clone(), {t}, "probe", [&](const Tensor& g) {
      ++probed;
      seen = column_sums_of(g, cols);
      if (seen.defined()) seen = seen.clone();
      return std::vector<Tensor>{g};
    });
  };
  auto expect_sums_of = [&](const Tensor& g, const std::string& what) {
    ASSERT_TRUE(seen.defined()) << what;
    const std::vector<double> v = g.to_vector<double>(), got = seen.to_vector<double>();
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0.0;
      for (int64_t i = 0; i < rows; ++i) want += v[i * cols + j];
      EXPECT_NEAR(got[j], want, 1e-5 * (1.0 + std::fabs(want))) << what << " column " << j;
    }
  };
  // The norm alone reads y: its dx is y's whole gradient.
  {
    Tensor y = probe(x);
    backward(sum(mul(layer_norm(y, {cols}, w, b), r)));
    EXPECT_EQ(probed, 1);
    expect_sums_of(x.grad(), "alone");
  }
  // A residual connection: the branch's share arrives first and the norm adds its own into it.
  {
    x.set_grad(Tensor());
    Tensor wl = Tensor::uniform({cols, cols}, -0.3, 0.3, gen, DType::f32);
    Tensor y = probe(x);
    backward(sum(mul(linear_residual(layer_norm(y, {cols}, w, b), wl, Tensor(), y), r)));
    expect_sums_of(x.grad(), "residual");
  }
  // add hands one tensor to both inputs, so the norm is not offered it: no sums.
  {
    x.set_grad(Tensor());
    seen = Tensor();
    Tensor y = probe(x);
    backward(sum(mul(add(layer_norm(y, {cols}, w, b), y), r)));
    EXPECT_FALSE(seen.defined());
  }
  // The norm runs first and a later share is added by the engine: no sums (they would be the norm's alone).
  {
    x.set_grad(Tensor());
    seen = Tensor();
    Tensor y = probe(x);
    Tensor other = mul(y, y);
    backward(sum(add(mul(layer_norm(y, {cols}, w, b), r), other)));
    EXPECT_FALSE(seen.defined());
  }
  // An op offered the gradient to add into drops them.
  {
    x.set_grad(Tensor());
    seen = Tensor();
    Tensor y = probe(x);
    Tensor first = record_op(y.detach().clone(), {y}, "adds_into", [&](const Tensor& g) {
      Tensor acc = grad_add_target(0);
      if (!acc.defined()) return std::vector<Tensor>{g};
      acc.copy_(add(acc, g));
      return std::vector<Tensor>{acc};
    });
    backward(sum(add(first, mul(layer_norm(y, {cols}, w, b), r))));
    EXPECT_FALSE(seen.defined());
  }
  // Outside a backward pass nothing is recorded or found.
  Tensor t = Tensor::ones({rows, cols}, DType::f32);
  set_column_sums(t, cols, Tensor::zeros({cols}, DType::f32));
  EXPECT_FALSE(column_sums_of(t, cols).defined());
}

// A linear layer whose output joins a residual stream before a layer norm takes its bias gradient from the
// norm's sums: the same values as the layer norm in f64 (no sums handed on) within f32's rounding.
TEST(Autograd, ResidualBiasGradientFromTheNormsSumsMatchesF64) {
  const int64_t rows = 40, width = 16;
  auto run = [&](DType dt) {
    Generator g2(3);
    Tensor x = Tensor::uniform({rows, width}, -1.0, 1.0, g2, dt).requires_grad_();
    Tensor w1 = Tensor::uniform({width, width}, -0.3, 0.3, g2, dt).requires_grad_();
    Tensor b1 = Tensor::uniform({width}, -0.1, 0.1, g2, dt).requires_grad_();
    Tensor lw = Tensor::uniform({width}, 0.5, 1.5, g2, dt).requires_grad_();
    Tensor lb = Tensor::uniform({width}, -0.5, 0.5, g2, dt).requires_grad_();
    Tensor r = Tensor::uniform({rows, width}, -1.0, 1.0, g2, dt);
    Tensor h = linear_residual(layer_norm(x, {width}, lw, lb), w1, b1, x);
    Tensor out = linear_residual(layer_norm(h, {width}, lw, lb), w1, b1, h);
    backward(sum(mul(layer_norm(out, {width}, lw, lb), r)));
    return std::vector<Tensor>{x.grad(), w1.grad(), b1.grad(), lw.grad(), lb.grad()};
  };
  const std::vector<Tensor> f32 = run(DType::f32), f64 = run(DType::f64);
  const char* names[] = {"x", "w1", "b1", "lw", "lb"};
  for (size_t i = 0; i < f32.size(); ++i) {
    const std::vector<double> a = f32[i].to_vector<double>(), e = f64[i].to_vector<double>();
    ASSERT_EQ(a.size(), e.size());
    for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], e[j], 2e-5 * (1.0 + std::fabs(e[j]))) << names[i] << " " << j;
  }
}

}  // namespace
}  // namespace tandem
