// Tensor basics: factories, views, narrowing, transposition, conversions and copies.
#include <gtest/gtest.h>

#include <numeric>

#include "tandem/tensor.h"

namespace tandem {
namespace {

std::vector<double> iota_values(int64_t n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 0.0);
  return v;
}

TEST(Tensor, FactoriesAndMetadata) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.str(), "f32[2, 3, 4] on cpu");
  EXPECT_EQ(Tensor::ones({3}, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(Tensor::full({2}, -2.5, DType::f64).to_vector<double>(), (std::vector<double>{-2.5, -2.5}));
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(Tensor::empty({2, -1}), Error);
  Tensor scalar = Tensor::full({}, 4.0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.item<float>(), 4.0f);
}

TEST(Tensor, FromVectorAndToVector) {
  Tensor t = Tensor::from_vector<int32_t>({1, -2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::i32);
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 4, 5, 6}));
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1, -2, 3, 4, 5, 6}));
  EXPECT_THROW(Tensor::from_vector<float>({1.f, 2.f}, {3}), Error);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_THROW(t.item<int32_t>(), Error);
}

TEST(Tensor, FillAndClone) {
  Tensor t = Tensor::empty({5}, DType::f64);
  t.fill_(1.25);
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(5, 1.25));
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage(t));
  c.zero_();
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(5, 1.25));
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>(5, 0.0));
}

TEST(Tensor, ViewSharesStorage) {
  Tensor t = Tensor::from_vector(iota_values(12), {3, 4});
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.shape(), (Shape{2, 6}));
  EXPECT_TRUE(v.shares_storage(t));
  v.fill_(7.0);
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(12, 7.0));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.transpose(0, 1).view({12}), Error);
}

TEST(Tensor, NarrowIsAnOffsetView) {
  Tensor t = Tensor::from_vector(iota_values(24), {4, 6});
  Tensor rows = t.narrow(0, 1, 2);  // rows 1..2: still contiguous
  EXPECT_EQ(rows.shape(), (Shape{2, 6}));
  EXPECT_EQ(rows.storage_offset(), 6);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.to_vector<double>()[0], 6.0);
  rows.fill_(-1.0);  // writes through to the base tensor
  auto base = t.to_vector<double>();
  EXPECT_EQ(base[5], 5.0);
  EXPECT_EQ(base[6], -1.0);
  EXPECT_EQ(base[17], -1.0);
  EXPECT_EQ(base[18], 18.0);
  Tensor cols = t.narrow(1, 2, 3);  // a strided view
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.to_vector<double>(), (std::vector<double>{2, 3, 4, -1, -1, -1, -1, -1, -1, 20, 21, 22}));
  EXPECT_THROW(t.narrow(1, 4, 3), Error);
  EXPECT_THROW(t.narrow(2, 0, 1), Error);
}

TEST(Tensor, TransposeAndContiguous) {
  Tensor t = Tensor::from_vector(iota_values(6), {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_EQ(tt.strides(), (Shape{1, 3}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_TRUE(tt.shares_storage(t));
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(t.contiguous().is_same(t));  // already contiguous: the same tensor
  // Transposing back restores the original element order.
  EXPECT_EQ(c.transpose(0, 1).contiguous().to_vector<double>(), iota_values(6));
}

TEST(Tensor, DtypeRoundTrips) {
  const std::vector<double> v{0.0, 1.5, -3.25, 1024.0, 0.0078125};
  Tensor f32 = Tensor::from_vector(v, {5}).to(DType::f32);
  EXPECT_TRUE(f32.to(DType::f32).is_same(f32));
  for (DType mid : {DType::f64, DType::f16, DType::bf16})
    EXPECT_EQ(f32.to(mid).to(DType::f32).to_vector<double>(), v) << dtype_name(mid);
  Tensor i64 = Tensor::from_vector<int64_t>({-5, 0, 7, 1 << 20}, {4});
  EXPECT_EQ(i64.to(DType::i32).to(DType::i64).to_vector<int64_t>(), i64.to_vector<int64_t>());
  EXPECT_EQ(i64.to(DType::f64).to(DType::i64).to_vector<int64_t>(), i64.to_vector<int64_t>());
  Tensor u8 = Tensor::from_vector<uint8_t>({0, 1, 255}, {3});
  EXPECT_EQ(u8.to(DType::f32).to_vector<float>(), (std::vector<float>{0, 1, 255}));
  // Rounding: f32 -> f16 keeps 11 significant bits.
  Tensor third = Tensor::full({1}, 1.0 / 3.0, DType::f32);
  EXPECT_NEAR(third.to(DType::f16).item<double>(), 1.0 / 3.0, 1.0 / 2048);
  EXPECT_NE(third.to(DType::f16).item<double>(), third.item<double>());
}

TEST(Tensor, CopyBetweenDtypesAndLayouts) {
  Tensor src = Tensor::from_vector(iota_values(6), {2, 3});
  Tensor dst = Tensor::empty({3, 2}, DType::i32);
  dst.copy_(src.transpose(0, 1));
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  Tensor same = Tensor::empty({6});
  same.copy_(src);  // same count, other shape and dtype
  EXPECT_EQ(same.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(same.copy_(Tensor::zeros({5})), Error);
  EXPECT_THROW(src.transpose(0, 1).copy_(src), Error);  // the destination must be contiguous
}

TEST(Tensor, DetachCutsOffAutograd) {
  Tensor x = Tensor::ones({2});
  x.requires_grad_();
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.shares_storage(x));
  EXPECT_TRUE(x.is_leaf());
}

TEST(Tensor, ShapeHelpers) {
  EXPECT_EQ(shape_str({64, 1, 28, 28}), "[64, 1, 28, 28]");
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({3, 0, 2}), 0);
}

TEST(Tensor, EmptyTensorsAreHandled) {
  Tensor e = Tensor::zeros({0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.to_vector<float>().empty());
  EXPECT_EQ(e.to(DType::f64).numel(), 0);
  EXPECT_EQ(e.clone().shape(), (Shape{0, 3}));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Shapes whose element or byte count does not fit 64 bits are refused with an input error before
// anything is computed from them (under UBSan, a wrapped product would be reported).
TEST(Tensor, ShapesTooLargeToCountAreInputErrors) {
  const int64_t big = int64_t(1) << 40;
  for (const Shape& s : {Shape{big, big}, Shape{big, 1 << 20, 1 << 20}, Shape{INT64_MAX, 2}}) {
    try {
      (void)Tensor::empty(s, DType::f32);
      FAIL() << shape_str(s) << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
      EXPECT_NE(std::string(e.what()).find("64-bit"), std::string::npos) << e.what();
    }
  }
  // Elements that fit, bytes that do not.
  EXPECT_THROW((void)Tensor::empty({int64_t(1) << 62}, DType::f64), Error);
  // An extent of 0 makes any shape empty, however large the others.
  Tensor empty = Tensor::empty({0, big, big}, DType::f32);
  EXPECT_EQ(empty.numel(), 0);
  // A view to a shape that cannot be counted is refused too.
  Tensor t = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW((void)t.view({big, big}), Error);
}

}  // namespace
}  // namespace tandem

#include "tandem/graph.h"

namespace tandem {
namespace {

// Recording needs a CUDA device; on the CPU the error says so (and the CLI runs such steps eagerly).
TEST(DeviceGraphCpu, TheCpuCannotRecordAndSaysSo) {
  EXPECT_FALSE(DeviceGraph::supported(Device::cpu()));
  try {
    DeviceGraph g(Device::cpu(), [] {});
    FAIL() << "a CPU recording was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(Tensor, ViewsWithUncountableShapesAreInputErrors) {
  const int64_t big = int64_t(1) << 40;
  Tensor t = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW((void)t.view({big, big, -1}), Error);
  EXPECT_THROW((void)t.view({-1, big, big}), Error);
  Tensor e = Tensor::zeros({0}, DType::f32);
  EXPECT_EQ(e.view({0, big, big}).numel(), 0);
  EXPECT_EQ(t.view({2, -1}).size(1), 2);
}

}  // namespace
}  // namespace tandem
