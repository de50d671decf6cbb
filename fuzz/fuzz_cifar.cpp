// libFuzzer harness: the CIFAR-10 batch reader must answer any bytes with records or a tandem::Error.
#include "data/readers.h"
#include "fuzz_input.h"
#include "tandem/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile file;
  const std::string& path = file.hold(data, size);
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  try {
    tandem::data::read_cifar_file(path, pixels, labels);
    if (pixels.size() != labels.size() * 3072) __builtin_trap();
    for (int32_t l : labels)
      if (l < 0 || l > 9) __builtin_trap();
  } catch (const tandem::Error&) {
  }
  return 0;
}
