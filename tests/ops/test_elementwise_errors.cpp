// The elementwise ops' errors name the op, the operands' shapes and dtypes, and the axis that does not
// broadcast; the CPU kernels' name the op and the dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "backend/backend.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

// Expects f to throw an input error whose message holds every one of the parts.
void expect_error(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << *parts.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(ElementwiseErrors, ShapesThatDoNotBroadcastNameOpShapesAndAxis) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  expect_error([&] { add(a, b); }, {"add", "f32[2, 3]", "f32[4]", "extents 3 and 4", "axis 1"});
  expect_error([&] { maximum(a, Tensor::zeros({5, 3})); }, {"maximum", "[2, 3]", "[5, 3]", "axis 0"});
  expect_error([&] { pow(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3})); }, {"pow", "[2, 2, 3]", "[3, 3]", "axis 1"});
  expect_error([&] { prelu(a, Tensor::zeros({2})); }, {"prelu", "[2, 3]", "[2]"});
  expect_error([&] { less(a, b); }, {"less", "[2, 3]", "[4]"});
  expect_error([&] { logical_xor(a, b); }, {"logical_xor", "[2, 3]"});
  expect_error([&] { where(Tensor::zeros({3, 1}), a, a); }, {"where", "condition", "f32[3, 1]", "[2, 3]", "axis 0"});
  expect_error([&] { where(a, a, b); }, {"where", "[2, 3]", "[4]"});
}

TEST(ElementwiseErrors, DtypesAndFloatingOperands) {
  Tensor f = Tensor::zeros({3}), d = Tensor::zeros({3}, DType::f64), i = Tensor::zeros({3}, DType::i32);
  expect_error([&] { mul(f, d); }, {"mul", "different dtypes", "f32[3]", "f64[3]"});
  expect_error([&] { minimum(f, d); }, {"minimum", "different dtypes"});
  expect_error([&] { pow(i, i); }, {"pow", "floating", "i32[3]"});
  expect_error([&] { prelu(i, i); }, {"prelu", "floating"});
  expect_error([&] { sqrt(i); }, {"sqrt", "floating", "i32[3]"});
  expect_error([&] { gelu(i); }, {"gelu", "floating"});
  expect_error([&] { logical_not(i); }, {"logical_not", "floating"});
  expect_error([&] { sin(Tensor()); }, {"sin", "undefined"});
  expect_error([&] { add(f, Tensor()); }, {"add", "second operand", "undefined"});
}

TEST(ElementwiseErrors, BadNumbers) {
  Tensor x = Tensor::zeros({3});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error([&] { clip(x, nan, 1.0); }, {"clip", "NaN"});
  expect_error([&] { leaky_relu(x, nan); }, {"leaky_relu", "finite"});
  expect_error([&] { elu(x, std::numeric_limits<double>::infinity()); }, {"elu", "finite"});
  expect_error([&] { hard_sigmoid(x, nan, 0.5); }, {"hard_sigmoid", "finite"});
}

TEST(ElementwiseErrors, CpuKernelsNameOpAndDtype) {
  backend::Backend& be = backend::cpu_backend();
  Tensor h = Tensor::zeros({3}, DType::f16), o = Tensor::empty({3}, DType::f16);
  expect_error([&] { be.unary(backend::Unary::Erf, h, o); }, {"erf", "f16"});
  expect_error([&] { be.binary(backend::Binary::Pow, h, h, o); }, {"pow", "f16"});
  Tensor i = Tensor::zeros({3}, DType::i64), io = Tensor::empty({3}, DType::i64);
  expect_error([&] { be.binary(backend::Binary::Pow, i, i, io); }, {"pow", "integer"});
  expect_error([&] { be.ternary(backend::Ternary::DivGradB, i, i, i, io); }, {"div_backward_divisor", "integer"});
  Tensor x = Tensor::zeros({3}), y = Tensor::empty({3});
  expect_error([&] { be.unary_backward(backend::Unary::Floor, x, x, y); }, {"floor", "zero derivative"});
}

}  // namespace
}  // namespace tandem
