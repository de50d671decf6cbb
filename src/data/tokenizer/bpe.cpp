// The BPE model stage: a word's characters, then merges, lowest rank first, leftmost among equals, as
// the `tokenizers` library does them (its priority queue, its check of stale entries).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <queue>

#include <nlohmann/json.hpp>

#include "data/tokenizer/stages.h"
#include "data/tokenizer/unicode.h"
#include "tandem/error.h"

namespace tandem::data::tok {

namespace {

class Bpe final : public Model {
 public:
  Bpe(const nlohmann::json& j, const Where& w) {
    const nlohmann::json* d = j.contains("dropout") ? &j["dropout"] : nullptr;
    TANDEM_CHECK(!d || d->is_null() || (d->is_number() && d->get<double>() == 0.0), w.at("dropout").str(),
                 "BPE dropout ", d ? d->dump() : "", " draws merges at random; tandem encodes deterministically and "
                 "supports no dropout (null or 0)");
    // An empty prefix or suffix, as GPT-2's tokenizer.json has them, changes nothing.
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      TANDEM_CHECK(!j.contains(key) || j[key].is_null() || j[key] == "", w.at(key).str(), "BPE with a ", key, " (",
                   j[key].dump(), ") is not supported");
    fuse_unk_ = bool_field(j, "fuse_unk", false, w);
    byte_fallback_ = bool_field(j, "byte_fallback", false, w);
    ignore_merges_ = bool_field(j, "ignore_merges", false, w);
    read_vocab(field(j, "vocab", w), w.at("vocab"));
    if (j.contains("unk_token") && !j["unk_token"].is_null()) {
      const std::string unk = string_field(j, "unk_token", w);
      const int64_t u = id(unk);
      TANDEM_CHECK(u >= 0, w.at("unk_token").str(), "the unknown token '", unk, "' is not in the vocabulary");
      unk_ = u;
    }
    read_merges(field(j, "merges", w), w.at("merges"));
  }

  void tokenize(std::string_view word, std::vector<uint32_t>& out, Cache& cache) const override {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (const auto it = vocab_.find(word); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const bool cacheable = word.size() <= kCachedWordBytes;
    if (cacheable) {
      if (const auto it = cache.words.find(word); it != cache.words.end()) {
        const uint32_t* p = cache.ids.data() + it->second.first;
        out.insert(out.end(), p, p + it->second.second);
        return;
      }
    }
    const size_t first = out.size();
    merge_word(word, out);
    if (cacheable) {
      if (cache.words.size() >= kCacheWords) {
        cache.words.clear();
        cache.ids.clear();
      }
      const auto offset = static_cast<uint32_t>(cache.ids.size());
      cache.ids.insert(cache.ids.end(), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      cache.words.emplace(std::string(word), std::make_pair(offset, static_cast<uint32_t>(out.size() - first)));
    }
  }

  const std::string* token(uint32_t i) const override {
    return i < tokens_.size() && has_[i] ? &tokens_[i] : nullptr;
  }
  int64_t id(std::string_view t) const override {
    const auto it = vocab_.find(t);
    return it == vocab_.end() ? -1 : static_cast<int64_t>(it->second);
  }
  size_t size() const override { return vocab_.size(); }
  int64_t id_bound() const override { return static_cast<int64_t>(tokens_.size()); }

 private:
  static constexpr size_t kCachedWordBytes = 256;
  static constexpr size_t kCacheWords = 1 << 18;

  struct Symbol {
    uint32_t c;
    int32_t prev, next;
    uint32_t len;
  };
  struct Merge {
    uint32_t pos, rank, new_id;
    // std::priority_queue puts the largest first: the lowest rank, then the leftmost, is "largest".
    bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  void read_vocab(const nlohmann::json& v, const Where& w) {
    TANDEM_CHECK(v.is_object(), w.str(), "expected an object of token: id, got ", v.type_name());
    TANDEM_CHECK(!v.empty(), w.str(), "the vocabulary is empty");
    int64_t bound = 0;
    for (auto it = v.begin(); it != v.end(); ++it) {
      TANDEM_CHECK(it.value().is_number_unsigned() && it.value().get<uint64_t>() < (uint64_t{1} << 31), w.str(),
                   "the id of token ", nlohmann::json(it.key()).dump(), " must be an integer in [0, 2^31), got ",
                   it.value().dump());
      bound = std::max<int64_t>(bound, it.value().get<int64_t>() + 1);
    }
    tokens_.assign(static_cast<size_t>(bound), std::string());
    has_.assign(static_cast<size_t>(bound), 0);
    vocab_.reserve(v.size());
    for (auto it = v.begin(); it != v.end(); ++it) {
      const auto i = it.value().get<uint32_t>();
      TANDEM_CHECK(!has_[i], w.str(), "id ", i, " is given to both ", nlohmann::json(tokens_[i]).dump(), " and ",
                   nlohmann::json(it.key()).dump());
      has_[i] = 1;
      tokens_[i] = it.key();
      vocab_.emplace(it.key(), i);
      size_t len;
      if (!it.key().empty()) {
        const uint32_t cp = decode_utf8(it.key(), 0, len);
        if (len == it.key().size() && cp < kShortChars) short_char_[cp] = static_cast<int32_t>(i);
      }
    }
  }

  uint32_t merge_id(const std::string& token, size_t rank, const Where& w) const {
    const auto it = vocab_.find(token);
    TANDEM_CHECK(it != vocab_.end(), w.str(), "merge ", rank, " uses the token ", nlohmann::json(token).dump(),
                 ", which is not in the vocabulary");
    return it->second;
  }

  void read_merges(const nlohmann::json& m, const Where& w) {
    TANDEM_CHECK(m.is_array(), w.str(), "expected a list of merges, got ", m.type_name());
    merges_.reserve(m.size());
    size_t rank = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      const nlohmann::json& e = m[i];
      std::string a, b;
      if (e.is_string()) {
        // The older form: "a b". tokenizers skips "#version" lines and counts ranks without them.
        const std::string& s = e.get_ref<const std::string&>();
        if (s.rfind("#version", 0) == 0) continue;
        const size_t sp = s.find(' ');
        TANDEM_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, w.index(i).str(),
                     "a merge must be two tokens separated by one space, got ", e.dump());
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        TANDEM_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), w.index(i).str(),
                     "a merge must be \"a b\" or [\"a\", \"b\"], got ", e.dump());
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      }
      const uint32_t ia = merge_id(a, i, w), ib = merge_id(b, i, w), inew = merge_id(a + b, i, w);
      // A pair given twice keeps its last rank, as tokenizers' map does.
      merges_[key(ia, ib)] = {static_cast<uint32_t>(rank), inew};
      ++rank;
    }
  }

  static uint64_t key(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

  const std::pair<uint32_t, uint32_t>* find_merge(uint32_t a, uint32_t b) const {
    const auto it = merges_.find(key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  int64_t char_id(std::string_view ch) const {
    size_t len;
    const uint32_t cp = decode_utf8(ch, 0, len);
    if (cp < kShortChars) return short_char_[cp];
    return id(ch);
  }

  void merge_word(std::string_view w, std::vector<uint32_t>& out) const {
    std::vector<Symbol> sym;
    sym.reserve(w.size());
    auto add = [&](uint32_t c, uint32_t len) {
      const auto n = static_cast<int32_t>(sym.size());
      sym.push_back({c, n - 1, -1, len});
      if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
    };
    int64_t unk_len = -1;  // a pending unknown token's bytes (fuse_unk), -1 when none
    for (size_t i = 0; i < w.size();) {
      size_t len;
      decode_utf8(w, i, len);
      const std::string_view ch = w.substr(i, len);
      i += len;
      const int64_t c = char_id(ch);
      if (c >= 0) {
        if (unk_len >= 0) add(static_cast<uint32_t>(unk_), static_cast<uint32_t>(unk_len));
        unk_len = -1;
        add(static_cast<uint32_t>(c), static_cast<uint32_t>(len));
        continue;
      }
      if (byte_fallback_) {
        std::vector<uint32_t> bytes;
        for (const char b : ch) {
          char name[8];
          std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(b));
          const int64_t bid = id(name);
          if (bid < 0) break;
          bytes.push_back(static_cast<uint32_t>(bid));
        }
        if (bytes.size() == ch.size()) {
          for (uint32_t b : bytes) add(b, 1);
          continue;
        }
      }
      if (unk_ >= 0) {
        if (unk_len >= 0 && fuse_unk_) {
          unk_len += static_cast<int64_t>(len);
        } else {
          if (unk_len >= 0) add(static_cast<uint32_t>(unk_), static_cast<uint32_t>(unk_len));
          unk_len = static_cast<int64_t>(len);
        }
      }
      // Without an unknown token, tokenizers leaves the character out.
    }
    if (unk_len >= 0) add(static_cast<uint32_t>(unk_), static_cast<uint32_t>(unk_len));

    std::priority_queue<Merge> queue;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (const auto* m = find_merge(sym[i].c, sym[i + 1].c))
        queue.push({static_cast<uint32_t>(i), m->first, m->second});
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Symbol& cur = sym[top.pos];
      if (cur.len == 0 || cur.next < 0) continue;
      const Symbol right = sym[static_cast<size_t>(cur.next)];
      // An entry made stale by an earlier merge: its pair is gone or makes another token now.
      const auto* m = find_merge(cur.c, right.c);
      if (!m || m->second != top.new_id) continue;
      cur.c = top.new_id;
      cur.len += right.len;
      sym[static_cast<size_t>(cur.next)].len = 0;
      cur.next = right.next;
      if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
      if (cur.prev >= 0) {
        if (const auto* pm = find_merge(sym[static_cast<size_t>(cur.prev)].c, cur.c))
          queue.push({static_cast<uint32_t>(cur.prev), pm->first, pm->second});
      }
      if (cur.next >= 0) {
        if (const auto* nm = find_merge(cur.c, sym[static_cast<size_t>(cur.next)].c))
          queue.push({top.pos, nm->first, nm->second});
      }
    }
    for (const Symbol& s : sym)
      if (s.len != 0) out.push_back(s.c);
  }

  static constexpr uint32_t kShortChars = 0x800;
  StringMap<uint32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> token
  std::vector<uint8_t> has_;
  std::vector<int32_t> short_char_ = std::vector<int32_t>(kShortChars, -1);  // one-character tokens by code point
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges_;  // (a, b) -> (rank, merged id)
  int64_t unk_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
};

}  // namespace

std::unique_ptr<Model> make_model(const nlohmann::json& j, const Where& w) {
  TANDEM_CHECK(j.is_object(), w.str(), "expected the model as an object, got ", j.type_name());
  // Files written by tokenizers name the type; a BPE model is also recognised by its merges.
  const std::string type = j.contains("type") ? type_of(j, w) : (j.contains("merges") ? "BPE" : "?");
  TANDEM_CHECK(type == "BPE", w.str(), "the model '", type,
               "' is not supported; tandem implements BPE (byte-level, as GPT-2 and Llama 3 use it)");
  return std::make_unique<Bpe>(j, w);
}

}  // namespace tandem::data::tok
