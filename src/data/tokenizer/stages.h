#pragma once
// Internal: the stages of a tokenizer.json, each a small piece, in the order text goes through them:
// added tokens (cut out first), normalizer, pre-tokenizer (splits text into words, maps bytes), model
// (a word to ids) and decoder (tokens back to bytes). A new family's tokenizer is a new stage here.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tandem::data::tok {

/// Where a stage's settings come from, for error messages: the file and the JSON path
/// ("tokenizer.json 'tok.json': pre_tokenizer.pretokenizers[0]").
struct Where {
  std::string file;  // the tokenizer.json
  std::string path;  // within it
  Where at(const std::string& key) const { return {file, path.empty() ? key : path + "." + key}; }
  Where index(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
  std::string str() const { return "tokenizer file '" + file + "': " + (path.empty() ? "" : path + ": "); }
};

// ---- JSON access that names what is wrong ----
const nlohmann::json& field(const nlohmann::json& obj, const char* key, const Where& w);
bool bool_field(const nlohmann::json& obj, const char* key, bool fallback, const Where& w);
std::string string_field(const nlohmann::json& obj, const char* key, const Where& w);
/// The "type" of a stage object.
std::string type_of(const nlohmann::json& obj, const Where& w);

/// Hashes std::string keys and finds them by std::string_view too.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

/// Words on their way from the pre-tokenizer to the model: spans of one buffer.
struct Words {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) of each word in text
  /// The first word continues text cut off before it (a chunk of a longer text encoded in parallel),
  /// so it is not the start of a piece: ByteLevel adds no prefix space to it.
  bool continues = false;
  std::string_view word(size_t i) const { return std::string_view(text).substr(spans[i].first, spans[i].second - spans[i].first); }
};

/// The normalizer stage (tokenizer.json's "normalizer"). Only "none" is supported so far; a new one is
/// a subclass.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// Rewrites text in place.
  virtual void normalize(std::string& text) const = 0;
};

/// A pre-tokenizer stage: splits each word further and may rewrite it.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Splits or rewrites the words in place.
  virtual void apply(Words& words) const = 0;
  /// Whether pre-tokenizing text[0, p) and text[p, end) apart gives the words of text whole (p is at
  /// a character boundary of valid UTF-8, 0 < p < text.size()). Chunks of a long text cut there are
  /// encoded in parallel. False is always safe.
  virtual bool can_cut(std::string_view text, size_t p) const = 0;
  /// Whether the stage splits words (rather than only rewriting them).
  virtual bool splits() const = 0;
};

/// The model stage: one word to ids. `Cache` holds words already seen (one per thread).
class Model {
 public:
  struct Cache {
    StringMap<std::pair<uint32_t, uint32_t>> words;  // word -> (offset, count) in ids
    std::vector<uint32_t> ids;
  };
  virtual ~Model() = default;
  /// Appends the ids of word to out.
  virtual void tokenize(std::string_view word, std::vector<uint32_t>& out, Cache& cache) const = 0;
  /// The token's string, or nullptr when the model has no such id.
  virtual const std::string* token(uint32_t id) const = 0;
  /// The id of a token string, or -1.
  virtual int64_t id(std::string_view token) const = 0;
  /// Entries in the vocabulary, and the largest id + 1.
  virtual size_t size() const = 0;
  virtual int64_t id_bound() const = 0;
};

/// The decoder stage: token strings back to bytes.
class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Appends the bytes that tokens stand for to out.
  virtual void decode(const std::vector<const std::string*>& tokens, std::string& out) const = 0;
};

// ---- the stages tandem implements, built from their JSON ----
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const Where& w);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const Where& w);
std::unique_ptr<Model> make_model(const nlohmann::json& j, const Where& w);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const Where& w);

/// GPT-2's byte-to-character map: the character (as UTF-8) that stands for each byte.
const std::string& byte_char(uint8_t b);
/// The byte a character stands for, or -1 when it is none of the 256.
int char_byte(uint32_t cp);

/// The split patterns written out by hand (a general regex engine is not needed for them).
enum class SplitPattern { gpt2, llama3 };
/// The pattern a regex string is, or refuses it naming it.
SplitPattern split_pattern(const std::string& regex, const Where& w);
/// The length of the match of the pattern at text[i] (i < text.size()), or 0 when none starts there.
size_t match_at(SplitPattern p, std::string_view text, size_t i);
/// Whether a cut at p leaves the pattern's matches unchanged (see PreTokenizer::can_cut).
bool pattern_can_cut(SplitPattern p, std::string_view text, size_t p_at);

}  // namespace tandem::data::tok
