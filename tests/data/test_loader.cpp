// The DataLoader: sharding, shuffling, batching, scaling, prefetch thread lifetime and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <set>

#include "data_test_util.h"
#include "tandem/data/loader.h"

namespace tandem::data {
namespace {

using testutil::expect_input_error;

// n samples of [c, h, w]; sample i has label i (so labels identify samples) and pixel j = (7i + j) % 256.
Dataset numbered(int64_t n, int64_t c = 1, int64_t h = 2, int64_t w = 3) {
  Dataset ds;
  ds.name = "numbered";
  ds.num_classes = n;
  const int64_t per = c * h * w;
  std::vector<uint8_t> px(static_cast<size_t>(n * per));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < per; ++j) px[static_cast<size_t>(i * per + j)] = static_cast<uint8_t>((7 * i + j) % 256);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  ds.images = Tensor::from_vector(px, {n, c, h, w});
  ds.labels = Tensor::from_vector(labels, {n});
  return ds;
}

// The sample ids of one epoch, in order, and the sizes of its batches.
struct Epoch {
  std::vector<int32_t> ids;
  std::vector<int64_t> batch_sizes;
};
Epoch run_epoch(DataLoader& dl, int64_t epoch) {
  Epoch e;
  dl.start_epoch(epoch);
  Batch b;
  while (dl.next(b)) {
    std::vector<int32_t> y = b.y.to_vector<int32_t>();
    e.ids.insert(e.ids.end(), y.begin(), y.end());
    e.batch_sizes.push_back(b.x.size(0));
  }
  return e;
}

LoaderOptions opts(int64_t batch, int rank = 0, int world = 1, bool shuffle = true, uint64_t seed = 42) {
  LoaderOptions o;
  o.batch_size = batch;
  o.rank = rank;
  o.world_size = world;
  o.shuffle = shuffle;
  o.seed = seed;
  return o;
}

TEST(DataLoader, ShardsPartitionOnePermutation) {
  const int64_t n = 100;  // not divisible by 3
  Dataset ds = numbered(n);
  for (int world : {1, 2, 3}) {
    for (int64_t epoch : {0, 1, 7}) {
      DataLoader whole(ds, opts(9, 0, 1));
      std::vector<int32_t> perm = run_epoch(whole, epoch).ids;
      ASSERT_EQ(perm.size(), static_cast<size_t>(n));
      ASSERT_EQ(std::set<int32_t>(perm.begin(), perm.end()).size(), static_cast<size_t>(n));  // a permutation

      const int64_t shard = n / world;
      std::set<int32_t> seen;
      for (int r = 0; r < world; ++r) {
        DataLoader dl(ds, opts(9, r, world));
        EXPECT_EQ(dl.samples_per_epoch(), shard);
        std::vector<int32_t> ids = run_epoch(dl, epoch).ids;
        // Rank r holds exactly slice r of the shared permutation.
        std::vector<int32_t> expect(perm.begin() + r * shard, perm.begin() + (r + 1) * shard);
        EXPECT_EQ(ids, expect) << "world " << world << " rank " << r << " epoch " << epoch;
        for (int32_t id : ids) EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " on two ranks";
      }
      EXPECT_EQ(seen.size(), static_cast<size_t>(world * shard));  // the guide drops n % world
    }
  }
}

TEST(DataLoader, PermutationDependsOnSeedAndEpochOnly) {
  Dataset ds = numbered(200);
  DataLoader a(ds, opts(16, 0, 1, true, 5));
  DataLoader b(ds, opts(50, 0, 1, true, 5));  // batch size does not change the order
  DataLoader c(ds, opts(16, 0, 1, true, 6));
  std::vector<int32_t> a0 = run_epoch(a, 0).ids, a1 = run_epoch(a, 1).ids;
  EXPECT_EQ(a0, run_epoch(b, 0).ids);
  EXPECT_EQ(a1, run_epoch(b, 1).ids);
  EXPECT_EQ(a0, run_epoch(a, 0).ids);  // replaying an epoch gives it again
  EXPECT_NE(a0, a1);
  EXPECT_NE(a0, run_epoch(c, 0).ids);
  std::vector<int32_t> identity(200);
  for (int32_t i = 0; i < 200; ++i) identity[static_cast<size_t>(i)] = i;
  EXPECT_NE(a0, identity);
}

TEST(DataLoader, NoShuffleGivesTheRankSliceInOrder) {
  Dataset ds = numbered(10);
  for (int r = 0; r < 3; ++r) {
    DataLoader dl(ds, opts(2, r, 3, false));
    Epoch e0 = run_epoch(dl, 0), e1 = run_epoch(dl, 1);
    std::vector<int32_t> expect = {3 * r, 3 * r + 1, 3 * r + 2};
    EXPECT_EQ(e0.ids, expect);
    EXPECT_EQ(e1.ids, expect);
    EXPECT_EQ(e0.batch_sizes, (std::vector<int64_t>{2, 1}));
  }
}

TEST(DataLoader, PixelsScaledAndShaped) {
  Dataset ds = numbered(11, 3, 4, 5);
  DataLoader dl(ds, opts(4));
  dl.start_epoch(3);
  Batch b;
  int64_t total = 0;
  while (dl.next(b)) {
    ASSERT_EQ(b.x.dtype(), DType::f32);
    ASSERT_EQ(b.y.dtype(), DType::i32);
    ASSERT_TRUE(b.x.device().is_cpu());
    const int64_t bs = b.x.size(0);
    ASSERT_EQ(b.x.shape(), (Shape{bs, 3, 4, 5}));
    ASSERT_EQ(b.y.shape(), (Shape{bs}));
    std::vector<float> x = b.x.to_vector<float>();
    std::vector<int32_t> y = b.y.to_vector<int32_t>();
    for (int64_t i = 0; i < bs; ++i)
      for (int64_t j = 0; j < 60; ++j) {
        float v = x[static_cast<size_t>(i * 60 + j)];
        ASSERT_EQ(v, static_cast<float>((7 * y[static_cast<size_t>(i)] + j) % 256) / 255.0f);
        ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
      }
    total += bs;
  }
  EXPECT_EQ(total, 11);
}

TEST(DataLoader, FullRangeOfPixelValues) {
  Dataset ds;
  ds.name = "extremes";
  ds.num_classes = 1;
  ds.images = Tensor::from_vector(std::vector<uint8_t>{0, 255, 128, 1}, {1, 1, 2, 2});
  ds.labels = Tensor::from_vector(std::vector<int32_t>{0}, {1});
  DataLoader dl(ds, opts(1));
  dl.start_epoch(0);
  Batch b;
  ASSERT_TRUE(dl.next(b));
  EXPECT_EQ(b.x.to_vector<float>(), (std::vector<float>{0.0f, 1.0f, 128.0f / 255.0f, 1.0f / 255.0f}));
  EXPECT_FALSE(dl.next(b));
}

TEST(DataLoader, BatchCountsWithAndWithoutDropLast) {
  Dataset ds = numbered(100);
  DataLoader keep(ds, opts(7));
  EXPECT_EQ(keep.batches_per_epoch(), 15);
  EXPECT_EQ(keep.samples_per_epoch(), 100);
  Epoch e = run_epoch(keep, 0);
  ASSERT_EQ(e.batch_sizes.size(), 15u);
  EXPECT_EQ(e.batch_sizes.back(), 2);
  for (size_t i = 0; i + 1 < e.batch_sizes.size(); ++i) EXPECT_EQ(e.batch_sizes[i], 7);

  LoaderOptions o = opts(7);
  o.drop_last = true;
  DataLoader drop(ds, o);
  EXPECT_EQ(drop.batches_per_epoch(), 14);
  EXPECT_EQ(drop.samples_per_epoch(), 98);
  Epoch d = run_epoch(drop, 0);
  EXPECT_EQ(d.batch_sizes, std::vector<int64_t>(14, 7));
  // Same order, only the tail cut.
  EXPECT_TRUE(std::equal(d.ids.begin(), d.ids.end(), e.ids.begin()));

  o.batch_size = 10;  // divides evenly: drop_last changes nothing
  DataLoader even(ds, o);
  EXPECT_EQ(even.batches_per_epoch(), 10);
  EXPECT_EQ(run_epoch(even, 0).ids.size(), 100u);
}

TEST(DataLoader, EndOfEpochAndRestart) {
  Dataset ds = numbered(5);
  DataLoader dl(ds, opts(2));
  Batch b;
  expect_input_error([&] { dl.next(b); }, {"start_epoch"});
  dl.start_epoch(0);
  int got = 0;
  while (dl.next(b)) ++got;
  EXPECT_EQ(got, 3);
  EXPECT_FALSE(dl.next(b));  // stays over
  EXPECT_FALSE(dl.next(b));
}

TEST(DataLoader, StartEpochAbandonsAnUnfinishedOne) {
  Dataset ds = numbered(300);
  LoaderOptions o = opts(8);
  o.prefetch = 4;
  DataLoader fresh(ds, o);
  std::vector<int32_t> epoch5 = run_epoch(fresh, 5).ids;

  DataLoader dl(ds, o);
  dl.start_epoch(4);
  Batch b;
  ASSERT_TRUE(dl.next(b));
  ASSERT_TRUE(dl.next(b));
  EXPECT_EQ(run_epoch(dl, 5).ids, epoch5);
  // Restarting before taking anything, repeatedly, while the worker is busy.
  for (int i = 0; i < 20; ++i) dl.start_epoch(i);
  EXPECT_EQ(run_epoch(dl, 5).ids, epoch5);
}

TEST(DataLoader, BatchesOfAnAbandonedEpochNeverLeak) {
  // Big batches keep the worker busy for a while, so restarts land while it prepares an old batch.
  Dataset ds = numbered(2048, 1, 64, 64);
  LoaderOptions o = opts(256);
  DataLoader fresh(ds, o);
  std::vector<int32_t> epoch5 = run_epoch(fresh, 5).ids;
  DataLoader dl(ds, o);
  for (int i = 0; i < 30; ++i) {
    dl.start_epoch(100 + i);
    Batch b;
    ASSERT_TRUE(dl.next(b));  // frees a queue slot: the worker starts on another old batch
    ASSERT_EQ(run_epoch(dl, 5).ids, epoch5) << "round " << i;
  }
}

TEST(DataLoader, DestroyedMidEpochWithoutDeadlock) {
  Dataset ds = numbered(1000, 1, 8, 8);
  for (int i = 0; i < 50; ++i) {
    LoaderOptions o = opts(3);
    o.prefetch = 1 + i % 4;
    DataLoader dl(ds, o);
    if (i % 3 == 0) continue;  // never started
    dl.start_epoch(i);
    Batch b;
    for (int k = 0; k < i % 5; ++k) ASSERT_TRUE(dl.next(b));
    // Leaves with a full queue and the worker waiting, or mid-batch.
  }
  SUCCEED();
}

TEST(DataLoader, BatchOutlivesLoader) {
  Dataset ds = numbered(20);
  Batch b;
  {
    DataLoader dl(ds, opts(4, 0, 1, false));
    dl.start_epoch(0);
    ASSERT_TRUE(dl.next(b));
  }
  EXPECT_EQ(b.y.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(DataLoader, PreparationFailureReachesNext) {
  Dataset ds = numbered(20);
  std::vector<int32_t> labels = ds.labels.to_vector<int32_t>();
  labels[13] = 20;  // == num_classes
  ds.labels = Tensor::from_vector(labels, {20});
  DataLoader dl(ds, opts(4, 0, 1, false));
  for (int round = 0; round < 2; ++round) {
    dl.start_epoch(round);
    Batch b;
    ASSERT_TRUE(dl.next(b));  // samples 0-3
    ASSERT_TRUE(dl.next(b));
    ASSERT_TRUE(dl.next(b));  // 8-11
    expect_input_error([&] { dl.next(b); }, {"numbered", "label 20", "sample 13"});
    EXPECT_FALSE(dl.next(b));  // the failure ended the epoch
  }
}

TEST(DataLoader, OptionsValidated) {
  Dataset ds = numbered(10);
  auto with = [](auto change) {
    LoaderOptions o;
    change(o);
    return o;
  };
  expect_input_error([&] { DataLoader(ds, with([](LoaderOptions& o) { o.batch_size = 0; })); }, {"batch_size", "0"});
  expect_input_error([&] { DataLoader(ds, with([](LoaderOptions& o) { o.world_size = 0; })); }, {"world_size"});
  expect_input_error([&] { DataLoader(ds, with([](LoaderOptions& o) { o.rank = 2, o.world_size = 2; })); },
                     {"rank 2", "[0, 2)"});
  expect_input_error([&] { DataLoader(ds, with([](LoaderOptions& o) { o.rank = -1; })); }, {"rank -1"});
  expect_input_error([&] { DataLoader(ds, with([](LoaderOptions& o) { o.prefetch = 0; })); }, {"prefetch"});
  expect_input_error([&] { DataLoader(ds, with([](LoaderOptions& o) { o.world_size = 11; })); },
                     {"10 samples", "11 ranks"});
  expect_input_error(
      [&] { DataLoader(ds, with([](LoaderOptions& o) { o.world_size = 2, o.batch_size = 6, o.drop_last = true; })); },
      {"drop_last", "5 samples"});
  Dataset bad = ds;
  bad.images = ds.images.to(DType::f32);
  expect_input_error([&] { DataLoader(bad, LoaderOptions{}); }, {"u8"});
  bad = ds;
  bad.labels = ds.labels.narrow(0, 0, 9);
  expect_input_error([&] { DataLoader(bad, LoaderOptions{}); }, {"10 images", "9 labels"});
  expect_input_error([&] { DataLoader(Dataset{}, LoaderOptions{}); }, {"no images"});
  // The largest legal world: one sample each.
  LoaderOptions o;
  o.world_size = 10, o.rank = 9, o.shuffle = false;
  DataLoader last(ds, o);
  EXPECT_EQ(run_epoch(last, 0).ids, std::vector<int32_t>{9});
}

TEST(DataLoader, FashionSizedEpochIsCheap) {
  // 60,000 x 784 bytes like Fashion-MNIST: a batch of 64 must cost far less than a training step.
  const int64_t n = 60000;
  Dataset ds;
  ds.name = "synthetic";
  ds.num_classes = 10;
  ds.images = Tensor::from_vector(testutil::noise(static_cast<size_t>(n) * 784, 9), {n, 1, 28, 28});
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
  ds.labels = Tensor::from_vector(labels, {n});
  DataLoader dl(ds, opts(64));
  auto t0 = std::chrono::steady_clock::now();
  dl.start_epoch(0);
  Batch b;
  int64_t batches = 0;
  double checksum = 0;
  while (dl.next(b)) {
    ++batches;
    checksum += b.x.data<float>()[0];
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(batches, 938);
  EXPECT_GT(checksum, 0.0);
  std::printf("938 batches of 64 x 784 in %.3f s (%.1f us per batch)\n", secs, secs / 938 * 1e6);
  EXPECT_LT(secs / 938, 2e-3);  // about 50 us; the bound only catches a pathological slowdown
}

// Batches gathered from the device's copy of the data set are the host path's bits, on any device
// (the CPU here; tests/cuda compares a GPU's), for every rank, with and without reused buffers, and
// with a short last batch.
TEST(DataLoader, OnDeviceGivesTheSameBatches) {
  Dataset ds = numbered(103, 3, 4, 5);  // 60 values per sample: every u8 value appears
  for (bool reuse : {false, true}) {
    for (int world : {1, 2}) {
      for (int r = 0; r < world; ++r) {
        LoaderOptions host = opts(16, r, world), kept = opts(16, r, world);
        host.reuse_buffers = kept.reuse_buffers = reuse;
        kept.on_device = true;
        DataLoader a(ds, host), b(ds, kept);
        for (int64_t epoch : {0, 3}) {
          a.start_epoch(epoch);
          b.start_epoch(epoch);
          Batch ba, bb;
          int64_t batches = 0;
          while (a.next(ba)) {
            ASSERT_TRUE(b.next(bb));
            ++batches;
            EXPECT_EQ(bb.x.shape(), ba.x.shape());
            EXPECT_EQ(bb.x.to_vector<float>(), ba.x.to_vector<float>()) << "batch " << batches;
            EXPECT_EQ(bb.y.to_vector<int32_t>(), ba.y.to_vector<int32_t>()) << "batch " << batches;
          }
          EXPECT_FALSE(b.next(bb));
          EXPECT_EQ(batches, a.batches_per_epoch());
          EXPECT_EQ(bb.x.size(0), 103 / world - (103 / world - 1) / 16 * 16);  // the short last batch
        }
      }
    }
  }
}

// An epoch started at batch k (a run resumed inside an epoch) hands out what the whole epoch hands out
// from its batch k on, on the host and on the device, for every rank.
TEST(DataLoader, AnEpochStartedAtABatchContinuesTheWholeEpoch) {
  Dataset ds = numbered(103, 1, 2, 3);
  for (bool on_device : {false, true}) {
    for (int world : {1, 2}) {
      for (int r = 0; r < world; ++r) {
        LoaderOptions o = opts(8, r, world);
        o.on_device = on_device;
        DataLoader whole(ds, o), part(ds, o);
        const Epoch all = run_epoch(whole, 5);
        for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{3}, part.batches_per_epoch()}) {
          part.start_epoch(5, k);
          Batch b;
          std::vector<int32_t> ids;
          while (part.next(b)) {
            std::vector<int32_t> y = b.y.to_vector<int32_t>();
            ids.insert(ids.end(), y.begin(), y.end());
          }
          const size_t skip = static_cast<size_t>(std::min<int64_t>(k * 8, static_cast<int64_t>(all.ids.size())));
          EXPECT_EQ(ids, std::vector<int32_t>(all.ids.begin() + static_cast<std::ptrdiff_t>(skip), all.ids.end()))
              << "batch " << k << " rank " << r << " of " << world << (on_device ? " on the device" : "");
        }
        expect_input_error([&] { part.start_epoch(5, part.batches_per_epoch() + 1); }, {"cannot start an epoch"});
      }
    }
  }
}

TEST(DataLoader, OnDeviceReusesTheBatchTensors) {
  Dataset ds = numbered(40);
  LoaderOptions o = opts(8);
  o.on_device = o.reuse_buffers = true;
  DataLoader dl(ds, o);
  dl.start_epoch(0);
  Batch b;
  ASSERT_TRUE(dl.next(b));
  const void* x = b.x.data_ptr();
  const void* y = b.y.data_ptr();
  std::vector<int32_t> first = b.y.to_vector<int32_t>();
  ASSERT_TRUE(dl.next(b));
  EXPECT_EQ(b.x.data_ptr(), x);  // written in place, as a recorded step needs
  EXPECT_EQ(b.y.data_ptr(), y);
  EXPECT_NE(b.y.to_vector<int32_t>(), first);
}

// With deferred_fill, next() leaves the gather to Batch::fill; each fill takes the next batch of the
// epoch's order wherever it runs, so running the first batch's fill again (as a replay of a step that
// recorded it does) writes the second batch, and so on. The batches are those of the host path.
TEST(DataLoader, DeferredFillsTakeTheBatchesInOrder) {
  Dataset ds = numbered(50, 2, 3, 4);
  LoaderOptions host = opts(8), kept = opts(8);
  kept.on_device = kept.reuse_buffers = kept.deferred_fill = true;
  DataLoader a(ds, host), b(ds, kept);
  for (int64_t epoch : {0, 1}) {
    a.start_epoch(epoch);
    b.start_epoch(epoch);
    Batch ba, bb;
    std::function<void()> first_fill;  // the fill of the first full batch, run again for the later ones
    int64_t batches = 0;
    while (a.next(ba)) {
      ASSERT_TRUE(b.next(bb));
      ASSERT_TRUE(bb.fill) << "batch " << batches;
      if (!first_fill) first_fill = bb.fill;
      if (bb.x.size(0) == 8)
        first_fill();  // the same buffers: next() reuses them
      else
        bb.fill();  // the short last batch has its own
      ++batches;
      EXPECT_EQ(bb.x.to_vector<float>(), ba.x.to_vector<float>()) << "epoch " << epoch << " batch " << batches;
      EXPECT_EQ(bb.y.to_vector<int32_t>(), ba.y.to_vector<int32_t>()) << "epoch " << epoch << " batch " << batches;
    }
    EXPECT_FALSE(b.next(bb));
    EXPECT_EQ(batches, 7);
  }
  // Without deferred_fill the batch comes filled and says so.
  LoaderOptions direct = opts(8);
  direct.on_device = true;
  DataLoader c(ds, direct);
  c.start_epoch(0);
  Batch bc;
  ASSERT_TRUE(c.next(bc));
  EXPECT_FALSE(bc.fill);
}

TEST(DataLoader, OnDeviceChecksEveryLabelUpFront) {
  Dataset ds = numbered(20);
  std::vector<int32_t> labels = ds.labels.to_vector<int32_t>();
  labels[13] = -1;
  ds.labels = Tensor::from_vector(labels, {20});
  LoaderOptions o = opts(4);
  o.on_device = true;
  expect_input_error([&] { DataLoader dl(ds, o); }, {"numbered", "label -1", "sample 13"});
  o.on_device = false;  // the host path scans nothing up front: it finds the label when its batch is prepared
  EXPECT_NO_THROW(DataLoader(ds, o));
}

TEST(DataLoader, UploadsToCudaDevice) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  Dataset ds = numbered(50, 1, 4, 4);
  LoaderOptions host = opts(8), gpu = opts(8);
  gpu.device = Device::cuda(0);
  DataLoader a(ds, host), b(ds, gpu);
  a.start_epoch(2);
  b.start_epoch(2);
  Batch ba, bb;
  while (a.next(ba)) {
    ASSERT_TRUE(b.next(bb));
    EXPECT_TRUE(bb.x.device().is_cuda());
    EXPECT_TRUE(bb.y.device().is_cuda());
    EXPECT_EQ(bb.x.to_vector<float>(), ba.x.to_vector<float>());
    EXPECT_EQ(bb.y.to_vector<int32_t>(), ba.y.to_vector<int32_t>());
  }
  EXPECT_FALSE(b.next(bb));
}

}  // namespace
}  // namespace tandem::data
