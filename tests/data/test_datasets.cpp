// Loading MNIST-format and CIFAR-10 data sets by name, from synthetic files and the installed package.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "data_test_util.h"
#include "tandem/data/dataset.h"

namespace tandem::data {
namespace {

using testutil::Bytes;
using testutil::expect_input_error;
using testutil::TempDir;

// Writes an MNIST-format split of n samples: image i is filled from seed i, label i is i % 10.
struct IdxSet {
  Bytes images, labels;
};
IdxSet make_idx_set(uint32_t n, uint32_t side = 28) {
  IdxSet s;
  Bytes px = testutil::noise(size_t{n} * side * side, 11);
  Bytes lb(n);
  for (uint32_t i = 0; i < n; ++i) lb[i] = static_cast<uint8_t>(i % 10);
  s.images = testutil::idx_bytes({n, side, side}, px);
  s.labels = testutil::idx_bytes({n}, lb);
  return s;
}

TEST(Datasets, NamesAndDefaultDirs) {
  const char* set = std::getenv("TANDEM_DATA_DIR");
  const std::string saved = set ? set : "";
  unsetenv("TANDEM_DATA_DIR");
  std::vector<std::string> names = dataset_names();
  EXPECT_EQ(names, (std::vector<std::string>{"mnist", "fashion-mnist", "cifar10"}));
  EXPECT_EQ(default_data_dir("fashion-mnist"), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(default_data_dir("mnist"), "/usr/share/datasets/mnist");
  EXPECT_EQ(default_data_dir("cifar10"), "/usr/share/datasets/cifar10");
  expect_input_error([] { default_data_dir("imagenet"); }, {"imagenet", "mnist, fashion-mnist, cifar10"});
  // TANDEM_DATA_DIR names the directory that holds one directory per data set.
  setenv("TANDEM_DATA_DIR", "/data/sets", 1);
  EXPECT_EQ(default_data_dir("fashion-mnist"), "/data/sets/fashion-mnist");
  setenv("TANDEM_DATA_DIR", "", 1);
  EXPECT_EQ(default_data_dir("mnist"), "/usr/share/datasets/mnist");
  if (set) setenv("TANDEM_DATA_DIR", saved.c_str(), 1); else unsetenv("TANDEM_DATA_DIR");
}

TEST(Datasets, UnknownNameListsValidOnes) {
  expect_input_error([] { load_dataset("svhn", "", true); }, {"svhn", "mnist, fashion-mnist, cifar10"});
}

TEST(Datasets, MnistFromMixedRawAndGzipFiles) {
  TempDir dir;
  IdxSet train = make_idx_set(30);
  IdxSet test = make_idx_set(12);
  testutil::write_file(dir.file("train-images-idx3-ubyte"), train.images);
  testutil::write_file(dir.file("train-labels-idx1-ubyte.gz"), testutil::gzip(train.labels));
  testutil::write_file(dir.file("t10k-images-idx3-ubyte.gz"), testutil::gzip(test.images));
  testutil::write_file(dir.file("t10k-labels-idx1-ubyte"), test.labels);

  Dataset ds = load_dataset("mnist", dir.path(), true);
  EXPECT_EQ(ds.name, "mnist");
  EXPECT_EQ(ds.num_classes, 10);
  EXPECT_EQ(ds.size(), 30);
  EXPECT_EQ(ds.images.shape(), (Shape{30, 1, 28, 28}));
  EXPECT_EQ(ds.images.dtype(), DType::u8);
  EXPECT_EQ(ds.labels.dtype(), DType::i32);
  EXPECT_EQ(ds.labels.shape(), (Shape{30}));
  Bytes px(train.images.begin() + 16, train.images.end());
  EXPECT_EQ(ds.images.to_vector<uint8_t>(), px);
  std::vector<int32_t> labels = ds.labels.to_vector<int32_t>();
  for (int32_t i = 0; i < 30; ++i) EXPECT_EQ(labels[static_cast<size_t>(i)], i % 10);

  Dataset t = load_dataset("mnist", dir.path(), false);
  EXPECT_EQ(t.size(), 12);
  EXPECT_EQ(t.images.to_vector<uint8_t>(), Bytes(test.images.begin() + 16, test.images.end()));
}

TEST(Datasets, UncompressedPreferredWhenBothExist) {
  TempDir dir;
  IdxSet good = make_idx_set(5);
  testutil::write_file(dir.file("train-images-idx3-ubyte"), good.images);
  testutil::write_file(dir.file("train-labels-idx1-ubyte"), good.labels);
  testutil::write_file(dir.file("train-images-idx3-ubyte.gz"), {1, 2, 3});  // would fail if read
  testutil::write_file(dir.file("train-labels-idx1-ubyte.gz"), {1, 2, 3});
  EXPECT_EQ(load_dataset("fashion-mnist", dir.path(), true).size(), 5);
}

TEST(Datasets, MissingDirectoryTellsHowToFix) {
  TempDir dir;
  std::string missing = dir.file("nowhere");
  expect_input_error([&] { load_dataset("fashion-mnist", missing, true); },
                     {missing, "apt-get install dataset-fashion-mnist", "--data-dir"});
  expect_input_error([&] { load_dataset("mnist", missing, false); }, {missing, "--data-dir"});
}

TEST(Datasets, MissingFileIsNamed) {
  TempDir dir;
  IdxSet s = make_idx_set(5);
  testutil::write_file(dir.file("train-images-idx3-ubyte"), s.images);
  expect_input_error([&] { load_dataset("fashion-mnist", dir.path(), true); },
                     {dir.file("train-labels-idx1-ubyte"), "apt-get install dataset-fashion-mnist"});
}

TEST(Datasets, ImageLabelCountMismatch) {
  TempDir dir;
  IdxSet s = make_idx_set(6);
  IdxSet other = make_idx_set(7);
  testutil::write_file(dir.file("train-images-idx3-ubyte"), s.images);
  testutil::write_file(dir.file("train-labels-idx1-ubyte"), other.labels);
  expect_input_error([&] { load_dataset("mnist", dir.path(), true); },
                     {dir.file("train-images-idx3-ubyte"), dir.file("train-labels-idx1-ubyte"), "6 images", "7 labels"});
}

TEST(Datasets, CountsComparedBeforeAnyImageIsInflated) {
  // The images header announces 1,000 images but only 64 KiB of pixels follow, then garbage: were
  // the images inflated before the counts were compared, the error would be about corrupt data.
  TempDir dir;
  Bytes images = testutil::idx_bytes({1000, 28, 28}, Bytes(size_t{64} << 10, 0));
  Bytes gz = testutil::gzip(images);
  Bytes junk = testutil::noise(4096, 3);
  gz.resize(gz.size() - 8);  // drop the trailer, then the deflate data is followed by junk
  gz.insert(gz.end(), junk.begin(), junk.end());
  testutil::write_file(dir.file("t10k-images-idx3-ubyte.gz"), gz);
  testutil::write_file(dir.file("t10k-labels-idx1-ubyte"), make_idx_set(7).labels);
  expect_input_error([&] { load_dataset("mnist", dir.path(), false); }, {"1000 images", "7 labels"});
}

TEST(Datasets, LabelOutOfRange) {
  TempDir dir;
  IdxSet s = make_idx_set(6);
  s.labels.back() = 10;  // sample 5
  testutil::write_file(dir.file("t10k-images-idx3-ubyte"), s.images);
  testutil::write_file(dir.file("t10k-labels-idx1-ubyte.gz"), testutil::gzip(s.labels));
  expect_input_error([&] { load_dataset("mnist", dir.path(), false); },
                     {dir.file("t10k-labels-idx1-ubyte.gz"), "label 10", "sample 5", "[0, 10)"});
}

TEST(Datasets, LabelsFileWhereImagesBelong) {
  TempDir dir;
  IdxSet s = make_idx_set(6);
  testutil::write_file(dir.file("train-images-idx3-ubyte"), s.labels);
  testutil::write_file(dir.file("train-labels-idx1-ubyte"), s.labels);
  expect_input_error([&] { load_dataset("mnist", dir.path(), true); },
                     {dir.file("train-images-idx3-ubyte"), "0x00000803"});
}

TEST(Datasets, UnexpectedImageDims) {
  TempDir dir;
  IdxSet s = make_idx_set(6, 27);
  testutil::write_file(dir.file("train-images-idx3-ubyte"), s.images);
  testutil::write_file(dir.file("train-labels-idx1-ubyte"), s.labels);
  expect_input_error([&] { load_dataset("mnist", dir.path(), true); },
                     {dir.file("train-images-idx3-ubyte"), "[6, 27, 27]", "[N, 28, 28]"});
}

// ---- CIFAR-10

// n records: record i has label (i + seed) % 10 and pixels from noise(seed * 1000 + i).
Bytes cifar_file(int n, int seed, Bytes* pixels = nullptr, std::vector<int32_t>* labels = nullptr) {
  Bytes out;
  for (int i = 0; i < n; ++i) {
    auto label = static_cast<uint8_t>((i + seed) % 10);
    Bytes px = testutil::noise(3072, static_cast<uint32_t>(seed * 1000 + i));
    out.push_back(label);
    out.insert(out.end(), px.begin(), px.end());
    if (pixels) pixels->insert(pixels->end(), px.begin(), px.end());
    if (labels) labels->push_back(label);
  }
  return out;
}

TEST(Cifar10, TrainSplitFromNestedDirectory) {
  TempDir dir;
  std::filesystem::path nested = std::filesystem::path(dir.path()) / "cifar-10-batches-bin";
  std::filesystem::create_directory(nested);
  Bytes pixels;
  std::vector<int32_t> labels;
  for (int b = 1; b <= 5; ++b)
    testutil::write_file((nested / ("data_batch_" + std::to_string(b) + ".bin")).string(),
                         cifar_file(b + 1, b, &pixels, &labels));
  Dataset ds = load_dataset("cifar10", dir.path(), true);
  EXPECT_EQ(ds.name, "cifar10");
  EXPECT_EQ(ds.num_classes, 10);
  EXPECT_EQ(ds.images.shape(), (Shape{20, 3, 32, 32}));
  EXPECT_EQ(ds.images.to_vector<uint8_t>(), pixels);
  EXPECT_EQ(ds.labels.to_vector<int32_t>(), labels);
}

TEST(Cifar10, TestSplitFromFlatDirectory) {
  TempDir dir;
  Bytes pixels;
  std::vector<int32_t> labels;
  testutil::write_file(dir.file("test_batch.bin"), cifar_file(4, 7, &pixels, &labels));
  Dataset ds = load_dataset("cifar10", dir.path(), false);
  EXPECT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.images.to_vector<uint8_t>(), pixels);
  EXPECT_EQ(ds.labels.to_vector<int32_t>(), labels);
  // The training split needs its five files.
  expect_input_error([&] { load_dataset("cifar10", dir.path(), true); }, {dir.file("data_batch_1.bin")});
}

TEST(Cifar10, TruncatedRecord) {
  TempDir dir;
  Bytes f = cifar_file(3, 0);
  f.resize(f.size() - 10);
  testutil::write_file(dir.file("test_batch.bin"), f);
  expect_input_error([&] { load_dataset("cifar10", dir.path(), false); },
                     {dir.file("test_batch.bin"), "truncated", "9219", "9209"});
}

TEST(Cifar10, LabelOutOfRange) {
  TempDir dir;
  Bytes f = cifar_file(3, 0);
  f[2 * 3073] = 10;
  testutil::write_file(dir.file("test_batch.bin"), f);
  expect_input_error([&] { load_dataset("cifar10", dir.path(), false); },
                     {dir.file("test_batch.bin"), "label 10", "record 2"});
}

// ---- the real Fashion-MNIST (Debian package dataset-fashion-mnist)

TEST(FashionMnist, InstalledPackageLoads) {
  const std::string dir = default_data_dir("fashion-mnist");
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " not installed (apt-get install dataset-fashion-mnist)";
  auto t0 = std::chrono::steady_clock::now();
  Dataset train = load_dataset("fashion-mnist", "", true);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fashion-mnist training split loaded in %.3f s\n", secs);
  EXPECT_LT(secs, 5.0);  // about 0.2 s; the bound only catches a pathological slowdown
  Dataset test = load_dataset("fashion-mnist", dir, false);
  EXPECT_EQ(train.images.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(test.images.shape(), (Shape{10000, 1, 28, 28}));
  EXPECT_EQ(train.labels.shape(), (Shape{60000}));
  EXPECT_EQ(test.labels.shape(), (Shape{10000}));
  // Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
  std::vector<int64_t> count_train(10), count_test(10);
  for (int32_t l : train.labels.to_vector<int32_t>()) {
    ASSERT_TRUE(l >= 0 && l < 10) << l;
    ++count_train[static_cast<size_t>(l)];
  }
  for (int32_t l : test.labels.to_vector<int32_t>()) {
    ASSERT_TRUE(l >= 0 && l < 10) << l;
    ++count_test[static_cast<size_t>(l)];
  }
  EXPECT_EQ(count_train, std::vector<int64_t>(10, 6000));
  EXPECT_EQ(count_test, std::vector<int64_t>(10, 1000));
  // Real images: not blank, and using the whole byte range.
  std::vector<uint8_t> first = train.images.narrow(0, 0, 1).to_vector<uint8_t>();
  uint8_t lo = 255, hi = 0;
  for (uint8_t v : first) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_EQ(lo, 0);
  EXPECT_GT(hi, 200);
}

}  // namespace
}  // namespace tandem::data
