#pragma once
// Text files made into token shards, byte-level (vocabulary 256: a token is a byte) or with a
// tokenizer.json, split into a training and a validation set by whole files: what `tandem data text`
// does.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data {

/// Where the body of a Project Gutenberg text lies: [begin, end) of the text, without the licence
/// header (everything up to and including the "*** START OF ..." line, or the older
/// "*END*THE SMALL PRINT! ..." line) and footer (from the "*** END OF ..." line, or an older
/// "End of the Project Gutenberg Etext ..." / "End of this Etext ..." line, to the end).
struct TextSpan {
  size_t begin = 0, end = 0;
  bool header = false;  // a header was found and is left out
  bool footer = false;  // a footer was found and is left out
};
TextSpan gutenberg_body(std::string_view text);

/// Which files go to validation: the last files in the order given (sorted by name by the caller),
/// as many as bring their bytes closest to `fraction` of the total, at least one and leaving at
/// least one for training. None when fraction is 0, and none for a single file (write_text_corpus
/// splits that one within itself, validation_cut). Throws tandem::Error (Input) for a fraction
/// outside [0, 1).
std::vector<bool> choose_validation_files(const std::vector<uint64_t>& bytes, double fraction);

/// Where one text is cut for validation: its last `fraction` of [begin, end), moved to the nearest
/// document boundary (the start of a line after a blank line) within half that part either way, else
/// the nearest line boundary there, else a space, else the nearest UTF-8 character boundary. Both
/// sides keep at least one byte. Throws tandem::Error (Input) when [begin, end) holds fewer than 2 bytes.
struct TextCut {
  size_t at = 0;         // validation is [at, end)
  std::string boundary;  // "a blank line", "a line end", "a space" or "a character"
};
TextCut validation_cut(std::string_view text, size_t begin, size_t end, double fraction);

struct TextCorpusOptions {
  std::vector<std::string> files;  // text files (any order; processed sorted by path)
  std::string out_dir;             // created when missing
  double val_fraction = 0.1;       // in [0, 1)
  bool strip_gutenberg = false;    // leave out Project Gutenberg's licence header and footer
  bool binary_ok = false;          // tokenize files that are not text (NUL bytes, mostly non-UTF-8) too
  int64_t shard_tokens = 100'000'000;  // most tokens per shard file (llm.c's shards hold 10^8)
  /// A Hugging Face tokenizer.json; empty: byte-level tokens. With one, each file's tokens follow one
  /// document token (document_token, or the family's: Tokenizer::document_token), and shards hold
  /// uint16 tokens where the vocabulary fits, uint32 tokens (llm.c's 32-bit format) otherwise.
  std::string tokenizer;
  std::string document_token;  // the token put before each file (tokenizer only); empty: the family's
  int threads = 0;             // threads that encode (0: every core)
  /// Called with one line of progress at a time (per file, per shard written), when set.
  std::function<void(const std::string&)> progress;
};

/// What happened to one input file.
struct TextFileReport {
  std::string path;
  uint64_t bytes = 0;   // size of the file
  int64_t tokens = 0;   // tokens it gave (byte-level: its bytes, less a stripped header and footer;
                        // with a tokenizer: its ids and the document token before them)
  bool val = false;     // held out for validation (the whole file)
  bool header_stripped = false, footer_stripped = false;
  /// The one input file, split within itself: its bytes from this offset on validate; -1 otherwise.
  int64_t val_from = -1;
  int64_t val_tokens = 0;  // of those split within: its tokens that validate
  std::string cut_at;      // of those split within: the boundary it was cut at (TextCut::boundary)
};

/// What write_text_corpus wrote.
struct TextCorpusReport {
  std::vector<TextFileReport> files;  // sorted by path
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;  // paths written
  std::vector<std::string> removed;                   // older shards of this directory removed
  std::string meta_path;                              // DIR/meta.json
  int64_t vocab_size = 256;                           // the vocabulary the tokens come from
  int token_bytes = 2;                                // bytes per token in the shards: 2 or 4
  std::string document_token;                         // the token before each file (tokenizer only)
  int64_t document_token_id = -1;
  double encode_seconds = 0;                          // time spent encoding (tokenizer only)
  uint64_t encoded_bytes = 0;                         // bytes of text encoded (tokenizer only)
};

/// Reads the files, tokenizes them (byte-level, token = byte, or with opt.tokenizer on every core),
/// splits them by whole files (a single file within itself: its last part, cut at a document or line
/// boundary, validates) and writes
/// DIR/train_000000.bin ... and DIR/val_000000.bin ... in llm.c's format (each file written whole
/// under a temporary name, then renamed), then DIR/meta.json (vocabulary, token counts, which file
/// went where), last: a run that fails midway leaves no meta.json. Shards named train_NNNNNN.bin /
/// val_NNNNNN.bin left in DIR by an earlier, larger run are removed. Every input is read and checked before anything is written. Throws
/// tandem::Error (Input) for a missing or unreadable file, a file given twice, a file that is not text
/// (unless binary_ok), no text at all, an empty split, an out-of-range option, a tokenizer.json tandem
/// cannot read (or without a document token), or an output directory that cannot be created or written.
TextCorpusReport write_text_corpus(const TextCorpusOptions& opt);

}  // namespace tandem::data
