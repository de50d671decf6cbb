// Ops reject bad shapes and arguments with a tandem::Error whose message says what is wrong.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tandem/ops.h"

namespace tandem {
namespace {

// Runs f, expecting an Input error whose message contains every one of the given fragments.
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

TEST(OpErrors, Elementwise) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2}), d = Tensor::zeros({2, 3}, DType::f64);
  expect_error([&] { add(a, b); }, {"add", "different shapes", "[2, 3]", "[3, 2]"});
  expect_error([&] { mul(a, d); }, {"mul", "different dtypes"});
  expect_error([&] { sub(a, Tensor()); }, {"sub", "undefined"});
  expect_error([&] { relu(Tensor::zeros({2}, DType::i32)); }, {"relu", "floating"});
  expect_error([&] { bias_add(a, Tensor::zeros({2})); }, {"bias_add", "does not match"});
  expect_error([&] { bias_add(a, Tensor::zeros({3}, DType::f64)); }, {"bias_add", "dtype"});
}

TEST(OpErrors, ShapesAndReductions) {
  Tensor a = Tensor::zeros({2, 3});
  expect_error([&] { reshape(a, {4, 2}); }, {"reshape", "[4, 2]", "6 elements"});
  expect_error([&] { reshape(a, {-1, -1}); }, {"more than one -1"});
  expect_error([&] { flatten(a, 5); }, {"flatten", "start_dim"});
  expect_error([&] { mean(Tensor::zeros({0})); }, {"mean", "empty"});
  expect_error([&] { sum(Tensor::zeros({3}, DType::i64)); }, {"sum", "floating"});
  expect_error([&] { cat({}, 0); }, {"cat", "no tensors"});
  expect_error([&] { cat({a, Tensor::zeros({3, 3})}, 1); }, {"cat", "tensor 1", "outside dimension 1"});
  expect_error([&] { cat({a, Tensor::zeros({2, 3}, DType::f64)}, 0); }, {"cat", "dtype"});
  expect_error([&] { cat({a, a}, 2); }, {"cat", "dimension 2 is out of range"});
  expect_error([&] { cat({Tensor::zeros({})}, 0); }, {"cat", "0-dimensional"});
}

TEST(OpErrors, MatrixProducts) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  expect_error([&] { matmul(a, b); }, {"matmul", "inner dimensions"});
  expect_error([&] { matmul(Tensor::zeros({2, 3, 1}), b); }, {"matmul", "[2, 3, 1]", "inner dimensions differ (1 and 4)"});
  expect_error([&] { linear(a, Tensor::zeros({4, 2}), Tensor()); }, {"linear", "3 features", "expects 2"});
  expect_error([&] { linear(a, Tensor::zeros({4, 3}), Tensor::zeros({5})); }, {"linear", "bias"});
}

TEST(OpErrors, ConvolutionAndPooling) {
  Tensor x = Tensor::zeros({1, 3, 5, 5});
  expect_error([&] { conv2d(x, Tensor::zeros({2, 4, 3, 3}), Tensor()); }, {"conv2d", "3 channels", "expects 4"});
  expect_error([&] { conv2d(x, Tensor::zeros({2, 3, 7, 7}), Tensor()); }, {"conv2d", "larger than the padded input"});
  expect_error([&] { conv2d(x, Tensor::zeros({2, 3, 3, 3}), Tensor::zeros({3})); }, {"conv2d", "bias"});
  expect_error([&] { conv2d(x, Tensor::zeros({2, 3, 3, 3}), Tensor(), {{0, 1}, {0, 0}}); }, {"stride"});
  expect_error([&] { conv2d(Tensor::zeros({3, 5, 5}), Tensor::zeros({2, 3, 3, 3}), Tensor()); },
               {"conv2d", "4 dimensions"});
  Tensor x4 = Tensor::zeros({1, 4, 5, 5});
  const Conv2dOptions two_groups{{1, 1}, {0, 0}, false, 2};
  expect_error([&] { conv2d(x4, Tensor::zeros({2, 4, 3, 3}), Tensor(), two_groups); },
               {"conv2d", "4 channels", "expects 4 per group", "8 in 2 groups"});
  expect_error([&] { conv2d(x4, Tensor::zeros({3, 2, 3, 3}), Tensor(), two_groups); },
               {"conv2d", "2 groups must divide", "filters (3)"});
  expect_error([&] { conv2d(x, Tensor::zeros({2, 1, 3, 3}), Tensor(), {{1, 1}, {0, 0}, false, 2}); },
               {"conv2d", "input channels (3)"});
  expect_error([&] { conv2d(x, Tensor::zeros({2, 3, 3, 3}), Tensor(), {{1, 1}, {0, 0}, false, 0}); },
               {"conv2d", "groups must be at least 1"});
  expect_error([&] { max_pool2d(x, {{2, 2}, {2, 2}, {2, 2}}); }, {"max_pool2d", "padding"});
  expect_error([&] { avg_pool2d(x, {{7, 7}, {1, 1}, {0, 0}}); }, {"avg_pool2d", "larger than"});
  expect_error([&] { max_pool2d(x, {{2, 2}, {0, 2}, {0, 0}}); }, {"max_pool2d", "stride"});
  expect_error([&] { avg_pool2d(x, {{3, 3}, {1, 1}, {1, 1}, {2, 1}}); },
               {"avg_pool2d", "padding", "1 before and 2 after", "kernel of 3"});
}

TEST(OpErrors, NormalisationAndDropout) {
  Tensor x = Tensor::zeros({2, 3, 2, 2}), g = Tensor::ones({3}), b = Tensor::zeros({3});
  Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3}), rv_bad = Tensor::ones({4});
  expect_error([&] { batch_norm2d(x, g, b, rm, rv_bad, true); }, {"batch_norm2d", "3 channels"});
  Tensor one = Tensor::zeros({1, 3, 1, 1});
  expect_error([&] { batch_norm2d(one, g, b, rm, rv, true); }, {"batch_norm2d", "more than one value"});
  expect_error([&] { batch_norm2d(x, g, b, rm, rv, true, 0.1, 0.0); }, {"eps"});
  Generator gen(1);
  expect_error([&] { dropout(x, 1.0, true, gen); }, {"dropout", "outside [0, 1)"});
  expect_error([&] { dropout(x, -0.1, true, gen); }, {"dropout"});
}

TEST(OpErrors, LossAndMetrics) {
  Tensor logits = Tensor::zeros({3, 4});
  expect_error([&] { softmax_cross_entropy(logits, Tensor::zeros({3})); }, {"labels must be i32 or i64"});
  expect_error([&] { softmax_cross_entropy(logits, Tensor::zeros({2}, DType::i64)); },
               {"labels i64[2]", "logits f32[3, 4]", "class indices [3]", "targets [3, 4]"});
  expect_error([&] { softmax_cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3})); },
               {"label 4", "row 1", "[0, 4)"});
  expect_error([&] { count_correct(logits, Tensor::from_vector<int32_t>({0, 1, -2}, {3})); }, {"label -2", "row 2"});
  expect_error([&] { argmax(Tensor::zeros({4})); }, {"argmax", "2 dimensions"});
  Tensor sum = Tensor::zeros({1}), count = Tensor::zeros({1}, DType::i64);
  const Tensor labels = Tensor::from_vector<int32_t>({0, 1, 2}, {3}), loss = Tensor::ones({1});
  expect_error([&] { add_loss_and_correct(loss, logits, labels, sum, sum); }, {"add_loss_and_correct", "i64"});
  expect_error([&] { add_loss_and_correct(Tensor::ones({2}), logits, labels, sum, count); },
               {"add_loss_and_correct", "one f32 element"});
  expect_error([&] { add_loss_and_correct(loss, logits, Tensor::from_vector<int32_t>({0, 9, 1}, {3}), sum, count); },
               {"label 9", "row 1"});
}

// The sums of a training pass: the loss added as add_into adds it, the rows counted as add_correct counts.
TEST(Ops, LossAndCorrectSumsAddAsTheirParts) {
  Tensor logits = Tensor::from_vector<float>({0.1f, 0.9f, 0.0f, 0.7f, 0.2f, 0.1f, 0.3f, 0.3f, 0.4f}, {3, 3});
  const Tensor labels = Tensor::from_vector<int64_t>({1, 1, 2}, {3});
  Tensor sum = Tensor::full({1}, 0.1), count = Tensor::zeros({1}, DType::i64);
  Tensor want_sum = Tensor::full({1}, 0.1), want_count = Tensor::zeros({1}, DType::i64);
  for (int i = 0; i < 3; ++i) {
    const Tensor loss = softmax_cross_entropy(logits, labels);
    add_loss_and_correct(loss, logits, labels, sum, count);
    add_into(want_sum, loss.view({1}));
  }
  add_correct(logits, labels, want_count);
  EXPECT_EQ(count.to_vector<int64_t>(), std::vector<int64_t>{6});  // rows 0 and 2, three times
  EXPECT_EQ(sum.to_vector<float>(), want_sum.to_vector<float>());
  EXPECT_EQ(want_count.to_vector<int64_t>(), std::vector<int64_t>{2});
}

// Labels are class indices [N] or targets [N, C]; any other shape is refused, naming both shapes and
// what fits. [N, 1] used to pass as targets and read every sample as class 0.
TEST(OpErrors, CrossEntropyLabelShapes) {
  Tensor logits = Tensor::zeros({8, 10});
  for (const Tensor& labels : {Tensor::zeros({8, 1}, DType::i32), Tensor::zeros({8, 1}), Tensor::zeros({8, 2}),
                               Tensor::zeros({7}, DType::i64), Tensor::zeros({7, 10}), Tensor::zeros({8, 10, 1}),
                               Tensor::zeros({}, DType::i64)}) {
    const std::string shape = labels.str();
    expect_error([&] { softmax_cross_entropy(logits, labels); },
                 {shape.substr(0, shape.find(" on ")).c_str(), "logits f32[8, 10]", "class indices [8] (i32 or i64)",
                  "targets [8, 10]"});
  }
  expect_error([&] { softmax_cross_entropy(Tensor::zeros({8, 1}), Tensor::zeros({8, 10})); }, {"targets [8, 1]"});
}

TEST(OpErrors, DevicesThatDoNotExist) {
  const int n = cuda_device_count();
  expect_error([&] { Tensor::zeros({2}, DType::f32, Device::cuda(n)); }, {"cuda:"});
}

}  // namespace
}  // namespace tandem
