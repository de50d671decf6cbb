// DataLoader: a producer thread gathers, converts and queues batches; the caller uploads them. With
// on_device, the data set lives on the device and next() gathers each batch there instead.
#include "tandem/data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/counter_rng.h"
#include "tandem/random.h"

namespace tandem::data {

namespace {

// A batch prepared in host memory, or the failure that prevented it.
struct Prepared {
  Tensor x, y;
  std::exception_ptr error;
};

// Decorrelates the per-epoch streams of one seed (epoch e and seed s+1 must not collide).
uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  return rng::mix(seed ^ 0x243F6A8885A308D3ull, static_cast<uint64_t>(epoch));
}

// The epoch's order of all n samples: with shuffle, a Fisher-Yates permutation drawn from (seed, epoch),
// the same on every rank.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  if (shuffle) {
    Generator gen(epoch_seed(seed, epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      auto j = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(i + 1)));
      std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(j)]);
    }
  }
  return all;
}

// Labels outside [0, classes) are stopped before they reach a loss kernel (a hand-built Dataset is
// never scanned when loaded).
void check_label(const Dataset& ds, int64_t sample, int32_t label) {
  TANDEM_CHECK(label >= 0 && label < ds.num_classes, "data set ", ds.name, ": label ", label, " of sample ", sample,
               " is outside [0, ", ds.num_classes, ")");
}

}  // namespace

struct DataLoader::State {
  Dataset ds;
  LoaderOptions opt;
  int64_t sample_numel = 0;  // C*H*W
  int64_t shard = 0;         // samples of this rank per epoch, before drop_last
  int64_t num_batches = 0;

  std::mutex mu;
  std::condition_variable work_cv;   // the worker waits for room in the queue or a new epoch
  std::condition_variable ready_cv;  // next() waits for a prepared batch
  bool stop = false;
  bool started = false;
  uint64_t generation = 0;  // bumped by start_epoch; stale batches of an older one are dropped
  std::shared_ptr<const std::vector<int64_t>> order;  // this rank's samples, in epoch order
  int64_t to_prepare = 0;   // next batch index the worker prepares
  int64_t consumed = 0;     // batches handed out by next()
  std::deque<Prepared> queue;
  std::thread worker;

  std::exception_ptr worker_error;  // the worker itself failed and has stopped

  // on_device: the data set's copy on the device and this epoch's order of this rank's samples
  // (rewritten in place each epoch: a recorded gather keeps reading it), and where the next gather
  // starts in it (i64 [2], see Backend::gather_samples).
  Tensor images_dev, labels_dev, order_dev, cursor_dev;

  // The next epoch's order, drawn on another thread while this epoch trains (a shuffle of 60,000
  // samples takes about a millisecond, during which the device would otherwise wait).
  std::future<std::vector<int64_t>> next_order;
  int64_t next_order_epoch = -1;

  Prepared prepare(int64_t b, const std::vector<int64_t>& idx) const;
  // Whether next() may write a batch of this shape and dtype into dst instead of a new tensor.
  bool reusable(const Tensor& dst, const Shape& shape, DType dtype) const {
    return opt.reuse_buffers && dst.defined() && dst.shape() == shape && dst.dtype() == dtype &&
           dst.device() == opt.device && dst.is_contiguous();
  }
  void produce();
  void run();
};

// Gathers the batch's samples into a pinned buffer, scaled to [0, 1], so the upload can be asynchronous.
Prepared DataLoader::State::prepare(int64_t b, const std::vector<int64_t>& idx) const {
  const int64_t begin = b * opt.batch_size;
  const int64_t n = std::min(opt.batch_size, shard - begin);
  Shape xs = ds.images.shape();
  xs[0] = n;
  Prepared p;
  p.x = Tensor::empty_pinned(xs, DType::f32);
  p.y = Tensor::empty_pinned({n}, DType::i32);
  const uint8_t* images = ds.images.data<uint8_t>();
  const int32_t* labels = ds.labels.data<int32_t>();
  float* x = p.x.data<float>();
  int32_t* y = p.y.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = idx[static_cast<size_t>(begin + i)];
    check_label(ds, s, labels[s]);
    y[i] = labels[s];
    const uint8_t* src = images + s * sample_numel;
    float* dst = x + i * sample_numel;
    for (int64_t j = 0; j < sample_numel; ++j) dst[j] = static_cast<float>(src[j]) / 255.0f;
  }
  return p;
}

void DataLoader::State::run() {
  try {
    produce();
  } catch (...) {
    // Only bookkeeping can land here (preparation failures travel with their batch); next() reports it.
    std::lock_guard<std::mutex> lk(mu);
    worker_error = std::current_exception();
    ready_cv.notify_all();
  }
}

void DataLoader::State::produce() {
  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    work_cv.wait(lk, [&] {
      return stop || (started && to_prepare < num_batches && static_cast<int64_t>(queue.size()) < opt.prefetch);
    });
    if (stop) return;
    const uint64_t gen = generation;
    const int64_t b = to_prepare++;
    std::shared_ptr<const std::vector<int64_t>> idx = order;
    lk.unlock();
    Prepared p;
    try {
      p = prepare(b, *idx);
    } catch (...) {
      p = Prepared{};
      p.error = std::current_exception();
    }
    lk.lock();
    if (gen != generation) continue;  // start_epoch superseded this batch
    if (p.error) to_prepare = num_batches;  // the epoch ends with the failure
    queue.push_back(std::move(p));
    ready_cv.notify_one();
  }
}

DataLoader::DataLoader(const Dataset& ds, LoaderOptions opt) : s_(std::make_unique<State>()) {
  const std::string who = ds.name.empty() ? std::string("data loader") : "data loader for " + ds.name;
  TANDEM_CHECK(ds.images.defined() && ds.labels.defined(), who, ": the data set has no images or labels");
  TANDEM_CHECK(ds.images.dtype() == DType::u8 && ds.images.dim() == 4 && ds.images.device().is_cpu(), who,
               ": images must be u8 [N, C, H, W] on the CPU, got ", ds.images.str());
  TANDEM_CHECK(ds.labels.dtype() == DType::i32 && ds.labels.dim() == 1 && ds.labels.device().is_cpu(), who,
               ": labels must be i32 [N] on the CPU, got ", ds.labels.str());
  TANDEM_CHECK(ds.images.is_contiguous() && ds.labels.is_contiguous(), who, ": images and labels must be contiguous");
  TANDEM_CHECK(ds.labels.size(0) == ds.images.size(0), who, ": ", ds.images.size(0), " images but ",
               ds.labels.size(0), " labels");
  TANDEM_CHECK(ds.num_classes >= 1, who, ": num_classes must be at least 1, got ", ds.num_classes);
  TANDEM_CHECK(opt.batch_size >= 1, who, ": batch_size must be at least 1, got ", opt.batch_size);
  TANDEM_CHECK(opt.world_size >= 1, who, ": world_size must be at least 1, got ", opt.world_size);
  TANDEM_CHECK(opt.rank >= 0 && opt.rank < opt.world_size, who, ": rank ", opt.rank, " is outside [0, ",
               opt.world_size, ")");
  TANDEM_CHECK(opt.prefetch >= 1, who, ": prefetch must be at least 1, got ", opt.prefetch);
  check_device(opt.device);
  const int64_t n = ds.size();
  const int64_t shard = n / opt.world_size;
  TANDEM_CHECK(shard >= 1, who, ": ", n, " samples cannot give each of ", opt.world_size,
               " ranks a shard of at least one sample");
  const int64_t batches = opt.drop_last ? shard / opt.batch_size : (shard + opt.batch_size - 1) / opt.batch_size;
  TANDEM_CHECK(batches >= 1, who, ": with drop_last, batch_size ", opt.batch_size, " exceeds the ", shard,
               " samples of a rank's shard, so an epoch would have no batch");

  State& s = *s_;
  s.ds = ds;
  s.opt = opt;
  s.sample_numel = ds.images.numel() / std::max<int64_t>(n, 1);
  s.shard = shard;
  s.num_batches = batches;
  if (opt.on_device) {
    TANDEM_CHECK(n <= INT32_MAX, who, ": ", n, " samples are too many to keep on the device (at most 2^31 - 1)");
    // The background thread checks each batch's labels as it converts them; here no batch passes
    // through the host, so every label is checked once, before any reaches a loss kernel.
    const int32_t* labels = ds.labels.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) check_label(ds, i, labels[i]);
    s.images_dev = ds.images.to(opt.device);
    s.labels_dev = ds.labels.to(opt.device);
    s.order_dev = Tensor::empty({shard}, DType::i32, opt.device);
    s.cursor_dev = Tensor::zeros({2}, DType::i64, opt.device);
    return;
  }
  s.worker = std::thread([&s] { s.run(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->stop = true;
  }
  s_->work_cv.notify_all();
  if (s_->worker.joinable()) s_->worker.join();
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  State& s = *s_;
  TANDEM_CHECK(first_batch >= 0 && first_batch <= s.num_batches, "data loader: cannot start an epoch at batch ",
               first_batch, " of ", s.num_batches);
  const int64_t n = s.ds.size();
  // Every sample is permuted, so all ranks draw the same order and their slices are disjoint.
  std::vector<int64_t> all;
  if (s.next_order.valid()) {
    std::vector<int64_t> drawn = s.next_order.get();
    if (s.next_order_epoch == epoch) all = std::move(drawn);
  }
  if (all.empty()) all = epoch_order(n, s.opt.shuffle, s.opt.seed, epoch);
  if (s.opt.shuffle) {
    s.next_order_epoch = epoch + 1;
    s.next_order = std::async(std::launch::async, epoch_order, n, true, s.opt.seed, epoch + 1);
  }
  const int64_t begin = s.opt.rank * s.shard;
  if (s.opt.on_device) {
    // Queued on the device's stream after the batches already gathered from the previous order.
    Tensor order = Tensor::empty({s.shard}, DType::i32);
    int32_t* o = order.data<int32_t>();
    for (int64_t i = 0; i < s.shard; ++i) o[i] = static_cast<int32_t>(all[static_cast<size_t>(begin + i)]);
    s.order_dev.copy_(order);
    s.cursor_dev.copy_(Tensor::from_vector(std::vector<int64_t>{first_batch * s.opt.batch_size, 0}, {2}));
    s.consumed = first_batch;
    s.started = true;
    return;
  }
  auto order = std::make_shared<const std::vector<int64_t>>(all.begin() + begin, all.begin() + begin + s.shard);
  {
    std::lock_guard<std::mutex> lk(s.mu);
    ++s.generation;
    s.order = std::move(order);
    s.queue.clear();
    s.to_prepare = first_batch;
    s.consumed = first_batch;
    s.started = true;
  }
  s.work_cv.notify_all();
}

bool DataLoader::next(Batch& out) {
  State& s = *s_;
  if (s.opt.on_device) {
    TANDEM_CHECK(s.started, "DataLoader::next called before start_epoch");
    if (s.consumed >= s.num_batches) return false;
    const int64_t begin = s.consumed++ * s.opt.batch_size;
    const int64_t n = std::min(s.opt.batch_size, s.shard - begin);
    Shape xs = s.ds.images.shape();
    xs[0] = n;
    auto fit = [&](Tensor& t, const Shape& shape, DType dtype) {
      if (!s.reusable(t, shape, dtype)) t = Tensor::empty(shape, dtype, s.opt.device);
    };
    fit(out.x, xs, DType::f32);
    fit(out.y, {n}, DType::i32);
    out.fill = [&s, x = out.x, y = out.y]() mutable {
      backend::backend_for(s.opt.device).gather_samples(s.images_dev, s.labels_dev, s.order_dev, s.cursor_dev, 255.0f, x, y);
    };
    if (!s.opt.deferred_fill) {
      out.fill();
      out.fill = nullptr;
    }
    return true;
  }
  out.fill = nullptr;
  Prepared p;
  {
    std::unique_lock<std::mutex> lk(s.mu);
    TANDEM_CHECK(s.started, "DataLoader::next called before start_epoch");
    if (s.consumed >= s.num_batches) return false;
    s.ready_cv.wait(lk, [&] { return !s.queue.empty() || s.worker_error; });
    if (s.queue.empty()) std::rethrow_exception(s.worker_error);
    p = std::move(s.queue.front());
    s.queue.pop_front();
    ++s.consumed;
    if (p.error) s.consumed = s.num_batches;
  }
  s.work_cv.notify_one();
  if (p.error) std::rethrow_exception(p.error);
  // The pinned host buffer is released once the upload has been queued; reusing it safely before an
  // asynchronous copy finishes is the pinned allocator's job.
  auto upload = [&](Tensor& dst, const Tensor& src) {
    if (s.reusable(dst, src.shape(), src.dtype()))
      dst.copy_(src);
    else
      dst = src.to(s.opt.device);
  };
  upload(out.x, p.x);
  upload(out.y, p.y);
  return true;
}

int64_t DataLoader::batches_per_epoch() const { return s_->num_batches; }

int64_t DataLoader::samples_per_epoch() const {
  return s_->opt.drop_last ? s_->num_batches * s_->opt.batch_size : s_->shard;
}

}  // namespace tandem::data
