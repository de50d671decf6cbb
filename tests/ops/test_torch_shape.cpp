// Reductions, shape and indexing ops and products against PyTorch's values and gradients
// (tests/fixtures/pytorch/shape.json, written by tests/fixtures/make_shape.py).
#include <cmath>

#include "torch_fixture.h"

namespace tandem::testing {
namespace {

using Ts = std::vector<Tensor>;
using Dims = std::vector<int64_t>;
using nlohmann::json;

const std::vector<FixtureCase>& cases() {
  static const std::vector<FixtureCase> c = load_fixtures("shape");
  return c;
}

void check(const std::string& name, const FixtureFn& fn) {
  const FixtureCase* c = find_case(cases(), name);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(check_case(*c, fn));
}

Dims dims(const json& a, const char* key = "dims") { return a.at(key).get<Dims>(); }
bool keepdim(const json& a) { return a.at("keepdim").get<bool>(); }
int64_t num(const json& a, const char* key) { return a.at(key).is_null() ? kOpen : a.at(key).get<int64_t>(); }

TEST(TorchShape, Reductions) {
  auto summed = [](const Ts& x, const json& a) { return Ts{sum(x[0], dims(a), keepdim(a))}; };
  for (const char* n : {"sum_dims_keepdim", "sum_noncontiguous", "sum_size1_dim", "sum_empty_dim"}) check(n, summed);
  auto averaged = [](const Ts& x, const json& a) { return Ts{mean(x[0], dims(a), keepdim(a))}; };
  for (const char* n : {"mean_negative_dim", "mean_apart_dims"}) check(n, averaged);
}

TEST(TorchShape, ExtremesShareTheGradientOfTies) {
  auto largest = [](const Ts& x, const json& a) { return Ts{amax(x[0], dims(a), keepdim(a))}; };
  auto smallest = [](const Ts& x, const json& a) { return Ts{amin(x[0], dims(a), keepdim(a))}; };
  check("amax_ties", largest);
  check("amin_ties_keepdim", smallest);
  check("amax_all_ties", largest);
  check("amax_apart_dims", largest);
  check("amin_noncontiguous", smallest);
  check("argmax_first_of_ties",
        [](const Ts& x, const json& a) { return Ts{argmax(x[0], a.at("dim").get<int64_t>(), keepdim(a))}; });
  check("argmin_keepdim",
        [](const Ts& x, const json& a) { return Ts{argmin(x[0], a.at("dim").get<int64_t>(), keepdim(a))}; });
  check("argmax_inner",
        [](const Ts& x, const json& a) { return Ts{argmax(x[0], a.at("dim").get<int64_t>(), keepdim(a))}; });
}

TEST(TorchShape, VarianceLogSumExpProduct) {
  auto variance = [](const Ts& x, const json& a) {
    return Ts{var(x[0], dims(a), a.at("unbiased").get<bool>(), keepdim(a))};
  };
  check("var_unbiased", variance);
  check("var_biased_apart_dims", variance);
  auto lse = [](const Ts& x, const json& a) { return Ts{logsumexp(x[0], dims(a), keepdim(a))}; };
  for (const char* n : {"logsumexp", "logsumexp_apart_dims"}) check(n, lse);
  auto product = [](const Ts& x, const json& a) { return Ts{prod(x[0], dims(a), keepdim(a))}; };
  check("prod_with_zeros", product);
  check("prod_apart_dims", product);
}

// JSON holds no NaN or infinity: PyTorch's values over empty dimensions, as PyTorch 1.13 gives them.
TEST(TorchShape, EmptyReductions) {
  Tensor e = Tensor::zeros({0, 3}, DType::f64);
  for (double v : mean(e, {0}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  for (double v : var(e, {0}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  for (double v : logsumexp(e, {0}).to_vector<double>()) EXPECT_EQ(v, -INFINITY);
  EXPECT_EQ(prod(e, {0}).to_vector<double>(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(sum(e, {0}, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(amax(e, {1}).shape(), (Shape{0}));  // nothing to reduce into: no error
  Tensor single = Tensor::from_vector(std::vector<double>{2.0}, {1});
  EXPECT_TRUE(std::isnan(var(single, {0}).to_vector<double>()[0]));  // one element, unbiased
  EXPECT_EQ(var(single, {0}, false).to_vector<double>()[0], 0.0);
}

TEST(TorchShape, Views) {
  check("reshape_noncontiguous", [](const Ts& x, const json& a) { return Ts{reshape(x[0], a.at("shape").get<Shape>())}; });
  check("reshape_split_dim", [](const Ts& x, const json& a) { return Ts{reshape(x[0], a.at("shape").get<Shape>())}; });
  check("transpose", [](const Ts& x, const json& a) {
    return Ts{transpose(x[0], a.at("d0").get<int64_t>(), a.at("d1").get<int64_t>())};
  });
  check("permute_noncontiguous", [](const Ts& x, const json& a) { return Ts{permute(x[0], dims(a, "perm"))}; });
  check("squeeze", [](const Ts& x, const json& a) { return Ts{squeeze(x[0], dims(a))}; });
  check("squeeze_all", [](const Ts& x, const json& a) { return Ts{squeeze(x[0], dims(a))}; });
  check("unsqueeze", [](const Ts& x, const json& a) { return Ts{unsqueeze(x[0], dims(a))}; });
  check("split_lengths",
        [](const Ts& x, const json& a) { return split(x[0], dims(a, "lengths"), a.at("dim").get<int64_t>()); });
  check("chunk_uneven", [](const Ts& x, const json& a) {
    return chunk(x[0], a.at("parts").get<int64_t>(), a.at("dim").get<int64_t>());
  });
}

TEST(TorchShape, SlicesWithSteps) {
  auto sliced = [](const Ts& x, const json& a) {
    return Ts{strided_slice(x[0], a.at("dim").get<int64_t>(), num(a, "start"), num(a, "end"), a.at("step").get<int64_t>())};
  };
  for (const char* n : {"slice_step", "slice_negative_step", "slice_negative_bounds", "slice_clipped_empty"})
    check(n, sliced);
  check("slice_ranges", [](const Ts& x, const json& a) {
    return Ts{slice_ranges(x[0], dims(a, "starts"), dims(a, "ends"), dims(a, "axes"), dims(a, "steps"))};
  });
}

TEST(TorchShape, GathersAndScatters) {
  // i64 indices as stored, and the same as i32.
  for (DType it : {DType::i64, DType::i32}) {
    auto selected = [it](const Ts& x, const json& a) {
      return Ts{index_select(x[0], a.at("dim").get<int64_t>(), x[1].to(it))};
    };
    for (const char* n : {"index_select_repeated", "index_select_dim1_noncontiguous", "index_select_inner"})
      check(n, selected);
    auto gathered = [it](const Ts& x, const json& a) { return Ts{gather(x[0], a.at("dim").get<int64_t>(), x[1].to(it))}; };
    check("gather_elements", gathered);
    check("gather_elements_dim0", gathered);
    auto added = [it](const Ts& x, const json& a) {
      return Ts{scatter_add(x[0], a.at("dim").get<int64_t>(), x[1].to(it), x[2])};
    };
    check("scatter_add_repeated", added);
    check("scatter_add_smaller_index", added);
    auto written = [it](const Ts& x, const json& a) {
      return Ts{scatter_elements(x[0], x[1].to(it), x[2], a.at("dim").get<int64_t>())};
    };
    check("scatter_elements", written);
    check("scatter_elements_dim1", written);
    auto hot = [it](const Ts& x, const json& a) {
      return Ts{one_hot(x[0].to(it), a.at("depth").get<int64_t>(), a.at("axis").get<int64_t>(), 0.0, 1.0, DType::f64)};
    };
    check("one_hot", hot);
    check("one_hot_axis0", hot);
  }
  check("nonzero", [](const Ts& x, const json&) { return Ts{nonzero(x[0])}; });
}

TEST(TorchShape, RepeatPadRearrange) {
  check("tile", [](const Ts& x, const json& a) { return Ts{tile(x[0], dims(a, "repeats"))}; });
  check("tile_shorter_repeats", [](const Ts& x, const json& a) { return Ts{tile(x[0], dims(a, "repeats"))}; });
  check("upsample_nearest", [](const Ts& x, const json& a) { return Ts{upsample_nearest(x[0], dims(a, "scales"))}; });
  auto padded = [](const Ts& x, const json& a) {
    const std::string m = a.at("mode").get<std::string>();
    const PadMode mode = m == "reflect" ? PadMode::Reflect : m == "edge" ? PadMode::Edge : PadMode::Constant;
    return Ts{pad(x[0], dims(a, "pads"), mode, a.at("value").get<double>())};
  };
  for (const char* n : {"pad_constant", "pad_reflect", "pad_edge"}) check(n, padded);
  auto d2s = [](const Ts& x, const json& a) {
    return Ts{depth_to_space(x[0], a.at("blocksize").get<int64_t>(), a.at("crd").get<bool>())};
  };
  auto s2d = [](const Ts& x, const json& a) {
    return Ts{space_to_depth(x[0], a.at("blocksize").get<int64_t>(), a.at("crd").get<bool>())};
  };
  check("depth_to_space_dcr", d2s);
  check("depth_to_space_crd", d2s);
  check("space_to_depth_dcr", s2d);
  check("space_to_depth_crd", s2d);
  auto cos = [](const Ts& x, const json& a) { return Ts{cosine_similarity(x[0], x[1], a.at("dim").get<int64_t>())}; };
  check("cossim", cos);
  check("cossim_zero_row", cos);
  check("ranking_loss",
        [](const Ts& x, const json& a) { return Ts{ranking_loss(x[0], x[1], a.at("margin").get<double>())}; });
}

TEST(TorchShape, Products) {
  auto product = [](const Ts& x, const json&) { return Ts{matmul(x[0], x[1])}; };
  for (const char* n : {"matmul_broadcast_batch", "matmul_vector_left", "matmul_vector_right", "matmul_dot",
                        "matmul_rows_one_matrix", "matmul_transposed_batch", "matmul_transposed_batch_right",
                        "matmul_one_matrix_left", "matmul_empty_batch", "matmul_empty_inner"})
    check(n, product);
  auto g = [](const Ts& x, const json& a) {
    return Ts{gemm(x[0], x[1], x.size() > 2 ? x[2] : Tensor(), a.at("alpha").get<double>(), a.at("beta").get<double>(),
                   a.at("transA").get<bool>(), a.at("transB").get<bool>())};
  };
  for (const char* n : {"gemm_c_broadcast", "gemm_c_column", "gemm_no_c"}) check(n, g);
  auto lin = [](const Ts& x, const json&) { return Ts{linear(x[0], x[1], x[2])}; };
  for (const char* n : {"linear_nd", "linear_vector", "linear_nd_noncontiguous"}) check(n, lin);
}

}  // namespace
}  // namespace tandem::testing
