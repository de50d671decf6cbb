// CUDA backend: device discovery, copies, conversions between every pair of dtypes, fills, random
// fills, batches gathered from a data set on the device, the pinned allocator's reuse rule and the
// deferred label error.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "cuda/cuda_test_util.h"
#include "tandem/data/loader.h"
#include "tandem/ops.h"

namespace tandem {
namespace {

using namespace cudatest;

const DType kAllDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};

TEST(CudaMemory, RoundTripThroughTheDevice) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  ASSERT_NE(backend::cuda_backend(), nullptr);
  std::vector<float> v(1003);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 100.0f;
  Tensor g = Tensor::from_vector(v, {17, 59}, gpu());
  EXPECT_EQ(g.device(), gpu());
  EXPECT_EQ(g.to_vector<float>(), v);
  Tensor back = g.cpu();
  EXPECT_EQ(back.to_vector<float>(), v);
  // Device-to-device copy_ of a whole tensor.
  Tensor h = Tensor::empty({17, 59}, DType::f32, gpu());
  h.copy_(g);
  EXPECT_EQ(h.to_vector<float>(), v);
}

TEST(CudaMemory, DeviceAllocatorReusesFreedBlocks) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Allocator& a = gpu_be().allocator(0);
  const size_t size = (size_t(123) << 20) + 7;  // a rounded size no other test uses
  void* p = a.allocate(size);
  ASSERT_NE(p, nullptr);
  a.deallocate(p, size);
  void* q = a.allocate(size - 6);  // the same rounded size: the cached block comes back
  EXPECT_EQ(p, q);
  a.deallocate(q, size - 6);
}

// Values every dtype holds without undefined conversions: non-negative, in u8's range for integer
// targets, with fractions and ties that exercise the 16-bit roundings.
Tensor conversion_source(DType dt, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x = static_cast<double>((i * 37) % 251);
    if (is_floating(dt)) x += static_cast<double>((i * 13) % 1000) / 1000.0 + 1.0 / 3.0;
    v[static_cast<size_t>(i)] = std::min(x, 254.9);
  }
  return Tensor::from_vector(v, shape).to(dt);
}

void check_all_pairs(const Shape& shape, const std::function<Tensor(const Tensor&)>& view, const char* kind) {
  for (DType s : kAllDtypes) {
    Tensor src_cpu = conversion_source(s, shape);
    Tensor src_gpu = src_cpu.to(gpu());
    for (DType d : kAllDtypes) {
      Tensor expected = Tensor::empty(view(src_cpu).shape(), d);
      expected.copy_(view(src_cpu));
      Tensor actual = Tensor::empty(view(src_gpu).shape(), d, gpu());
      actual.copy_(view(src_gpu));
      expect_same_bytes(expected, actual,
                        std::string(kind) + " " + dtype_name(s) + " -> " + dtype_name(d));
    }
  }
}

TEST(CudaMemory, ConvertsBetweenEveryPairOfDtypesLikeTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  check_all_pairs({3, 70, 5}, [](const Tensor& t) { return t; }, "contiguous");
  check_all_pairs({3, 70, 5}, [](const Tensor& t) { return t.transpose(0, 2); }, "transposed");
  check_all_pairs({3, 70, 5}, [](const Tensor& t) { return t.narrow(1, 3, 41).narrow(2, 1, 3); }, "narrowed");
  check_all_pairs({4, 1, 6, 9}, [](const Tensor& t) { return t.transpose(1, 3).narrow(0, 1, 2); }, "mixed");
}

TEST(CudaMemory, RoundsWideValuesLikeTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // Large integers round through double then float into the 16-bit formats; big floats overflow f16.
  std::vector<int64_t> big = {(int64_t(1) << 40) + 12345, (int64_t(1) << 53) + 1, 70000, 65519, 65520, -3, 2049, 4097};
  Tensor bi = Tensor::from_vector(big, {8});
  std::vector<float> fl = {1e30f, -7.5e4f, 1.00048828125f, 3.0517578125e-05f, 1e-8f, 0.1f, -0.0f, 65504.0f};
  Tensor bf = Tensor::from_vector(fl, {8});
  for (const Tensor& src : {bi, bf}) {
    for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      expect_same_bytes(src.to(d), src.to(gpu()).to(d), std::string("wide ") + dtype_name(src.dtype()) + " -> " +
                                                                dtype_name(d));
    }
  }
}

TEST(CudaMemory, FillsEveryDtypeLikeTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (DType d : kAllDtypes) {
    for (double v : {0.0, 1.5, 3.0, 200.0, 1e5}) {
      if (d == DType::u8 && v > 255) continue;
      Tensor e = Tensor::full({1001}, v, d);
      Tensor a = Tensor::full({1001}, v, d, gpu());
      expect_same_bytes(e, a, std::string("fill ") + dtype_name(d) + " " + std::to_string(v));
    }
  }
  Tensor neg = Tensor::full({5, 7}, -2.25, DType::f32, gpu());
  for (float x : neg.to_vector<float>()) EXPECT_EQ(x, -2.25f);
}

TEST(CudaMemory, RandomUniformEqualsTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (int64_t n : {1, 31, 1000, 300001}) {
    Generator gc(1234), gg(1234);
    for (int rep = 0; rep < 2; ++rep) {  // the second fill starts at a later counter
      Tensor c = Tensor::uniform({n}, -0.5, 2.5, gc);
      Tensor g = Tensor::uniform({n}, -0.5, 2.5, gg, DType::f32, gpu());
      expect_same_bytes(c, g, "uniform n=" + std::to_string(n));
    }
    EXPECT_EQ(gc.offset(), gg.offset());
  }
}

TEST(CudaMemory, RandomNormalMatchesTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (int64_t n : {1, 999, 200000}) {
    Generator gc(99), gg(99);
    Tensor c = Tensor::normal({n}, 0.5, 2.0, gc);
    Tensor g = Tensor::normal({n}, 0.5, 2.0, gg, DType::f32, gpu());
    expect_close(c, g, 1e-6, 1e-6, "normal n=" + std::to_string(n));
  }
}

TEST(CudaMemory, DropoutMaskEqualsTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (double p : {0.1, 0.5, 0.9}) {
    Tensor mc = Tensor::empty({513, 7});
    Tensor mg = Tensor::empty({513, 7}, DType::f32, gpu());
    cpu_be().dropout_mask(mc, 77, 1000, p);
    gpu_be().dropout_mask(mg, 77, 1000, p);
    expect_same_bytes(mc, mg, "dropout p=" + std::to_string(p));
  }
  // Through the op: the same generator state gives the same mask on both devices.
  Generator gc(5), gg(5);
  Tensor x = rand_cpu({64, 33}, 3);
  expect_same_bytes(dropout(x, 0.3, true, gc), dropout(x.to(gpu()), 0.3, true, gg), "dropout op");
}

TEST(CudaMemory, PinnedBlockIsNotReusedWhileAnUploadFromItIsQueued) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Allocator* pinned = gpu_be().pinned_allocator();
  ASSERT_NE(pinned, nullptr);
  const size_t bytes = (size_t(64) << 20) + 12345;  // a size no other test uses
  const int64_t floats = static_cast<int64_t>(bytes / sizeof(float));

  // Keep the stream busy so the upload below is still queued when the block is released.
  const int64_t m = 8192;
  Tensor a = Tensor::full({m, m}, 0.001, DType::f32, gpu());
  Tensor c = Tensor::empty({m, m}, DType::f32, gpu()), d = Tensor::empty({m, m}, DType::f32, gpu());
  gpu_be().gemm(false, false, m, m, m, 1.0, a, a, 0.0, c);
  gpu_be().gemm(false, false, m, m, m, 1.0, c, a, 0.0, d);

  auto* first = static_cast<float*>(pinned->allocate(bytes));
  ASSERT_NE(first, nullptr);
  for (int64_t i = 0; i < floats; ++i) first[i] = static_cast<float>(i % 1000);
  Tensor dev = Tensor::empty({floats}, DType::f32, gpu());
  gpu_be().copy_from_host(first, dev.data_ptr(), static_cast<size_t>(floats) * sizeof(float), 0);
  pinned->deallocate(first, bytes);

  auto* second = static_cast<float*>(pinned->allocate(bytes));
  EXPECT_NE(first, second) << "a pinned block was handed out while an upload from it was still queued";
  for (int64_t i = 0; i < floats; ++i) second[i] = -1.0f;  // must not disturb the queued upload

  synchronize(gpu());
  std::vector<float> got = dev.to_vector<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < floats; ++i) bad += got[static_cast<size_t>(i)] != static_cast<float>(i % 1000);
  EXPECT_EQ(bad, 0);

  // Once the upload is done, the released block is handed out again.
  void* third = pinned->allocate(bytes);
  EXPECT_EQ(third, first);
  pinned->deallocate(third, bytes);
  pinned->deallocate(second, bytes);
}

TEST(CudaMemory, PinnedTensorsUploadCorrectly) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (int round = 0; round < 5; ++round) {
    Tensor host = Tensor::empty_pinned({4096});
    float* p = host.data<float>();
    for (int i = 0; i < 4096; ++i) p[i] = static_cast<float>(round * 10000 + i);
    Tensor dev = host.to(gpu());
    host = Tensor();  // released while the upload may still be queued
    std::vector<float> got = dev.to_vector<float>();
    for (int i = 0; i < 4096; i += 511) EXPECT_EQ(got[static_cast<size_t>(i)], static_cast<float>(round * 10000 + i));
  }
}

TEST(CudaMemory, LabelOutOfRangeIsReportedAtTheNextSynchronisation) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Tensor logits = rand_cpu({6, 10}, 8).to(gpu());
  Tensor bad = Tensor::from_vector<int64_t>({1, 2, 10, 3, 4, 5}, {6}, gpu());
  Tensor loss = softmax_cross_entropy(logits, bad);  // no host sync: nothing thrown yet
  try {
    synchronize(gpu());
    ADD_FAILURE() << "synchronize did not report the label outside [0, 10)";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find("label 10"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("outside [0, 10)"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::isnan(loss.item<float>()));  // the error was consumed: this copy succeeds

  // A copy to the host reports it too, and negative labels count.
  Tensor neg = Tensor::from_vector<int32_t>({1, -1, 0, 3, 4, 5}, {6}, gpu());
  Tensor loss2 = softmax_cross_entropy(logits, neg);
  EXPECT_THROW(loss2.item<float>(), Error);

  // Good labels afterwards work normally.
  Tensor good = Tensor::from_vector<int64_t>({1, 2, 9, 3, 4, 5}, {6}, gpu());
  Tensor loss3 = softmax_cross_entropy(logits, good);
  EXPECT_NO_THROW(synchronize(gpu()));
  EXPECT_TRUE(std::isfinite(loss3.item<float>()));
}

TEST(CudaMemory, AnotherThreadUploadsWhileThisOneComputes) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::atomic<int> bad{0};
  std::thread loader([&] {
    for (int round = 0; round < 20; ++round) {
      std::vector<float> v(10000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(round * 7 + static_cast<int>(i));
      Tensor t = Tensor::from_vector(v, {10000}, gpu());
      if (t.to_vector<float>() != v) ++bad;
    }
  });
  Tensor a = rand_cpu({256, 256}, 40), b = rand_cpu({256, 256}, 41);
  Tensor expected = Tensor::empty({256, 256});
  cpu_be().gemm(false, false, 256, 256, 256, 1.0, a, b, 0.0, expected);
  Tensor ag = a.to(gpu()), bg = b.to(gpu());
  for (int i = 0; i < 50; ++i) {
    Tensor c = Tensor::empty({256, 256}, DType::f32, gpu());
    gpu_be().gemm(false, false, 256, 256, 256, 1.0, ag, bg, 0.0, c);
    if (i % 10 == 0) expect_norm_close(expected, c, 1e-5, "gemm beside an uploading thread");
  }
  loader.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(CudaMemory, SecondDeviceComputesLikeTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  if (tandem::cuda_device_count() < 2) GTEST_SKIP() << "fewer than two CUDA GPUs";
  const Device d1 = Device::cuda(1);
  Tensor x = rand_cpu({8, 3, 12, 12}, 42), w = rand_cpu({5, 3, 3, 3}, 43), b = rand_cpu({5}, 44);
  Tensor yc = relu(conv2d(x, w, b, {{1, 1}, {1, 1}}));
  Tensor y1 = relu(conv2d(x.to(d1), w.to(d1), b.to(d1), {{1, 1}, {1, 1}}));
  EXPECT_EQ(y1.device(), d1);
  expect_norm_close(yc, y1, 1e-5, "conv on cuda:1");
  // Between devices: through cuda:0 and back.
  Tensor y0 = y1.to(gpu());
  EXPECT_EQ(y0.device(), gpu());
  expect_same_bytes(y1, y0, "cuda:1 -> cuda:0");
  Tensor logits = rand_cpu({16, 10}, 45);
  Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16});
  expect_close(softmax_cross_entropy(logits, labels), softmax_cross_entropy(logits.to(d1), labels.to(d1)), 1e-5,
               1e-7, "loss on cuda:1");
  synchronize(d1);
}

// The batch gather of a data set kept on the device, against the CPU backend's: samples whose size
// is a multiple of four bytes (read four at a time), odd ones, and ones spread over several blocks.
TEST(CudaMemory, GatherSamplesMatchesTheCpu) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const Shape& sample : {Shape{1, 4, 4}, Shape{1, 3, 3}, Shape{3, 32, 33}, Shape{3, 32, 32}}) {
    const int64_t n = 37, per = sample[0] * sample[1] * sample[2];
    std::vector<uint8_t> px(static_cast<size_t>(n * per));
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    std::vector<int32_t> labels(static_cast<size_t>(n)), order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      labels[static_cast<size_t>(i)] = static_cast<int32_t>(i * 3 % 10);
      order[static_cast<size_t>(i)] = static_cast<int32_t>((i * 11 + 5) % n);  // a permutation (11 and 37 coprime)
    }
    Tensor images = Tensor::from_vector(px, {n, sample[0], sample[1], sample[2]});
    Tensor lab = Tensor::from_vector(labels, {n}), ord = Tensor::from_vector(order, {n});
    // Two batches in a row from position 5: each call reads the position from the cursor and advances it.
    const int64_t begin = 5, b = 19, b2 = 13;
    Tensor cur_cpu = Tensor::from_vector(std::vector<int64_t>{begin, 0}, {2}), cur_gpu = cur_cpu.to(gpu());
    Tensor images_gpu = images.to(gpu()), lab_gpu = lab.to(gpu()), ord_gpu = ord.to(gpu());
    Tensor x_cpu = Tensor::empty({b, sample[0], sample[1], sample[2]}), y_cpu = Tensor::empty({b}, DType::i32);
    Tensor x2_cpu = Tensor::empty({b2, sample[0], sample[1], sample[2]}), y2_cpu = Tensor::empty({b2}, DType::i32);
    cpu_be().gather_samples(images, lab, ord, cur_cpu, 255.0f, x_cpu, y_cpu);
    cpu_be().gather_samples(images, lab, ord, cur_cpu, 255.0f, x2_cpu, y2_cpu);
    Tensor x_gpu = Tensor::empty(x_cpu.shape(), DType::f32, gpu()), y_gpu = Tensor::empty({b}, DType::i32, gpu());
    Tensor x2_gpu = Tensor::empty(x2_cpu.shape(), DType::f32, gpu()), y2_gpu = Tensor::empty({b2}, DType::i32, gpu());
    gpu_be().gather_samples(images_gpu, lab_gpu, ord_gpu, cur_gpu, 255.0f, x_gpu, y_gpu);
    gpu_be().gather_samples(images_gpu, lab_gpu, ord_gpu, cur_gpu, 255.0f, x2_gpu, y2_gpu);
    EXPECT_EQ(x_gpu.to_vector<float>(), x_cpu.to_vector<float>()) << shape_str(sample);
    EXPECT_EQ(y_gpu.to_vector<int32_t>(), y_cpu.to_vector<int32_t>()) << shape_str(sample);
    EXPECT_EQ(x2_gpu.to_vector<float>(), x2_cpu.to_vector<float>()) << shape_str(sample);
    EXPECT_EQ(y2_gpu.to_vector<int32_t>(), y2_cpu.to_vector<int32_t>()) << shape_str(sample);
    EXPECT_EQ(cur_cpu.to_vector<int64_t>(), (std::vector<int64_t>{begin + b + b2, 0}));
    EXPECT_EQ(cur_gpu.to_vector<int64_t>(), (std::vector<int64_t>{begin + b + b2, 0})) << shape_str(sample);
    // The CPU's reference itself: sample order[begin + i], scaled.
    const std::vector<float> xs = x_cpu.to_vector<float>(), xs2 = x2_cpu.to_vector<float>();
    for (int64_t i = 0; i < b + b2; ++i) {
      const int64_t s = order[static_cast<size_t>(begin + i)];
      const bool first = i < b;
      const int64_t row = first ? i : i - b;
      EXPECT_EQ((first ? y_cpu : y2_cpu).to_vector<int32_t>()[static_cast<size_t>(row)], labels[static_cast<size_t>(s)]);
      EXPECT_EQ((first ? xs : xs2)[static_cast<size_t>(row * per + per - 1)],
                static_cast<float>(px[static_cast<size_t>(s * per + per - 1)]) / 255.0f);
    }
  }
}

// A loader keeping its data set on the GPU hands out the host path's batches, bit for bit.
TEST(CudaMemory, LoaderOnDeviceMatchesTheHostPath) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const int64_t n = 301;
  data::Dataset ds;
  ds.name = "noise";
  ds.num_classes = 10;
  std::vector<uint8_t> px(static_cast<size_t>(n) * 784);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 40503u) >> 7);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
  ds.images = Tensor::from_vector(px, {n, 1, 28, 28});
  ds.labels = Tensor::from_vector(labels, {n});
  data::LoaderOptions host, kept;
  host.batch_size = kept.batch_size = 64;
  host.seed = kept.seed = 7;
  host.device = kept.device = gpu();
  host.reuse_buffers = kept.reuse_buffers = true;
  kept.on_device = true;
  data::DataLoader a(ds, host), b(ds, kept);
  for (int64_t epoch : {0, 1}) {
    a.start_epoch(epoch);
    b.start_epoch(epoch);
    data::Batch ba, bb;
    while (a.next(ba)) {
      ASSERT_TRUE(b.next(bb));
      EXPECT_TRUE(bb.x.device().is_cuda());
      EXPECT_EQ(bb.x.to_vector<float>(), ba.x.to_vector<float>());
      EXPECT_EQ(bb.y.to_vector<int32_t>(), ba.y.to_vector<int32_t>());
    }
    EXPECT_FALSE(b.next(bb));
  }
}

}  // namespace
}  // namespace tandem
