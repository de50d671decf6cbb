#pragma once
// The data loader: shuffles, shards by rank, batches, and prepares batches on a background thread.
#include <cstdint>
#include <functional>
#include <memory>

#include "tandem/data/dataset.h"
#include "tandem/device.h"
#include "tandem/tensor.h"

namespace tandem::data {

/// One mini-batch.
struct Batch {
  Tensor x;  // f32 [B, C, H, W], pixels scaled to [0, 1], on the loader's device
  Tensor y;  // i32 [B] on the loader's device
  /// Set by a loader with on_device and deferred_fill: queues the gather of this batch into x and y.
  /// Run it (or record it inside a step that reads the batch) once per batch, in the order next()
  /// handed them out, before x and y are read. Empty when next() has filled them already.
  std::function<void()> fill;
};

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int rank = 0, world_size = 1;  // this process's shard
  Device device = Device::cpu();
  int prefetch = 2;  // batches prepared ahead by the background thread
  /// next() uploads into the Batch's own tensors when their shape, dtype and device fit (the upload
  /// is queued after the work already queued on them), instead of allocating new ones: a recorded
  /// training step then reads each batch where it was recorded. Off: every batch is a new tensor.
  bool reuse_buffers = false;
  /// Keep the whole data set (its u8 pixels and labels) on the device: each batch is then gathered
  /// and scaled there by one kernel, from the epoch's order uploaded once per epoch, instead of being
  /// converted on the host by the background thread and uploaded. The batches are the same bits
  /// either way. Costs the data set's size in device memory (every rank holds all of it).
  bool on_device = false;
  /// With on_device: next() does not gather the batch but hands Batch::fill to the caller, who may
  /// record the gather into a step that replays it. Each gather finds its place in the epoch's order
  /// on the device (a cursor it advances), so a replay of the same recorded gather reads the next batch.
  bool deferred_fill = false;
};

/// Iterates over one rank's shard of a data set in batches. A background thread gathers and converts
/// the next `prefetch` batches while the caller trains; next() uploads them to the device (or, with
/// on_device, gathers them from the device's copy of the data set).
/// One caller thread uses a loader at a time.
class DataLoader {
 public:
  /// Validates the options, keeps handles to the data set's tensors (no pixel copy) and starts the
  /// background thread; call start_epoch before next().
  DataLoader(const Dataset& ds, LoaderOptions opt);
  /// Stops the background thread cleanly, also mid-epoch.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Starts an epoch: with shuffle, a permutation of all N samples drawn from (seed, epoch) — the
  /// same on every rank — then rank r takes the contiguous slice [r*S, (r+1)*S) of it, S = N / W
  /// (the remainder is dropped, as the guide's data_partition does, but a different one each
  /// epoch). Without shuffle, the slice of the data in order. Abandons any unfinished epoch.
  /// `first_batch` > 0 starts the epoch at that batch, as if the ones before it had been handed out
  /// (resuming a run that stopped inside an epoch).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  /// The next batch of the epoch; false when the epoch is over. Rethrows a failure of preparation.
  bool next(Batch& out);
  /// Batches in one epoch of this rank.
  int64_t batches_per_epoch() const;
  /// Samples of this rank's shard delivered per epoch (without those dropped by drop_last).
  int64_t samples_per_epoch() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tandem::data
