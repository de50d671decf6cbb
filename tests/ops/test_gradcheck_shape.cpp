// Finite-difference gradient checks in f64 of every reduction, shape and indexing op and product.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "tandem/ops.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;

Tensor idx(const std::vector<int64_t>& v, const Shape& shape, DType dt = DType::i64) {
  return Tensor::from_vector(v, shape).to(dt);
}

Tensor f64_leaf(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::from_vector(v, shape);
  t.requires_grad_();
  return t;
}

TEST(GradcheckShape, Reductions) {
  Generator gen(101);
  Tensor x = leaf({2, 3, 4}, gen), y = leaf({3, 1, 5}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return sum(t, {0, 2}, true); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return sum(t); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return mean(t, {-1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return mean(t); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return mean(t, {0, 1}); }, y));  // an extent of 1 reduced
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return amax(t, {1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return amax(t, {0, 2}, true); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return amin(t, {2, 0}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return var(t, {1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return var(t, {0, 2}, false, true); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return logsumexp(t, {1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return logsumexp(t, {0, 2}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return prod(t, {1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return prod(t, {0, 2}, true); }, x));
  // A product through exact zeros: its gradient there is the product of the others.
  Tensor z = f64_leaf({0.0, 2.0, -1.5, 0.0, 0.0, 3.0, 0.5, 1.0}, {2, 4});
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return prod(t, {1}); }, z));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return prod(t, {0}); }, z));
}

TEST(GradcheckShape, ViewsAndReordering) {
  Generator gen(102);
  Tensor x = leaf({2, 3, 4}, gen), s = leaf({1, 3, 1, 2}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return reshape(t, {4, -1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return reshape(transpose(t, 0, 2), {4, 6}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return transpose(t, 1, -1); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return permute(t, {2, 0, 1}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return squeeze(t, {0, -2}); }, s));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return squeeze(t); }, s));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return unsqueeze(t, {0, 3}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return flatten(t, 1); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return expand(t, {2, 2, 3, 4}); }, x));
  EXPECT_TRUE(gradcheck1(
      [](const Tensor& t) {
        Ts parts = split(t, {1, 2}, 1);
        return concat({parts[1], mul(parts[0], parts[0])}, 1);
      },
      x));
  EXPECT_TRUE(gradcheck1(
      [](const Tensor& t) {
        Ts parts = chunk(t, 3, -1);  // pieces of 2, 2 (the extent 4 in ceil(4/3) = 2)
        return concat({parts.back(), parts.front()}, 0);
      },
      x));
}

TEST(GradcheckShape, Slices) {
  Generator gen(103);
  Tensor x = leaf({5, 6}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return slice(t, 1, 2, 3); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return strided_slice(t, 1, 1, kOpen, 2); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return strided_slice(t, 0, kOpen, kOpen, -2); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return strided_slice(transpose(t, 0, 1), 1, -1, 0, -3); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return slice_ranges(t, {4, 0}, {-100, 5}, {0, 1}, {-1, 3}); }, x));
}

TEST(GradcheckShape, Indexing) {
  Generator gen(104);
  Tensor x = leaf({4, 3}, gen), c = leaf({2, 3, 4}, gen);
  for (DType it : {DType::i64, DType::i32}) {
    Tensor rep = idx({0, 2, 2, -1, 0}, {5}, it);  // repeated and negative indices
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return index_select(t, 0, rep); }, x));
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return index_select(t, -1, idx({1, 1, 0, 2, 3, 1}, {2, 3}, it)); }, c));
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return gather(t, 1, idx({2, 2, 0, 1, 0, 0}, {2, 3}, it)); }, x));
    EXPECT_TRUE(gradcheck1([&](const Tensor& t) { return gather(t, 0, idx({3, 3, 0, 1}, {2, 2}, it)); }, x));
    Tensor src = leaf({2, 3}, gen);
    Tensor at = idx({0, 0, 3, 1, 0, 1}, {2, 3}, it);  // positions met twice
    EXPECT_TRUE(gradcheck([&](const Ts& t) { return scatter_add(t[0], 0, at, t[1]); }, {x, src}));
    Tensor upd = leaf({2, 2}, gen);
    Tensor distinct = idx({1, 0, 3, 2}, {2, 2}, it);
    EXPECT_TRUE(gradcheck([&](const Ts& t) { return scatter_elements(t[0], distinct, t[1], 0); }, {x, upd}));
    EXPECT_TRUE(gradcheck([&](const Ts& t) { return scatter_elements(t[0], idx({2, 0, 1, 2}, {2, 2}, it), t[1], 1); },
                          {x, upd}));
  }
}

TEST(GradcheckShape, RepeatPadRearrange) {
  Generator gen(105);
  Tensor x = leaf({2, 3}, gen), img = leaf({1, 8, 2, 3}, gen), sp = leaf({2, 2, 4, 2}, gen);
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return tile(t, {2, 1, 3}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return tile(transpose(t, 0, 1), {2}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return upsample_nearest(t, {3, 2}); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return pad(t, {1, 0, 2, 3}, PadMode::Constant, 0.25); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return pad(t, {1, 2, 1, 2}, PadMode::Reflect); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return pad(t, {3, 0, 2, 4}, PadMode::Edge); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return pad(transpose(t, 0, 1), {2, 1, 0, 1}, PadMode::Reflect); }, x));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return depth_to_space(t, 2); }, img));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return depth_to_space(t, 2, true); }, img));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return space_to_depth(t, 2); }, sp));
  EXPECT_TRUE(gradcheck1([](const Tensor& t) { return space_to_depth(t, 2, true); }, sp));
}

TEST(GradcheckShape, SimilarityAndRankingLoss) {
  Generator gen(106);
  Tensor a = leaf({3, 4}, gen), b = leaf({3, 4}, gen), p = leaf({5}, gen), n = leaf({5}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return cosine_similarity(t[0], t[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return cosine_similarity(t[0], t[1], 0); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return ranking_loss(t[0], t[1], 0.3); }, {p, n}));
}

TEST(GradcheckShape, Products) {
  Generator gen(107);
  Tensor a = leaf({2, 1, 3, 4}, gen), b = leaf({5, 4, 2}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], t[1]); }, {a, b}));  // leading dimensions broadcast
  Tensor v = leaf({4}, gen), m = leaf({2, 4, 3}, gen), r = leaf({2, 3, 4}, gen), w2 = leaf({4, 5}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], t[1]); }, {v, m}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], t[1]); }, {r, v}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], t[0]); }, {v}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], t[1]); }, {r, w2}));  // rows of one product
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(transpose(t[0], 1, 2), t[1]); }, {m, m}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return matmul(t[0], transpose(t[1], 0, 1)); }, {w2, w2}));
  Tensor ga = leaf({4, 3}, gen), gb = leaf({5, 4}, gen), gc = leaf({5}, gen), gcol = leaf({3, 1}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return gemm(t[0], t[1], t[2], 0.5, 2.0, true, true); }, {ga, gb, gc}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return gemm(t[0], t[1], t[2], 1.5, -1.0, true, false); },
                        {ga, leaf({4, 2}, gen), gcol}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return gemm(t[0], t[1], Tensor(), 2.0, 1.0, false, true); },
                        {leaf({2, 4}, gen), gb}));
  Tensor x = leaf({2, 3, 4}, gen), w = leaf({5, 4}, gen), bias = leaf({5}, gen);
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear(t[0], t[1], t[2]); }, {x, w, bias}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear(t[0], t[1], t[2], true); }, {x, w, bias}));
  EXPECT_TRUE(gradcheck([](const Ts& t) { return linear(t[0], t[1], Tensor()); }, {v, w}));
}

}  // namespace
}  // namespace tandem::testing
