#pragma once
// Token shards for language models, memory-mapped, and the batches of token windows drawn from them.
//
// Three file formats, told apart by the first four bytes:
//  - llm.c's: a header of 256 little-endian int32 (magic 20240520, version 1, the token count, the
//    rest zero), then the tokens as little-endian uint16 (what llm.c's GPT-2 data scripts and
//    `tandem data text` write for a vocabulary of at most 65,536 tokens);
//  - llm.c's 32-bit one: the same header with magic 20240801 and version 7, then little-endian uint32
//    tokens (llm.c's LLaMA-3 scripts, and `tandem data text` for a larger vocabulary such as Llama 3's);
//  - nanoGPT's: the tokens alone as little-endian uint16 (train.bin / val.bin of its prepare.py
//    scripts). A bare file whose first two tokens spell a magic (55000, 308) would be taken for
//    llm.c's; GPT-2's vocabulary (50257) never does.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/device.h"
#include "tandem/tensor.h"

namespace tandem::data {

/// The magic number and version of llm.c's token shard header (uint16 tokens).
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
/// The magic number and version of llm.c's header for uint32 tokens (its LLaMA-3 shards).
inline constexpr int32_t kLlmc32Magic = 20240801;
inline constexpr int32_t kLlmc32Version = 7;
/// int32 values in llm.c's header (1024 bytes).
inline constexpr int64_t kLlmcHeaderInts = 256;

/// How a shard stores its tokens.
enum class TokenFormat { llmc, llmc32, bare };

/// Bytes per token of a format: 2, or 4 for llmc32.
int token_width(TokenFormat f);

/// "llm.c", "llm.c 32-bit" or "nanoGPT (bare uint16)".
const char* token_format_name(TokenFormat f);

/// One token shard file, mapped read-only into memory (pages are read from disk when first touched).
class TokenShard {
 public:
  /// Maps path and checks it: the magic and version of an llm.c header, its token count against
  /// the file's size, a whole number of tokens, at least one token, a bare file whose first bytes read as
  /// text (a text file, which `tandem data text` makes into shards), and, when vocab > 0, every token below
  /// vocab (that scan reads the whole file). Throws tandem::Error (Input) naming the file and what is wrong.
  explicit TokenShard(const std::string& path, int64_t vocab = 0);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }
  /// Tokens in the shard.
  int64_t size() const { return count_; }
  /// Bytes per token: 2 (uint16) or 4 (uint32).
  int width() const { return token_width(format_); }
  /// The tokens' bytes: size() tokens of width() bytes, little-endian (the host's order on every
  /// machine tandem runs on).
  const uint8_t* bytes() const { return bytes_; }
  /// Token i (i < size()).
  uint32_t at(int64_t i) const;
  /// The largest token (scans the shard).
  uint32_t max_token() const;

 private:
  std::string path_;
  TokenFormat format_ = TokenFormat::bare;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* bytes_ = nullptr;
  int64_t count_ = 0;
};

/// The loss mask of a token shard, mapped read-only: FILE.mask beside FILE.bin (mask_path), as
/// `tandem data jsonl` writes it: one byte per token, 1 where the token is a target the loss is taken on
/// (a response's tokens and the end token after them), 0 elsewhere (prompts, template text, padding).
class MaskShard {
 public:
  /// Maps path and checks it: `tokens` bytes (its shard's token count), each 0 or 1. Throws
  /// tandem::Error (Input) naming the file and what is wrong.
  MaskShard(const std::string& path, int64_t tokens);
  ~MaskShard();
  MaskShard(const MaskShard&) = delete;
  MaskShard& operator=(const MaskShard&) = delete;

  const std::string& path() const { return path_; }
  /// Bytes in the mask: its shard's tokens.
  int64_t size() const { return count_; }
  const uint8_t* bytes() const { return bytes_; }
  /// Tokens marked 1 (counted when mapped).
  int64_t trained() const { return trained_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* bytes_ = nullptr;
  int64_t count_ = 0, trained_ = 0;
};

/// Where a shard's loss mask lies: its path with the extension .mask instead of .bin (or .mask added).
std::string mask_path(const std::string& shard_path);
/// Where a shard's example index lies (`tandem data jsonl`): its path with the extension .examples.
std::string examples_path(const std::string& shard_path);
/// The first token of each example an example index (FILE.examples: per example two little-endian int64,
/// its first token's position and its length) gives, for a shard of `tokens` tokens. Throws tandem::Error
/// (Input) naming the file when it is not a whole number of pairs, or an example is empty, out of the
/// shard, or not after the one before it.
std::vector<int64_t> read_example_starts(const std::string& path, int64_t tokens);

/// The shard files a spec names: a file; a directory (its *.bin files, by name; one holding shards of
/// both splits, *train*.bin and *val*.bin, is refused, since a split must be named); or a glob pattern
/// (its matches, by name). Throws tandem::Error (Input) when nothing matches.
std::vector<std::string> find_token_shards(const std::string& spec);

/// Whether `dir` is a directory holding shards of both splits, as the data scripts name them:
/// nanoGPT's train.bin and val.bin, llm.c's NAME_train*.bin and NAME_val*.bin, tandem data text's
/// train_NNNNNN.bin and val_NNNNNN.bin (the globs *train*.bin and *val*.bin).
bool holds_both_splits(const std::string& dir);

/// Several shards read as one stream of tokens, in the order given.
class TokenStream {
 public:
  /// An empty stream.
  TokenStream() = default;
  /// The shards of each spec (find_token_shards), in order; vocab as for TokenShard. With masks, each
  /// shard's loss mask (MaskShard at mask_path) is mapped beside it; a missing one is an error naming it.
  /// With documents (and masks), each shard's example index (read_example_starts at examples_path) is read
  /// too, and upload_mask marks each example's first token.
  explicit TokenStream(const std::vector<std::string>& specs, int64_t vocab = 0, bool masks = false,
                       bool documents = false);
  /// The shards of one spec.
  explicit TokenStream(const std::string& spec, int64_t vocab = 0, bool masks = false, bool documents = false)
      : TokenStream(std::vector<std::string>{spec}, vocab, masks, documents) {}

  /// Tokens in all shards.
  int64_t size() const { return size_; }
  /// Bytes per token of the stream: 4 when any shard holds uint32 tokens, else 2.
  int width() const { return width_; }
  /// The shards, in stream order.
  const std::vector<std::shared_ptr<const TokenShard>>& shards() const { return shards_; }
  /// Token i of the stream.
  uint32_t at(int64_t i) const;
  /// Copies tokens [begin, end) into dst, across shard boundaries.
  void copy(int64_t begin, int64_t end, uint32_t* dst) const;
  /// Tokens [begin, end) as u8 [end - begin, width()] (each token's bytes, little-endian) on a device,
  /// copied shard by shard straight from the mapped files (a 16-bit shard of a 32-bit stream is
  /// widened on the way).
  Tensor upload(int64_t begin, int64_t end, Device device) const;

  /// Whether the stream has loss masks (constructed with masks).
  bool masked() const { return !masks_.empty(); }
  /// The masks, one per shard, in stream order (empty without masks).
  const std::vector<std::shared_ptr<const MaskShard>>& masks() const { return masks_; }
  /// The mask byte of token i of the stream (masked streams only).
  uint8_t mask_at(int64_t i) const;
  /// Tokens marked 1 in the masks.
  int64_t trained() const;
  /// The mask bytes of tokens [begin, end) as u8 [end - begin] on a device (masked streams only); with
  /// documents, the first token of each example has bit 1 (backend::kDocumentStart, 2) set besides.
  Tensor upload_mask(int64_t begin, int64_t end, Device device) const;
  /// Whether the stream knows its documents (constructed with documents).
  bool documented() const { return documented_; }

 private:
  std::vector<std::shared_ptr<const TokenShard>> shards_;
  std::vector<std::shared_ptr<const MaskShard>> masks_;  // empty, or one per shard
  std::vector<int64_t> starts_;  // stream position of each shard's first token
  std::vector<int64_t> doc_starts_;  // documented streams: each example's first token
  int64_t size_ = 0;
  int width_ = 2;
  bool documented_ = false;
};

/// The contiguous part of a stream of n tokens that rank r of world w reads: [r n / w, (r + 1) n / w).
/// The parts of all ranks are disjoint and cover the stream.
struct TokenRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
TokenRange rank_part(int64_t n, int rank, int world_size);

/// The seed of rank r's random windows, derived from the run's seed (Backend::token_windows' seed).
uint64_t window_seed(uint64_t seed, int rank);

/// Where window j of a part of n tokens starts (the formula of Backend::token_windows): random,
/// rng::mix(seed, j) % (n - T); sequential, (j % ((n - 1) / T)) * T. With frame > 0, at frames only:
/// (rng::mix(seed, j) % (n / frame)) * frame, or (j % (n / frame)) * frame.
int64_t window_start(uint64_t seed, int64_t j, int64_t n, int64_t context, bool random, int64_t frame = 0);

struct TokenBatchOptions {
  int64_t batch = 8;      // B: windows per batch
  int64_t context = 256;  // T: tokens per row of x and y
  uint64_t seed = 0;      // random windows: with the rank, decides every window
  int rank = 0, world_size = 1;
  Device device = Device::cpu();
  /// false: random windows (training); true: the part cut into consecutive windows (validation),
  /// batch after batch, starting over after the last.
  bool sequential = false;
  /// > 0: the stream is cut into frames of this many tokens (at least context + 1), each one padded
  /// example or whole examples packed (`tandem data jsonl`), and windows start at frames only: a
  /// window is a frame's first context + 1 tokens, never two examples cut apart. The ranks' parts are
  /// whole frames. 0: windows start anywhere.
  int64_t frame = 0;
};

/// Batches of token windows of one rank: x = window[0:T], y = window[1:T+1], i32 [B, T]; a masked
/// stream's targets are -100 (the losses' ignore_index) where its mask holds 0, so that the loss is
/// taken on the tokens marked 1 only. The rank's part of the stream is put on the device once (2 or 4
/// bytes a token, and a byte more for a mask) and every batch is drawn there by one kernel, from a count
/// of windows drawn that lives on the device: a recorded step that calls fill() draws the next batch at
/// each replay. Window j of the rank (batch k holds j = kB .. kB+B-1) is decided by (seed, rank, j)
/// alone, the same on every device and every run.
class TokenBatches {
 public:
  /// Uploads the rank's part of stream. Throws tandem::Error (Input) when the options are invalid or
  /// the part is shorter than one window (T + 1 tokens).
  TokenBatches(const TokenStream& stream, TokenBatchOptions opt);

  /// Draws the next batch into x and y, which are allocated (i32 [B, T] on the device) unless they
  /// already are such tensors. Queued on the device; nothing waits for it.
  void next(Tensor& x, Tensor& y);
  /// Draws the next batch into x and y (i32 [B', T] on the device, B' <= B for a last, short
  /// validation batch); may be recorded.
  void fill(Tensor& x, Tensor& y);
  /// Whether the stream marks its documents (TokenStream::documented): then fill(x, y, pos) gives each
  /// token's position in its document (packed examples that must not see each other).
  bool documented() const { return documented_; }
  /// fill, and for a documented stream pos (i32 like x, on the device) = each token's position in its
  /// document (Backend::token_windows); pos is left alone otherwise.
  void fill(Tensor& x, Tensor& y, Tensor& pos);
  /// Makes the next batch batch `k` (k batches of B windows drawn before it): resuming at a step.
  void seek(int64_t k);

  const TokenBatchOptions& options() const { return opt_; }
  /// This rank's tokens in the stream.
  TokenRange part() const { return part_; }
  /// Sequential: consecutive windows in the part, (n - 1) / T; random: possible starts, n - T; with
  /// frames, the part's frames, n / frame.
  int64_t windows() const;
  /// Window j's start within the part (what the kernel computes; for checks and tests).
  int64_t window_start(int64_t j) const;
  /// The part on the device, u8 [n, 2] or u8 [n, 4] (the stream's width).
  const Tensor& tokens() const { return tokens_; }
  /// The part's loss mask on the device, u8 [n]; undefined for a stream without masks.
  const Tensor& mask() const { return mask_; }
  /// The window count on the device, i64 [2] (Backend::token_windows' cursor).
  const Tensor& cursor() const { return cursor_; }

 private:
  TokenBatchOptions opt_;
  TokenRange part_;
  bool documented_ = false;
  uint64_t seed_ = 0;
  Tensor tokens_, mask_, cursor_;
};

}  // namespace tandem::data
