// libFuzzer harness: the tokenizer.json reader and the tokenizer. Any bytes read as a tokenizer.json give a
// tokenizer or a tandem::Error; any bytes encoded by a byte-level BPE tokenizer decode back to themselves
// (ill-formed UTF-8 as U+FFFD), and encoding them on threads (a long input cut into chunks) gives the same ids.
#include <nlohmann/json.hpp>

#include "data/tokenizer/stages.h"
#include "data/tokenizer/unicode.h"
#include "tandem/data/tokenizer.h"
#include "tandem/error.h"

namespace {

// A small GPT-2-style tokenizer: the 256 byte characters, a few merges, <|endoftext|>.
const tandem::data::Tokenizer& tokenizer() {
  static const tandem::data::Tokenizer tok = [] {
    nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
    for (int b = 0; b < 256; ++b) vocab[tandem::data::tok::byte_char(static_cast<uint8_t>(b))] = b;
    int next = 256;
    for (const char* pair : {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ Ġ", "ĠĠ ĠĠ", "1 2", "12 3"}) {
      const std::string p = pair;
      const size_t sp = p.find(' ');
      vocab[p.substr(0, sp) + p.substr(sp + 1)] = next++;
      merges.push_back(p);
    }
    vocab["<|endoftext|>"] = next;
    const nlohmann::json j = {
        {"version", "1.0"},
        {"added_tokens", {{{"id", next}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
    return tandem::data::Tokenizer::from_json(j.dump(), "fuzz tokenizer");
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)tandem::data::Tokenizer::from_json(text, "fuzz input");
  } catch (const tandem::Error&) {
  }
  const tandem::data::Tokenizer& tok = tokenizer();
  const std::vector<uint32_t> ids = tok.encode(text);
  for (uint32_t id : ids)
    if (id >= static_cast<uint64_t>(tok.vocab_size())) __builtin_trap();
  if (tok.decode(ids) != tandem::data::tok::to_valid_utf8(text)) __builtin_trap();
  if (tok.encode_batch({text}, 3).at(0) != ids) __builtin_trap();
  return 0;
}
