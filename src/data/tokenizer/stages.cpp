// The small stages (normalizer, decoder) and the JSON access that names the file and the place of
// what is wrong.
#include "data/tokenizer/stages.h"

#include <nlohmann/json.hpp>

#include "data/tokenizer/unicode.h"
#include "tandem/error.h"

namespace tandem::data::tok {

const nlohmann::json& field(const nlohmann::json& obj, const char* key, const Where& w) {
  TANDEM_CHECK(obj.is_object(), w.str(), "expected an object, got ", obj.type_name());
  const auto it = obj.find(key);
  TANDEM_CHECK(it != obj.end(), w.str(), "'", key, "' is missing");
  return *it;
}

bool bool_field(const nlohmann::json& obj, const char* key, bool fallback, const Where& w) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  TANDEM_CHECK(it->is_boolean(), w.at(key).str(), "expected true or false, got ", it->dump());
  return it->get<bool>();
}

std::string string_field(const nlohmann::json& obj, const char* key, const Where& w) {
  const nlohmann::json& v = field(obj, key, w);
  TANDEM_CHECK(v.is_string(), w.at(key).str(), "expected a string, got ", v.dump());
  return v.get<std::string>();
}

std::string type_of(const nlohmann::json& obj, const Where& w) { return string_field(obj, "type", w); }

namespace {

// GPT-2's byte-level decoder: each character of a token back to its byte; a token with a character
// that stands for no byte (an added token such as "<|end of text|>") is taken as its own UTF-8.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode(const std::vector<const std::string*>& tokens, std::string& out) const override {
    std::string bytes;
    for (const std::string* t : tokens) {
      bytes.clear();
      bool all = true;
      for (size_t i = 0; i < t->size() && all;) {
        size_t len;
        const int b = char_byte(decode_utf8(*t, i, len));
        all = b >= 0;
        bytes += static_cast<char>(b);
        i += len;
      }
      out += all ? bytes : *t;
    }
  }
};

// No decoder: tokenizers joins the tokens with spaces.
class JoinDecoder final : public Decoder {
 public:
  void decode(const std::vector<const std::string*>& tokens, std::string& out) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += *tokens[i];
    }
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    const nlohmann::json& list = field(j, "normalizers", w);
    TANDEM_CHECK(list.is_array(), w.at("normalizers").str(), "expected a list of normalizers, got ", list.type_name());
    // Every member is refused: only an empty sequence, which changes nothing, gets through.
    for (size_t i = 0; i < list.size(); ++i) make_normalizer(list[i], w.at("normalizers").index(i));
    return nullptr;
  }
  TANDEM_CHECK(false, w.str(), "the normalizer '", type,
               "' is not supported; tandem implements byte-level BPE files without a normalizer (\"normalizer\": "
               "null, as GPT-2's and Llama 3's have)");
  return nullptr;
}

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const Where& w) {
  if (j.is_null()) return std::make_unique<JoinDecoder>();
  const std::string type = type_of(j, w);
  TANDEM_CHECK(type == "ByteLevel", w.str(), "the decoder '", type,
               "' is not supported; tandem implements ByteLevel (GPT-2's and Llama 3's)");
  return std::make_unique<ByteLevelDecoder>();
}

}  // namespace tandem::data::tok
