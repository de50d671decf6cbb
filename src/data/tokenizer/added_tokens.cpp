// Added tokens: found in the text leftmost-longest (as the library's Aho-Corasick automaton finds
// them), with the white space an lstrip/rstrip token takes with it.
#include "data/tokenizer/added_tokens.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "data/tokenizer/unicode.h"
#include "tandem/error.h"

namespace tandem::data::tok {

namespace {

bool is_space_at(std::string_view s, size_t i, size_t& len) {
  return char_class(decode_utf8(s, i, len)) == CharClass::space;
}

}  // namespace

void AddedTokens::Trie::add(std::string_view s, int32_t token) {
  size_t n = 0;
  for (const char ch : s) {
    const auto b = static_cast<uint8_t>(ch);
    auto& next = nodes[n].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1}),
                               [](const auto& x, const auto& y) { return x.first < y.first; });
    if (it == next.end() || it->first != b) {
      const auto child = static_cast<int32_t>(nodes.size());
      next.insert(it, {b, child});
      nodes.emplace_back();
      n = static_cast<size_t>(child);
    } else {
      n = static_cast<size_t>(it->second);
    }
  }
  nodes[n].token = token;
  first[static_cast<uint8_t>(s[0])] = true;
}

int32_t AddedTokens::Trie::longest(std::string_view text, size_t i, size_t& len) const {
  int32_t best = -1;
  size_t n = 0;
  for (size_t k = i; k < text.size(); ++k) {
    const auto b = static_cast<uint8_t>(text[k]);
    const auto& next = nodes[n].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1}),
                               [](const auto& x, const auto& y) { return x.first < y.first; });
    if (it == next.end() || it->first != b) break;
    n = static_cast<size_t>(it->second);
    if (nodes[n].token >= 0) {
      best = nodes[n].token;
      len = k + 1 - i;
    }
  }
  return best;
}

AddedTokens::AddedTokens(const nlohmann::json& list, const Model& model, const Where& w) {
  if (list.is_null()) return;
  TANDEM_CHECK(list.is_array(), w.str(), "expected a list of added tokens, got ", list.type_name());
  std::map<std::string, size_t, std::less<>> by_content;
  // tokenizers numbers a token the model lacks from the vocabulary's size on (or after the largest
  // added id already beyond it).
  int64_t next_id = static_cast<int64_t>(model.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Where tw = w.index(i);
    const nlohmann::json& t = list[i];
    AddedToken a;
    a.content = string_field(t, "content", tw);
    const nlohmann::json& idj = field(t, "id", tw);
    TANDEM_CHECK(idj.is_number_unsigned() && idj.get<uint64_t>() < (uint64_t{1} << 31), tw.at("id").str(),
                 "expected an integer in [0, 2^31), got ", idj.dump());
    a.id = idj.get<uint32_t>();
    TANDEM_CHECK(!bool_field(t, "single_word", false, tw), tw.at("single_word").str(), "the added token ",
                 nlohmann::json(a.content).dump(), " matches single words only, which tandem does not implement");
    a.lstrip = bool_field(t, "lstrip", false, tw);
    a.rstrip = bool_field(t, "rstrip", false, tw);
    a.special = bool_field(t, "special", false, tw);
    a.normalized = bool_field(t, "normalized", !a.special, tw);
    if (a.content.empty()) continue;  // tokenizers ignores an empty token
    TANDEM_CHECK(valid_utf8_prefix(a.content) == a.content.size(), tw.str(), "the content is not valid UTF-8");
    int64_t want;
    if (const auto it = by_content.find(a.content); it != by_content.end()) {
      want = tokens_[it->second].id;
    } else if (const int64_t m = model.id(a.content); m >= 0) {
      want = m;
    } else {
      want = next_id;
    }
    TANDEM_CHECK(a.id == want, tw.str(), "the added token ", nlohmann::json(a.content).dump(), " has id ", a.id,
                 ", but the tokenizers library gives it ", want,
                 want < static_cast<int64_t>(model.size()) ? " (its id in the model's vocabulary)"
                                                           : " (the next id after the vocabulary)");
    if (want == next_id) ++next_id;
    if (const auto it = by_content.find(a.content); it != by_content.end()) {
      tokens_[it->second] = a;  // the later entry's settings win
    } else {
      by_content.emplace(a.content, tokens_.size());
      tokens_.push_back(a);
    }
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    (tokens_[i].normalized ? normalized_ : raw_).add(tokens_[i].content, static_cast<int32_t>(i));
    by_id_[tokens_[i].id] = i;
    by_content_[tokens_[i].content] = i;
  }
}

const AddedToken* AddedTokens::find(uint32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedTokens::find(std::string_view content) const {
  const auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

int64_t AddedTokens::id_bound() const {
  int64_t b = 0;
  for (const AddedToken& t : tokens_) b = std::max<int64_t>(b, int64_t{t.id} + 1);
  return b;
}

void AddedTokens::split_with(const Trie& trie, std::string_view text, size_t begin, size_t end,
                             std::vector<Segment>& out) const {
  if (trie.empty()) {
    out.push_back({begin, end, -1});
    return;
  }
  const std::string_view piece = text.substr(0, end);
  size_t start = begin;  // where the text not yet given out starts
  for (size_t i = begin; i < end;) {
    size_t len = 0;
    const int32_t t = trie.first[static_cast<uint8_t>(piece[i])] ? trie.longest(piece, i, len) : -1;
    if (t < 0) {
      ++i;
      continue;
    }
    const AddedToken& a = tokens_[static_cast<size_t>(t)];
    size_t b = i, e = i + len;
    if (a.lstrip) {  // the white space before it, but not what an earlier match took
      size_t k = b;
      while (k > begin) {
        const size_t p = previous_utf8(piece, k);
        size_t l;
        if (!is_space_at(piece, p, l)) break;
        k = p;
      }
      b = std::max(k, start);
    }
    if (a.rstrip) {
      size_t l;
      while (e < end && is_space_at(piece, e, l)) e += l;
    }
    if (start < b) out.push_back({start, b, -1});
    out.push_back({b, e, static_cast<int64_t>(a.id)});
    start = e;
    i += len;  // the next match starts after this one's own bytes, as the automaton's does
    i = std::max(i, e);
  }
  if (start < end) out.push_back({start, end, -1});
}

std::vector<Segment> AddedTokens::split(std::string_view text) const {
  std::vector<Segment> first, out;
  split_with(raw_, text, 0, text.size(), first);
  for (const Segment& s : first) {
    if (s.id >= 0) out.push_back(s);
    else if (s.begin < s.end) split_with(normalized_, text, s.begin, s.end, out);
  }
  return out;
}

}  // namespace tandem::data::tok
