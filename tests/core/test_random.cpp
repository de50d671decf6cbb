// The counter-based generator: determinism, offsets, and independence from the thread count.
#include <gtest/gtest.h>

#include <cmath>

#include "tandem/device.h"
#include "tandem/random.h"
#include "tandem/tensor.h"

namespace tandem {
namespace {

TEST(Generator, SameSeedSameNumbers) {
  Generator a(42), b(42);
  EXPECT_EQ(Tensor::uniform({100}, 0, 1, a).to_vector<float>(), Tensor::uniform({100}, 0, 1, b).to_vector<float>());
  EXPECT_EQ(Tensor::normal({50}, 0, 1, a, DType::f64).to_vector<double>(),
            Tensor::normal({50}, 0, 1, b, DType::f64).to_vector<double>());
  EXPECT_EQ(a.offset(), 150u);
  EXPECT_EQ(a.next_below(1000), b.next_below(1000));
  EXPECT_EQ(a.next_double(), b.next_double());
}

TEST(Generator, DifferentSeedsOrOffsetsDiffer) {
  Generator a(1), b(2);
  auto va = Tensor::uniform({64}, 0, 1, a).to_vector<float>();
  auto vb = Tensor::uniform({64}, 0, 1, b).to_vector<float>();
  auto va2 = Tensor::uniform({64}, 0, 1, a).to_vector<float>();  // same generator, later offset
  int same_seed = 0, same_offset = 0;
  for (int i = 0; i < 64; ++i) {
    same_seed += va[i] == vb[i];
    same_offset += va[i] == va2[i];
  }
  EXPECT_LT(same_seed, 2);
  EXPECT_LT(same_offset, 2);
}

TEST(Generator, ElementIUsesCounterOffsetPlusI) {
  // Drawing 10 then 5 numbers gives the same 15 numbers as drawing 15 at once.
  Generator split(7), whole(7);
  auto first = Tensor::uniform({10}, -1, 1, split, DType::f64).to_vector<double>();
  auto second = Tensor::uniform({5}, -1, 1, split, DType::f64).to_vector<double>();
  auto all = Tensor::uniform({15}, -1, 1, whole, DType::f64).to_vector<double>();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(first[i], all[i]);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(second[i], all[10 + i]);
}

TEST(Generator, DistributionsLookRight) {
  Generator g(3);
  auto u = Tensor::uniform({200000}, 2, 5, g, DType::f64).to_vector<double>();
  auto n = Tensor::normal({200000}, 1, 2, g, DType::f64).to_vector<double>();
  double um = 0, nm = 0, nv = 0;
  for (double x : u) {
    ASSERT_GE(x, 2.0);
    ASSERT_LT(x, 5.0);
    um += x / u.size();
  }
  for (double x : n) nm += x / n.size();
  for (double x : n) nv += (x - nm) * (x - nm) / n.size();
  EXPECT_NEAR(um, 3.5, 0.01);
  EXPECT_NEAR(nm, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(nv), 2.0, 0.02);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_LT(g.next_below(7), 7u);
    const double d = g.next_double();
    ASSERT_GE(d, 0.0);
    ASSERT_LT(d, 1.0);
  }
}

TEST(Generator, SameNumbersOnAnyThreadCount) {
  const int prev = num_threads();
  set_num_threads(1);
  Generator a(11);
  auto one = Tensor::uniform({300000}, 0, 1, a).to_vector<float>();
  set_num_threads(2);
  Generator b(11);
  auto two = Tensor::uniform({300000}, 0, 1, b).to_vector<float>();
  set_num_threads(prev);
  EXPECT_EQ(one, two);
}

TEST(Generator, HalfPrecisionFillsComeFromTheSameStream) {
  Generator a(5), b(5);
  auto h = Tensor::uniform({32}, 0, 1, a, DType::f16).to_vector<float>();
  auto f = Tensor::uniform({32}, 0, 1, b).to_vector<float>();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(h[i], static_cast<float>(Half(f[i])));
}

}  // namespace
}  // namespace tandem
