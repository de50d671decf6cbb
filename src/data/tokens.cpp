// Token shards (llm.c's and nanoGPT's formats), memory-mapped, read as one stream, and batches of
// token windows drawn on the device.
#include "tandem/data/tokens.h"

#include <glob.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "backend/backend.h"
#include "backend/token_window.h"
#include "core/counter_rng.h"
#include "data/regular_file.h"
#include "data/text_check.h"
#include "tandem/error.h"

namespace tandem::data {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kHeaderBytes = kLlmcHeaderInts * 4;
// How much of a bare shard is looked at to tell text from tokens.
constexpr uint64_t kTextLookBytes = 1 << 16;

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// What to do with a file that is not a token shard: text becomes shards through `tandem data text`.
std::string shards_hint(const std::string& path) {
  return "; a text file is made into token shards first: `tandem data text " + path +
         " -o DIR`, then train on --data DIR";
}

// A shard's file name without its directory and .bin, as the split globs see it.
std::string stem_of(const fs::path& p) { return p.stem().string(); }

}  // namespace

int token_width(TokenFormat f) { return f == TokenFormat::llmc32 ? 4 : 2; }

const char* token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::llmc: return "llm.c";
    case TokenFormat::llmc32: return "llm.c 32-bit";
    case TokenFormat::bare: break;
  }
  return "nanoGPT (bare uint16)";
}

TokenShard::TokenShard(const std::string& path, int64_t vocab) : path_(path) {
  uint64_t size = 0;
  std::FILE* f = io::open_regular_file(path, "token shard", size);
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  TANDEM_CHECK(size > 0, "token shard '", path, "' is empty: it holds no tokens");
  map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fileno(f), 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    TANDEM_RUNTIME_CHECK(false, "cannot map token shard '", path, "' into memory: ", std::strerror(errno));
  }
  map_bytes_ = size;
  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    int32_t magic = 0;
    if (size >= 4) std::memcpy(&magic, bytes, 4);
    if (magic == kLlmcMagic || magic == kLlmc32Magic) {
      const bool wide = magic == kLlmc32Magic;
      const int32_t version = wide ? kLlmc32Version : kLlmcVersion;
      const uint64_t width = wide ? 4 : 2;
      format_ = wide ? TokenFormat::llmc32 : TokenFormat::llmc;
      TANDEM_CHECK(size >= static_cast<uint64_t>(kHeaderBytes), "token shard '", path, "' is truncated: it has llm.c's magic ",
                   magic, " but only ", size, " bytes, less than the ", kHeaderBytes, "-byte header");
      int32_t header[3];
      std::memcpy(header, bytes, sizeof header);
      TANDEM_CHECK(header[1] == version, "token shard '", path, "': llm.c header version ", header[1], ", expected ",
                   version, " (magic ", magic, ", uint", 8 * width, " tokens)", shards_hint(path));
      const int64_t count = header[2];
      TANDEM_CHECK(count > 0, "token shard '", path, "': its llm.c header announces ", count,
                   " tokens; a shard holds at least one");
      const uint64_t payload = size - kHeaderBytes, want = width * static_cast<uint64_t>(count);
      TANDEM_CHECK(payload >= want, "token shard '", path, "' is truncated: its header announces ", count, " tokens (",
                   want, " bytes after the ", kHeaderBytes, "-byte header) but only ", payload, " bytes follow");
      TANDEM_CHECK(payload == want, "token shard '", path, "': token count mismatch: its header announces ", count,
                   " tokens (", want, " bytes) but ", payload, " bytes follow the header",
                   payload % width == 0 ? " (" + std::to_string(payload / width) + " tokens)" : std::string());
      bytes_ = bytes + kHeaderBytes;
      count_ = count;
    } else {
      format_ = TokenFormat::bare;
      // Bare tokens have no header to check: a text file given here would train on its bytes read in
      // pairs. Tokens below 256 have a zero byte, GPT-2's common ones bytes below 0x20: text has neither.
      const size_t looked = static_cast<size_t>(std::min<uint64_t>(size, kTextLookBytes));
      const TextLook look = look_at_text({reinterpret_cast<const char*>(bytes), looked}, looked < size);
      TANDEM_CHECK(!look.text, "'", path, "' holds text, not tokens: its ", looked < size ? "first " : "",
                   looked, " bytes read as UTF-8 text (no zero byte, no stray control character), which neither "
                   "llm.c's shards (magic ", kLlmcMagic, ") nor nanoGPT's bare uint16 tokens are", shards_hint(path));
      TANDEM_CHECK(size % 2 == 0, "token shard '", path, "' has an odd number of bytes (", size,
                   "): neither llm.c's format (no magic ", kLlmcMagic, ") nor bare uint16 tokens", shards_hint(path));
      bytes_ = bytes;
      count_ = static_cast<int64_t>(size / 2);
    }
    if (vocab > 0) {
      for (int64_t i = 0; i < count_; ++i)
        TANDEM_CHECK(at(i) < vocab, "token shard '", path, "': token ", at(i), " at position ", i,
                     " is outside the vocabulary of ", vocab);
    }
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

uint32_t TokenShard::at(int64_t i) const {
  if (format_ == TokenFormat::llmc32) {
    uint32_t t;
    std::memcpy(&t, bytes_ + 4 * i, 4);
    return t;
  }
  uint16_t t;
  std::memcpy(&t, bytes_ + 2 * i, 2);
  return t;
}

uint32_t TokenShard::max_token() const {
  uint32_t m = 0;
  for (int64_t i = 0; i < count_; ++i) m = std::max(m, at(i));
  return m;
}

MaskShard::MaskShard(const std::string& path, int64_t tokens) : path_(path) {
  uint64_t size = 0;
  std::FILE* f = io::open_regular_file(path, "loss mask", size);
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  TANDEM_CHECK(size == static_cast<uint64_t>(tokens), "loss mask '", path, "' holds ", size, " bytes but its shard ",
               "holds ", tokens, " tokens: a mask has one byte per token (was the shard or the mask replaced?)");
  map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fileno(f), 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    TANDEM_RUNTIME_CHECK(false, "cannot map loss mask '", path, "' into memory: ", std::strerror(errno));
  }
  map_bytes_ = size;
  bytes_ = static_cast<const uint8_t*>(map_);
  count_ = tokens;
  for (int64_t i = 0; i < count_; ++i) {
    if (bytes_[i] > 1) {
      const unsigned byte = bytes_[i];
      ::munmap(map_, map_bytes_);
      map_ = nullptr;
      TANDEM_CHECK(false, "loss mask '", path, "': byte ", i, " is ", byte, "; a mask holds 0 (not trained on) or 1 ",
                   "(trained on) per token");
    }
    trained_ += bytes_[i];
  }
}

MaskShard::~MaskShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

std::string mask_path(const std::string& shard_path) {
  fs::path p(shard_path);
  if (p.extension() == ".bin") return p.replace_extension(".mask").string();
  return shard_path + ".mask";
}

std::string examples_path(const std::string& shard_path) {
  fs::path p(shard_path);
  if (p.extension() == ".bin") return p.replace_extension(".examples").string();
  return shard_path + ".examples";
}

std::vector<int64_t> read_example_starts(const std::string& path, int64_t tokens) {
  uint64_t size = 0;
  std::FILE* f = io::open_regular_file(path, "example index", size);
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  TANDEM_CHECK(size % 16 == 0, "example index '", path, "' holds ", size, " bytes, not a whole number of 16-byte ",
               "entries (two int64 per example: its first token and its length); make the data again with ",
               "`tandem data jsonl`");
  std::vector<int64_t> pairs(static_cast<size_t>(size / 8));
  TANDEM_CHECK(pairs.empty() || std::fread(pairs.data(), 8, pairs.size(), f) == pairs.size(), "cannot read example ",
               "index '", path, "'");
  std::vector<int64_t> starts;
  starts.reserve(pairs.size() / 2);
  int64_t end = 0;
  for (size_t e = 0; e < pairs.size() / 2; ++e) {
    // Little-endian on disk, as the shards; the hosts tandem builds for are little-endian.
    const int64_t at = pairs[2 * e], len = pairs[2 * e + 1];
    TANDEM_CHECK(len > 0 && at >= end && at <= tokens - len, "example index '", path, "': example ", e, " at ", at,
                 " of length ", len, " is empty, overlaps the one before it or passes the shard's ", tokens,
                 " tokens; make the data again with `tandem data jsonl`");
    starts.push_back(at);
    end = at + len;
  }
  return starts;
}

bool holds_both_splits(const std::string& dir) {
  std::error_code ec;
  bool train = false, val = false;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".bin") continue;
    const std::string stem = stem_of(e.path());
    train = train || stem.find("train") != std::string::npos;
    val = val || stem.find("val") != std::string::npos;
  }
  return train && val;
}

std::vector<std::string> find_token_shards(const std::string& spec) {
  TANDEM_CHECK(!spec.empty(), "token shards: an empty path was given");
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(spec, ec)) {
    std::vector<std::string> train, val;
    for (const auto& e : fs::directory_iterator(spec, ec)) {
      if (e.path().extension() != ".bin") continue;
      const std::string stem = stem_of(e.path()), name = e.path().filename().string();
      if (stem.find("train") != std::string::npos) train.push_back(name);
      if (stem.find("val") != std::string::npos) val.push_back(name);
      files.push_back(e.path().string());
    }
    TANDEM_CHECK(!ec, "cannot list token shard directory '", spec, "': ", ec.message());
    if (!train.empty() && !val.empty()) {
      std::sort(train.begin(), train.end());
      std::sort(val.begin(), val.end());
      auto some = [](const std::vector<std::string>& names) {
        return names.front() + (names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more" : "");
      };
      TANDEM_CHECK(false, "directory '", spec, "' holds both training shards (", some(train), ") and validation shards (",
                   some(val), "); name the split: '", (fs::path(spec) / "*train*.bin").string(), "' or '",
                   (fs::path(spec) / "*val*.bin").string(), "' (tandem train --data ", spec,
                   " takes both: the first to train, the second to validate)");
    }
    TANDEM_CHECK(!files.empty(), "directory '", spec, "' holds no token shards (*.bin files)");
  } else if (has_glob_chars(spec) && !fs::exists(spec, ec)) {
    glob_t g{};
    const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    TANDEM_CHECK(rc == 0 || rc == GLOB_NOMATCH, "cannot expand the pattern '", spec, "' (glob error ", rc, ")");
    TANDEM_CHECK(!files.empty(), "no token shards match '", spec, "'");
  } else {
    TANDEM_CHECK(fs::exists(spec, ec), "token shard '", spec, "' does not exist");
    return {spec};
  }
  std::sort(files.begin(), files.end());
  return files;
}

TokenStream::TokenStream(const std::vector<std::string>& specs, int64_t vocab, bool masks, bool documents)
    : documented_(documents) {
  TANDEM_CHECK(!specs.empty(), "token stream: no shard files were given");
  TANDEM_CHECK(!documents || masks, "token stream: documents are marked in the loss masks, which were not asked for");
  for (const std::string& spec : specs) {
    for (const std::string& path : find_token_shards(spec)) {
      auto shard = std::make_shared<const TokenShard>(path, vocab);
      if (masks) {
        const std::string m = mask_path(path);
        std::error_code ec;
        TANDEM_CHECK(fs::exists(m, ec), "token shard '", path, "' has no loss mask beside it ('", m,
                     "' is missing); `tandem data jsonl` writes one per shard");
        masks_.push_back(std::make_shared<const MaskShard>(m, shard->size()));
      }
      if (documents) {
        const std::string e = examples_path(path);
        std::error_code ec;
        TANDEM_CHECK(fs::exists(e, ec), "token shard '", path, "' has no example index beside it ('", e,
                     "' is missing); `tandem data jsonl` writes one per shard");
        for (int64_t at : read_example_starts(e, shard->size())) doc_starts_.push_back(size_ + at);
      }
      starts_.push_back(size_);
      size_ += shard->size();
      width_ = std::max(width_, shard->width());
      shards_.push_back(std::move(shard));
    }
  }
}

uint8_t TokenStream::mask_at(int64_t i) const {
  TANDEM_CHECK(masked(), "token stream: it has no loss masks");
  TANDEM_CHECK(i >= 0 && i < size_, "token stream: position ", i, " is outside [0, ", size_, ")");
  const size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin() - 1);
  return masks_[s]->bytes()[i - starts_[s]];
}

int64_t TokenStream::trained() const {
  int64_t n = 0;
  for (const auto& m : masks_) n += m->trained();
  return n;
}

uint32_t TokenStream::at(int64_t i) const {
  TANDEM_CHECK(i >= 0 && i < size_, "token stream: position ", i, " is outside [0, ", size_, ")");
  const size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin() - 1);
  return shards_[s]->at(i - starts_[s]);
}

namespace {
// Calls f(shard, first token in the shard, count, offset in the range) for each piece of [begin, end)
// within one shard.
template <typename F>
void for_each_piece(const std::vector<std::shared_ptr<const TokenShard>>& shards, const std::vector<int64_t>& starts,
                    int64_t begin, int64_t end, F&& f) {
  for (size_t s = 0; s < shards.size(); ++s) {
    const int64_t lo = std::max(begin, starts[s]), hi = std::min(end, starts[s] + shards[s]->size());
    if (lo < hi) f(*shards[s], lo - starts[s], hi - lo, lo - begin);
  }
}
}  // namespace

void TokenStream::copy(int64_t begin, int64_t end, uint32_t* dst) const {
  TANDEM_CHECK(0 <= begin && begin <= end && end <= size_, "token stream: range [", begin, ", ", end,
               ") is outside [0, ", size_, ")");
  for_each_piece(shards_, starts_, begin, end, [&](const TokenShard& s, int64_t first, int64_t n, int64_t at) {
    for (int64_t i = 0; i < n; ++i) dst[at + i] = s.at(first + i);
  });
}

Tensor TokenStream::upload(int64_t begin, int64_t end, Device device) const {
  TANDEM_CHECK(0 <= begin && begin <= end && end <= size_, "token stream: range [", begin, ", ", end,
               ") is outside [0, ", size_, ")");
  Tensor t = Tensor::empty({end - begin, width_}, DType::u8, device);
  backend::Backend& be = backend::backend_for(device);
  auto* dst = static_cast<uint8_t*>(t.data_ptr());
  const auto w = static_cast<size_t>(width_);
  for_each_piece(shards_, starts_, begin, end, [&](const TokenShard& s, int64_t first, int64_t n, int64_t at) {
    const auto count = static_cast<size_t>(n);
    if (s.width() == width_) {
      be.copy_from_host(s.bytes() + w * static_cast<size_t>(first), dst + w * static_cast<size_t>(at), w * count,
                        device.index);
      return;
    }
    // A 16-bit shard in a 32-bit stream: widened on the host, a bounded piece at a time.
    constexpr size_t kPiece = size_t{1} << 20;
    std::vector<uint32_t> wide(std::min(count, kPiece));
    for (size_t done = 0; done < count; done += wide.size()) {
      const size_t m = std::min(wide.size(), count - done);
      for (size_t i = 0; i < m; ++i) wide[i] = s.at(first + static_cast<int64_t>(done + i));
      be.copy_from_host(wide.data(), dst + 4 * (static_cast<size_t>(at) + done), 4 * m, device.index);
    }
  });
  return t;
}

Tensor TokenStream::upload_mask(int64_t begin, int64_t end, Device device) const {
  TANDEM_CHECK(masked(), "token stream: it has no loss masks");
  TANDEM_CHECK(0 <= begin && begin <= end && end <= size_, "token stream: range [", begin, ", ", end,
               ") is outside [0, ", size_, ")");
  Tensor t = Tensor::empty({end - begin}, DType::u8, device);
  backend::Backend& be = backend::backend_for(device);
  auto* dst = static_cast<uint8_t*>(t.data_ptr());
  // With documents, a bounded piece at a time goes through a host buffer where the examples' first tokens
  // are marked.
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<uint8_t> piece;
  auto doc = std::lower_bound(doc_starts_.begin(), doc_starts_.end(), begin);
  for (size_t s = 0; s < shards_.size(); ++s) {
    const int64_t lo = std::max(begin, starts_[s]), hi = std::min(end, starts_[s] + shards_[s]->size());
    if (lo >= hi) continue;
    const uint8_t* src = masks_[s]->bytes() + (lo - starts_[s]);
    if (!documented_) {
      be.copy_from_host(src, dst + (lo - begin), static_cast<size_t>(hi - lo), device.index);
      continue;
    }
    for (int64_t p0 = lo; p0 < hi; p0 += kPiece) {
      const int64_t n = std::min(kPiece, hi - p0);
      piece.assign(src + (p0 - lo), src + (p0 - lo) + n);
      for (; doc != doc_starts_.end() && *doc < p0 + n; ++doc)
        if (*doc >= p0) piece[static_cast<size_t>(*doc - p0)] |= backend::kDocumentStart;
      be.copy_from_host(piece.data(), dst + (p0 - begin), static_cast<size_t>(n), device.index);
    }
  }
  return t;
}

TokenRange rank_part(int64_t n, int rank, int world_size) {
  TANDEM_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "token stream: rank ", rank, " is outside [0, ",
               world_size, ")");
  TANDEM_CHECK(n >= 0, "token stream: negative length ", n);
  // n * r / w without overflow: n < 2^63 and r < w, so (n / w) * r + (n % w) * r / w stays in range.
  auto cut = [&](int64_t r) { return (n / world_size) * r + (n % world_size) * r / world_size; };
  return {cut(rank), cut(rank + 1)};
}

uint64_t window_seed(uint64_t seed, int rank) {
  return rng::mix(seed ^ 0x7F4A7C159E3779B9ull, static_cast<uint64_t>(rank) + 1);
}

int64_t window_start(uint64_t seed, int64_t j, int64_t n, int64_t context, bool random, int64_t frame) {
  TANDEM_CHECK(context >= 1 && n >= context + 1, "token windows: ", n, " tokens cannot hold a window of ",
               context + 1);
  TANDEM_CHECK(frame == 0 || (frame >= context + 1 && n >= frame), "token windows: frames of ", frame,
               " tokens cannot hold a window of ", context + 1, " or do not fit in ", n, " tokens");
  TANDEM_CHECK(j >= 0, "token windows: negative window index ", j);
  return backend::token_window_start(seed, j, n, context, random, frame);
}

TokenBatches::TokenBatches(const TokenStream& stream, TokenBatchOptions opt) : opt_(opt) {
  TANDEM_CHECK(opt.batch >= 1 && opt.batch <= (int64_t{1} << 31) - 1, "token batches: batch must be in [1, 2^31), got ",
               opt.batch);
  TANDEM_CHECK(opt.context >= 1 && opt.context <= (int64_t{1} << 31) - 1,
               "token batches: context must be in [1, 2^31), got ", opt.context);
  TANDEM_CHECK(opt.world_size >= 1, "token batches: world_size must be at least 1, got ", opt.world_size);
  TANDEM_CHECK(opt.rank >= 0 && opt.rank < opt.world_size, "token batches: rank ", opt.rank, " is outside [0, ",
               opt.world_size, ")");
  check_device(opt.device);
  if (opt.frame > 0) {
    // Framed data: a window is a frame's first context + 1 tokens, and each rank takes whole frames.
    TANDEM_CHECK(opt.frame >= opt.context + 1, "token batches: frames of ", opt.frame, " tokens (the data's ",
                 "windows) cannot hold a window of context + 1 = ", opt.context + 1);
    TANDEM_CHECK(stream.size() % opt.frame == 0, "token batches: the stream's ", stream.size(), " tokens are not a ",
                 "whole number of frames of ", opt.frame, " (each a padded or packed window of the data)");
    const TokenRange frames = rank_part(stream.size() / opt.frame, opt.rank, opt.world_size);
    part_ = {frames.begin * opt.frame, frames.end * opt.frame};
    TANDEM_CHECK(frames.size() >= 1, "token batches: rank ", opt.rank, " of ", opt.world_size, " gets none of the ",
                 "stream's ", stream.size() / opt.frame, " windows of ", opt.frame, " tokens",
                 "; use fewer ranks or more examples");
  } else {
    part_ = rank_part(stream.size(), opt.rank, opt.world_size);
  }
  TANDEM_CHECK(part_.size() >= opt.context + 1, "token batches: rank ", opt.rank, " of ", opt.world_size, " gets ",
               part_.size(), " of the stream's ", stream.size(), " tokens, fewer than one window of context + 1 = ",
               opt.context + 1, opt.world_size > 1 ? "; use fewer ranks, a shorter context or more data" :
                                                     "; use a shorter context or more data");
  seed_ = window_seed(opt.seed, opt.rank);
  tokens_ = stream.upload(part_.begin, part_.end, opt.device);
  if (stream.masked()) mask_ = stream.upload_mask(part_.begin, part_.end, opt.device);
  documented_ = stream.documented();
  cursor_ = Tensor::zeros({2}, DType::i64, opt.device);
}

void TokenBatches::next(Tensor& x, Tensor& y) {
  const Shape shape{opt_.batch, opt_.context};
  auto fit = [&](Tensor& t) {
    if (!(t.defined() && t.shape() == shape && t.dtype() == DType::i32 && t.device() == opt_.device &&
          t.is_contiguous()))
      t = Tensor::empty(shape, DType::i32, opt_.device);
  };
  fit(x);
  fit(y);
  fill(x, y);
}

void TokenBatches::fill(Tensor& x, Tensor& y) {
  TANDEM_CHECK(x.defined() && x.dim() == 2 && x.size(0) <= opt_.batch && x.size(1) == opt_.context &&
                   x.device() == opt_.device && x.is_contiguous() && y.defined() && y.is_contiguous(),
               "token batches: x and y must be contiguous i32 [B, ", opt_.context, "] with B <= ", opt_.batch, " on ",
               opt_.device.str(), ", got ", x.defined() ? x.str() : "undefined");
  backend::backend_for(opt_.device).token_windows(tokens_, mask_, cursor_, seed_, !opt_.sequential, opt_.frame, x, y);
}

void TokenBatches::fill(Tensor& x, Tensor& y, Tensor& pos) {
  if (!documented_) return fill(x, y);
  TANDEM_CHECK(x.defined() && x.dim() == 2 && x.size(0) <= opt_.batch && x.size(1) == opt_.context &&
                   x.device() == opt_.device && x.is_contiguous() && y.defined() && y.is_contiguous() &&
                   pos.defined() && pos.shape() == x.shape() && pos.dtype() == DType::i32 && pos.is_contiguous(),
               "token batches: x, y and the document positions must be contiguous i32 [B, ", opt_.context,
               "] with B <= ", opt_.batch, " on ", opt_.device.str(), ", got ", x.defined() ? x.str() : "undefined",
               " and ", pos.defined() ? pos.str() : "undefined");
  backend::backend_for(opt_.device).token_windows(tokens_, mask_, cursor_, seed_, !opt_.sequential, opt_.frame, x, y,
                                                  pos);
}

void TokenBatches::seek(int64_t k) {
  TANDEM_CHECK(k >= 0 && k <= INT64_MAX / opt_.batch, "token batches: cannot seek to batch ", k);
  cursor_.copy_(Tensor::from_vector(std::vector<int64_t>{k * opt_.batch, 0}, {2}));
}

int64_t TokenBatches::windows() const {
  if (opt_.frame > 0) return part_.size() / opt_.frame;
  return opt_.sequential ? (part_.size() - 1) / opt_.context : part_.size() - opt_.context;
}

int64_t TokenBatches::window_start(int64_t j) const {
  return data::window_start(seed_, j, part_.size(), opt_.context, !opt_.sequential, opt_.frame);
}

}  // namespace tandem::data
