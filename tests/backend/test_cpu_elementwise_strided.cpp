// The CPU's generic elementwise kernel on operands read through strides: broadcast, transposed,
// sliced, channels-last outputs, walks of more dimensions than it merges into (the copying fallback),
// and several threads; each against the same op on dense copies of the operands.
#include <cmath>
#include <string>

#include "core/tensor_impl.h"
#include "cpu_test_util.h"
#include "ops/layout.h"
#include "ops/op_utils.h"

namespace tandem::testing {
namespace {

using backend::Binary;
using backend::Ternary;
using backend::Unary;

// The op on dense copies of the operands stretched to out's shape (the walk every element the same way).
Tensor reference_binary(Binary op, const Tensor& a, const Tensor& b, const Shape& shape) {
  Tensor ac = ops::expand_raw(a, shape).contiguous(), bc = ops::expand_raw(b, shape).contiguous();
  Tensor out = Tensor::empty(shape, a.dtype());
  cpu().binary(op, ac, bc, out);
  return out;
}

void expect_same(const Tensor& want, const Tensor& got, const std::string& what) {
  ASSERT_EQ(want.shape(), got.shape()) << what;
  expect_close(got.contiguous(), values(want.contiguous()), Tol{0, 0}, what);
}

TEST(CpuElementwiseStrided, BroadcastOperandsAreReadInPlace) {
  Generator gen(21);
  struct Case {
    Shape a, b, out;
  };
  const Case cases[] = {{{7, 1, 5}, {1, 9, 1}, {7, 9, 5}},
                        {{300, 1000}, {1000}, {300, 1000}},   // rows on several threads
                        {{300, 1000}, {300, 1}, {300, 1000}},  // one element per row, broadcast along it
                        {{}, {4, 3}, {4, 3}},
                        {{2, 1, 3, 1}, {5, 1, 4}, {2, 5, 3, 4}}};
  for (DType dt : float_types()) {
    for (const Case& c : cases) {
      Tensor a = rand_tensor(c.a, dt, gen), b = rand_tensor(c.b, dt, gen, 0.5, 2.0);
      for (Binary op : {Binary::Add, Binary::Div, Binary::Max, Binary::Pow, Binary::Lt}) {
        Tensor x = op == Binary::Pow ? ops::unary_raw(Unary::Abs, a) : a;
        Tensor out = Tensor::empty(c.out, dt);
        cpu().binary(op, x, b, out);
        expect_same(reference_binary(op, x, b, c.out), out,
                    std::string(backend::op_name(op)) + " " + shape_str(c.a) + " " + shape_str(c.b));
      }
    }
  }
}

TEST(CpuElementwiseStrided, TransposedAndSlicedOperands) {
  Generator gen(22);
  Tensor base = rand_tensor({6, 9}, DType::f64, gen), other = rand_tensor({9, 6}, DType::f64, gen);
  Tensor t = base.transpose(0, 1);                          // [9, 6], strides (1, 9)
  Tensor s = other.narrow(1, 1, 4);                         // [9, 4], a slice of rows
  Tensor out = Tensor::empty({9, 6}, DType::f64);
  cpu().binary(Binary::Mul, t, other, out);
  expect_same(reference_binary(Binary::Mul, t.contiguous(), other, {9, 6}), out, "transposed * contiguous");
  Tensor out2 = Tensor::empty({9, 4}, DType::f64);
  cpu().binary(Binary::Sub, s, t.narrow(1, 2, 4), out2);
  expect_same(reference_binary(Binary::Sub, s.contiguous(), t.narrow(1, 2, 4).contiguous(), {9, 4}), out2,
              "slice - transposed slice");
  Tensor u = Tensor::empty({9, 6}, DType::f64), uc = Tensor::empty({9, 6}, DType::f64);
  cpu().unary(Unary::GeluTanh, t, u);
  cpu().unary(Unary::GeluTanh, t.contiguous(), uc);
  expect_same(uc, u, "gelu of a transposed view");
}

TEST(CpuElementwiseStrided, ChannelsLastOutputs) {
  Generator gen(23);
  Tensor a = ops::to_dense(rand_tensor({2, 5, 3, 4}, DType::f32, gen), DType::f32, true);
  Tensor b = rand_tensor({2, 5, 3, 4}, DType::f32, gen), c = rand_tensor({5, 1, 1}, DType::f32, gen);
  Tensor out = ops::empty_channels_last({2, 5, 3, 4}, DType::f32, Device::cpu());
  cpu().binary(Binary::Add, a, b, out);
  expect_same(reference_binary(Binary::Add, a.contiguous(), b, {2, 5, 3, 4}), out, "channels-last + contiguous");
  cpu().ternary(Ternary::Where, b, a, c, out);
  Tensor want = Tensor::empty({2, 5, 3, 4});
  cpu().ternary(Ternary::Where, b, a.contiguous(), ops::expand_raw(c, {2, 5, 3, 4}), want);
  expect_same(want, out, "where into channels-last");
  EXPECT_TRUE(ops::is_channels_last(ops::binary_raw(Binary::Mul, a, c)));
}

TEST(CpuElementwiseStrided, MoreDimensionsThanTheWalkMergesCopyFirst) {
  // Twenty extents of 2 with every other one broadcast: nothing merges, past kMaxDims.
  Shape full(20, 2), half(20, 2);
  for (size_t i = 1; i < half.size(); i += 2) half[i] = 1;
  Generator gen(24);
  Tensor a = rand_tensor(full, DType::f64, gen), b = rand_tensor(half, DType::f64, gen);
  Tensor out = Tensor::empty(full, DType::f64);
  cpu().binary(Binary::Mul, a, b, out);
  expect_same(reference_binary(Binary::Mul, a, b, full), out, "20-d broadcast");
}

TEST(CpuElementwiseStrided, ResultsDoNotDependOnTheThreadCount) {
  Generator gen(25);
  Tensor a = rand_tensor({64, 2048}, DType::f32, gen), b = rand_tensor({64, 1}, DType::f32, gen);
  Tensor one = Tensor::empty({64, 2048}), many = Tensor::empty({64, 2048});
  {
    ThreadScope t(1);
    cpu().ternary(Ternary::MaxGradA, a, a.transpose(0, 1).contiguous().transpose(0, 1), b, one);
  }
  {
    ThreadScope t(4);
    cpu().ternary(Ternary::MaxGradA, a, a.transpose(0, 1).contiguous().transpose(0, 1), b, many);
  }
  expect_same(one, many, "1 thread vs 4");
}

}  // namespace
}  // namespace tandem::testing
