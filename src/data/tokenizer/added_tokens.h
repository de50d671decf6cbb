#pragma once
// Internal: the added tokens of a tokenizer.json (special tokens such as <|endoftext|>, and tokens added
// to a vocabulary), which are cut out of the text before any other stage sees it.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/tokenizer/stages.h"

namespace tandem::data::tok {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool lstrip = false, rstrip = false, normalized = true, special = false;
};

/// A piece of the text: an added token (id >= 0) or text for the other stages (id < 0).
struct Segment {
  size_t begin = 0, end = 0;
  int64_t id = -1;
};

class AddedTokens {
 public:
  AddedTokens() = default;
  /// Reads the "added_tokens" list and checks each id against what the `tokenizers` library gives it
  /// (the model's id where the model has the token, the next free id after the vocabulary otherwise).
  AddedTokens(const nlohmann::json& list, const Model& model, const Where& w);

  /// text cut into added tokens and the text between them (empty pieces left out), in order. Tokens
  /// that are matched before normalization are looked for first, then the others in what is left
  /// (the same text: tandem has no normalizer).
  std::vector<Segment> split(std::string_view text) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  /// The added token of an id, or nullptr.
  const AddedToken* find(uint32_t id) const;
  /// The added token of a content, or nullptr.
  const AddedToken* find(std::string_view content) const;
  /// The largest id + 1 (0 when there are none).
  int64_t id_bound() const;

 private:
  // A byte trie of one set of contents, for leftmost-longest matching.
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
      int32_t token = -1;                              // index into tokens_ of a content ending here
    };
    std::vector<Node> nodes{Node{}};
    bool first[256] = {};
    void add(std::string_view s, int32_t token);
    // The token of the longest content that starts at text[i], and its length; -1 when none.
    int32_t longest(std::string_view text, size_t i, size_t& len) const;
    bool empty() const { return nodes.size() == 1; }
  };
  void split_with(const Trie& trie, std::string_view text, size_t begin, size_t end, std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<uint32_t, size_t> by_id_;
  StringMap<size_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace tandem::data::tok
