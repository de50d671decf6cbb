// libFuzzer harness: token shards (llm.c's uint16 or uint32 header, or bare uint16) must answer any bytes with tokens or a
// tandem::Error; batches drawn from a shard that loads hold its tokens, shifted by one between x and y.
#include "fuzz_input.h"
#include "tandem/data/tokens.h"
#include "tandem/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile file;
  const std::string& path = file.hold(data, size);
  // The vocabulary the shard is checked against: from the input's last byte (0: unchecked).
  const int64_t vocab = size ? int64_t(data[size - 1]) * 256 : 0;
  try {
    tandem::data::TokenShard shard(path, vocab);
    const int64_t n = shard.size();
    if (n <= 0 || static_cast<uint64_t>(n) * static_cast<uint64_t>(shard.width()) > size)
      __builtin_trap();  // more tokens than the file holds
    const uint32_t m = shard.max_token();
    if (vocab > 0 && m >= vocab) __builtin_trap();  // a token the check let through
    tandem::data::TokenStream stream(path, vocab);
    if (stream.size() != n) __builtin_trap();
    for (bool sequential : {false, true}) {
      tandem::data::TokenBatchOptions opt;
      opt.batch = 2;
      opt.context = 1 + (size ? data[0] % 8 : 0);
      opt.sequential = sequential;
      opt.seed = size > 1 ? data[1] : 0;
      tandem::data::TokenBatches batches(stream, opt);
      tandem::Tensor x, y;
      batches.next(x, y);
      const std::vector<int32_t> xs = x.to_vector<int32_t>(), ys = y.to_vector<int32_t>();
      for (int64_t b = 0; b < opt.batch; ++b) {
        const int64_t start = batches.window_start(b);
        if (start < 0 || start + opt.context >= n) __builtin_trap();  // a window past the shard
        for (int64_t t = 0; t < opt.context; ++t)
          if (xs[b * opt.context + t] != static_cast<int32_t>(stream.at(start + t)) ||
              ys[b * opt.context + t] != static_cast<int32_t>(stream.at(start + t + 1)))
            __builtin_trap();
      }
    }
  } catch (const tandem::Error&) {
  }
  return 0;
}
