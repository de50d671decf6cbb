// libFuzzer harness: the IDX reader (raw and gzip) must answer any bytes with data or a tandem::Error.
#include "data/readers.h"
#include "fuzz_input.h"
#include "tandem/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile file;
  const std::string& path = file.hold(data, size);
  try {
    tandem::data::IdxFile idx(path);
    // A header may announce up to 1032x the file's size when gzip-compressed; keep each run small.
    uint64_t bytes = 1;
    for (int64_t d : idx.shape()) bytes *= static_cast<uint64_t>(d);
    if (bytes > (uint64_t{64} << 20)) return 0;
    tandem::Tensor t = idx.read_data();
    if (t.nbytes() != bytes) __builtin_trap();  // the reader returned other than it announced
  } catch (const tandem::Error&) {
  }
  return 0;
}
