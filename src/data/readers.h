#pragma once
// Internal: the IDX and CIFAR-10 file readers behind load_dataset, open to tests and fuzzers.
#include <cstdint>
#include <string>
#include <vector>

#include "data/byte_reader.h"
#include "tandem/tensor.h"

namespace tandem::data {

/// An IDX file whose header has been read and checked; the data is read on request, so that the
/// headers of an images and a labels file can be compared before either is inflated.
class IdxFile {
 public:
  /// Opens path and reads its header; throws tandem::Error (Input) naming what is wrong.
  explicit IdxFile(const std::string& path);
  /// The dims the header announces.
  const Shape& shape() const { return shape_; }
  /// Reads exactly the announced bytes and checks that nothing follows them.
  Tensor read_data();

 private:
  ByteReader reader_;
  Shape shape_;
  uint64_t bytes_ = 0;
};

/// Appends the records of one CIFAR-10 batch file (label byte + 3072 pixel bytes each).
void read_cifar_file(const std::string& path, std::vector<uint8_t>& pixels, std::vector<int32_t>& labels);

}  // namespace tandem::data
