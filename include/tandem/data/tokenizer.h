#pragma once
// A byte-level BPE tokenizer read from Hugging Face's tokenizer.json (GPT-2's and Llama 3's kind),
// giving the ids of the `tokenizers` library.
//
// The file's stages are followed one by one: added tokens (special tokens such as <|endoftext|> are
// cut out of the text first), the normalizer (none), the pre-tokenizer (ByteLevel with GPT-2's split
// pattern, or Split with Llama 3's pattern in a Sequence before a ByteLevel that does not split), the
// BPE model (vocabulary and merges) and the decoder (ByteLevel). What tandem does not implement (another
// model, normalizer, pre-tokenizer, split pattern or decoder, BPE dropout, truncation) is refused when
// the file is read, naming it.
//
// encode() gives what the library's encode(text, add_special_tokens=False) gives: the post-processor
// (a template that adds <|begin_of_text|>, say) is not applied. Text that is not valid UTF-8 is first
// read as Python's bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy read it
// (each ill-formed sequence becomes one U+FFFD), since the library takes only valid text.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data {

class Tokenizer {
 public:
  /// Reads a tokenizer.json. Throws tandem::Error (Input) naming the file and the problem when it is
  /// missing, not JSON, malformed, or uses a stage tandem does not implement.
  static Tokenizer from_file(const std::string& path);
  /// Reads a tokenizer.json's text; `name` stands for the file in messages.
  static Tokenizer from_json(std::string_view json, const std::string& name);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// The ids of text (any bytes; see above for text that is not UTF-8).
  std::vector<uint32_t> encode(std::string_view text) const;
  /// The ids of each text, encoded on `threads` threads (0: every core). Long texts are cut where the
  /// pre-tokenizer allows it (between a letter and what follows it), so that one long text is spread
  /// over the threads too; the ids are those of encode().
  std::vector<std::vector<uint32_t>> encode_batch(const std::vector<std::string_view>& texts, int threads = 0) const;

  /// The text of ids, as the library's decode(ids, skip_special_tokens) gives it: bytes that are not
  /// valid UTF-8 become U+FFFD. Throws tandem::Error (Input) for an id that is no token.
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;
  /// The bytes ids stand for, without the U+FFFD replacement (pieces of one character may be split
  /// between calls: what a program that prints tokens as they come writes).
  std::string decode_bytes(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;

  /// Ids below this bound: the largest id of the vocabulary and the added tokens, plus one.
  int64_t vocab_size() const;
  /// The id of a token string (an added token or one of the model's vocabulary).
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  /// The string of a token id (as the vocabulary writes it, byte-level characters and all).
  std::optional<std::string> id_to_token(uint32_t id) const;
  /// Whether id is an added token marked special.
  bool is_special(uint32_t id) const;
  /// The token a family puts between documents: <|endoftext|> (GPT-2's family, which llm.c puts before
  /// each document) or else <|begin_of_text|> (Llama 3's beginning of a document); none when the file
  /// has neither as an added token.
  std::optional<uint32_t> document_token() const;
  /// A line saying what the file holds ("BPE, 50257 tokens (1 added), ByteLevel pre-tokenizer").
  std::string describe() const;
  /// The file this tokenizer was read from.
  const std::string& path() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The SHA-256 of a file's bytes, in hex (what `sha256sum` prints). Throws tandem::Error (Input) when
/// the file cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace tandem::data
