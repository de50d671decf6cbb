#pragma once
// Labelled image data sets (MNIST, Fashion-MNIST, CIFAR-10) read from their standard files.
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/tensor.h"

namespace tandem::data {

/// A labelled image set held in host memory.
struct Dataset {
  std::string name;      // "fashion-mnist", "mnist", "cifar10"
  Tensor images;         // u8 [N, C, H, W] on the CPU
  Tensor labels;         // i32 [N] on the CPU
  int64_t num_classes = 0;
  /// Number of samples (0 for an empty, default-constructed set).
  int64_t size() const;
};

/// Reads one IDX file (gzip-compressed or raw, detected from the content) as a u8 tensor of its dims.
Tensor read_idx(const std::string& path);

/// Loads a data set by name ("mnist", "fashion-mnist", "cifar10") from dir, or from the default
/// directory when dir is empty; train selects the training or the test split.
Dataset load_dataset(const std::string& name, const std::string& dir, bool train);

/// Where a data set is looked for by default: $TANDEM_DATA_DIR/<name> when that variable is set, else
/// /usr/share/datasets/<name> (fashion-mnist: the Debian package dataset-fashion-mnist).
std::string default_data_dir(const std::string& name);

/// Names accepted by load_dataset.
std::vector<std::string> dataset_names();

}  // namespace tandem::data
