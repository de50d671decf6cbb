// Bad shapes, dimensions and indices given to the reductions, shape and indexing ops and products: each
// error names the op, the shapes and the dimension.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

Tensor f64(const Shape& s) { return Tensor::zeros(s, DType::f64); }
Tensor i64(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }

TEST(ShapeErrors, Reductions) {
  expect_error([] { sum(f64({2, 3}), {2}); }, {"sum", "dimension 2", "[2, 3]"});
  expect_error([] { mean(f64({2, 3}), {-3}); }, {"mean", "dimension -3", "[2, 3]"});
  expect_error([] { amax(f64({2, 3}), {1, -1}); }, {"amax", "dimension 1", "twice"});
  expect_error([] { amin(f64({2, 0}), {1}); }, {"amin", "dimension 1", "[2, 0]", "empty"});
  expect_error([] { argmax(f64({0, 3}), 0); }, {"argmax", "dimension 0", "[0, 3]", "empty"});
  expect_error([] { argmin(f64({}), 0); }, {"argmin", "0-dimensional"});
  expect_error([] { var(Tensor::zeros({3}, DType::i64), {0}); }, {"var", "floating", "i64[3]"});
  expect_error([] { logsumexp(f64({2}), {1}); }, {"logsumexp", "dimension 1", "[2]"});
  expect_error([] { prod(f64({2}), {5}); }, {"prod", "dimension 5"});
  expect_error([] { cosine_similarity(f64({2, 3}), f64({3, 2})); }, {"cosine_similarity", "[2, 3]", "[3, 2]"});
  expect_error([] { ranking_loss(f64({2}), f64({3})); }, {"ranking_loss", "[2]", "[3]"});
}

TEST(ShapeErrors, Views) {
  expect_error([] { reshape(f64({2, 3}), {4, -1}); }, {"reshape", "[4, -1]", "[2, 3]"});
  expect_error([] { reshape(f64({2, 3}), {5}); }, {"reshape", "[5]", "6 elements"});
  expect_error([] { reshape(f64({2, 3}), {-1, -1}); }, {"reshape", "more than one -1"});
  expect_error([] { transpose(f64({2, 3}), 0, 2); }, {"transpose", "dimension 2", "[2, 3]"});
  expect_error([] { permute(f64({2, 3}), {0, 0}); }, {"permute", "twice"});
  expect_error([] { squeeze(f64({2, 1}), {0}); }, {"squeeze", "dimension 0", "[2, 1]", "extent 2"});
  expect_error([] { unsqueeze(f64({2}), {3}); }, {"unsqueeze", "position 3", "[2]"});
  expect_error([] { split(f64({5, 2}), {2, 2}, 0); }, {"split", "sum to 4", "extent 5", "dimension 0", "[5, 2]"});
  expect_error([] { chunk(f64({5, 2}), 0, 1); }, {"chunk", "0 parts", "dimension 1"});
  expect_error([] { slice(f64({2, 4}), 1, 3, 2); }, {"slice", "dimension 1", "[2, 4]", "extent 4"});
  expect_error([] { strided_slice(f64({2, 4}), 1, 0, 4, 0); }, {"slice", "step", "dimension 1", "[2, 4]"});
  expect_error([] { strided_slice(f64({2, 4}), 2, 0, 4, 1); }, {"slice", "dimension 2", "[2, 4]"});
  expect_error([] { slice_ranges(f64({2, 4}), {0, 0}, {1, 1}, {1, -1}); }, {"slice", "axis 1", "twice"});
  expect_error([] { slice_ranges(f64({2, 4}), {0, 0}, {1}); }, {"slice", "one entry per sliced axis"});
}

TEST(ShapeErrors, Indexing) {
  expect_error([] { index_select(f64({3, 4}), 1, i64({0, 4}, {2})); },
               {"gather", "dimension 1", "[3, 4]", "index 4", "[-4, 4)"});
  expect_error([] { index_select(f64({3, 4}), 0, i64({-4}, {1})); }, {"gather", "dimension 0", "index -4"});
  expect_error([] { index_select(f64({3, 4}), 2, i64({0}, {1})); }, {"gather", "dimension 2", "[3, 4]"});
  expect_error([] { index_select(f64({3, 4}), 0, f64({1})); }, {"gather", "i32 or i64", "f64[1]"});
  expect_error([] { gather(f64({3, 4}), 1, i64({0, 1}, {2})); }, {"gather_elements", "[2]", "2 dimensions", "[3, 4]"});
  expect_error([] { gather(f64({3, 4}), 1, i64({0, 1, 0, 1, 0, 1, 0, 1}, {4, 2})); },
               {"gather_elements", "[4, 2]", "[3, 4]", "dimension 0"});
  expect_error([] { gather(f64({3, 4}), 0, i64({3, 0}, {1, 2})); }, {"gather_elements", "dimension 0", "index 3"});
  expect_error([] { scatter_add(f64({3, 4}), 1, i64({0, 1}, {1, 2}), f64({2, 1})); },
               {"scatter_add", "[2, 1]", "[1, 2]", "shape"});
  expect_error([] { scatter_add(f64({3, 4}), 1, i64({0, 9}, {1, 2}), f64({1, 2})); },
               {"scatter_add", "dimension 1", "[3, 4]", "index 9"});
  expect_error([] { scatter_elements(f64({3, 4}), i64({5}, {1, 1}), f64({1, 1}), 0); },
               {"scatter_elements", "dimension 0", "index 5"});
  expect_error([] { one_hot(i64({1}, {1}), 3, 2); }, {"one_hot", "axis 2", "2 dimensions"});
  expect_error([] { one_hot(f64({1}), 3); }, {"one_hot", "i32 or i64"});
}

TEST(ShapeErrors, RepeatPadRearrange) {
  expect_error([] { tile(f64({2}), {-1}); }, {"tile", "negative", "dimension 0"});
  expect_error([] { upsample_nearest(f64({2, 2}), {2}); }, {"upsample", "1 scales", "[2, 2]"});
  expect_error([] { upsample_nearest(f64({2, 2}), {1, 0}); }, {"upsample", "scale 0", "dimension 1"});
  expect_error([] { pad(f64({2, 3}), {1, 1}); }, {"pad", "2 pads", "[2, 3]", "needs 4"});
  expect_error([] { pad(f64({2, 3}), {0, 3, 0, 0}, PadMode::Reflect); }, {"pad", "reflect", "dimension 1", "extent 3"});
  expect_error([] { pad(f64({2, 0}), {0, 1, 0, 0}, PadMode::Edge); }, {"pad", "dimension 1", "empty"});
  expect_error([] { pad(f64({2, 3}), {0, -1, 0, 0}); }, {"pad", "negative", "dimension 1"});
  expect_error([] { depth_to_space(f64({1, 6, 2, 2}), 2); }, {"depth_to_space", "[1, 6, 2, 2]", "2 x 2"});
  expect_error([] { space_to_depth(f64({1, 1, 3, 2}), 2); }, {"space_to_depth", "[1, 1, 3, 2]"});
  expect_error([] { constant_of_shape({2, -1}); }, {"constant_of_shape", "negative", "[2, -1]"});
}

TEST(ShapeErrors, Products) {
  expect_error([] { matmul(f64({2, 3}), f64({4, 2})); }, {"matmul", "[2, 3]", "[4, 2]", "inner"});
  expect_error([] { matmul(f64({2, 2, 3}), f64({3, 3, 2})); }, {"matmul", "[2, 2, 3]", "[3, 3, 2]", "broadcast"});
  expect_error([] { matmul(f64({}), f64({3})); }, {"matmul", "0-dimensional"});
  expect_error([] { gemm(f64({2, 3}), f64({2, 3}), Tensor()); }, {"gemm", "[2, 3]", "inner"});
  expect_error([] { gemm(f64({2, 3}), f64({3, 4}), f64({3})); }, {"gemm", "C", "[3]", "[2, 4]"});
  expect_error([] { linear(f64({2, 3, 4}), f64({5, 3}), Tensor()); }, {"linear", "[2, 3, 4]", "4 features", "[5, 3]"});
}

}  // namespace
}  // namespace tandem
