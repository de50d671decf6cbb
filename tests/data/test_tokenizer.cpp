// The tokenizer.json reader against the `tokenizers` library: the ids it gave for the texts of
// tests/fixtures/tokenizer/cases.json (tests/fixtures/make_tokenizer_fixtures.py), decoding back, the
// parallel path, and the files it refuses.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <iterator>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "data/tokenizer/unicode.h"
#include "tandem/data/tokenizer.h"

namespace tandem::data {
namespace {

using testutil::expect_input_error;
using testutil::TempDir;

std::string fixture(const std::string& name) { return std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name; }

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct Case {
  std::string name, text;  // text: the bytes given to encode
  bool utf8 = true;
  std::map<std::string, std::vector<uint32_t>> ids;
  std::map<std::string, std::string> decoded;  // the library's decode where it is not the text
};

const nlohmann::json& cases_json() {
  static const nlohmann::json j = nlohmann::json::parse(slurp(fixture("cases.json")));
  return j;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& c : cases_json()["cases"]) {
    Case k;
    k.name = c["name"];
    if (c.contains("hex")) {
      const std::string hex = c["hex"];
      for (size_t i = 0; i < hex.size(); i += 2) k.text += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
      k.utf8 = false;
    } else {
      k.text = c["text"];
    }
    for (const auto& [t, ids] : c["ids"].items()) k.ids[t] = ids.get<std::vector<uint32_t>>();
    if (c.contains("decoded")) {
      for (const auto& [t, d] : c["decoded"].items()) k.decoded[t] = d.get<std::string>();
    }
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<std::string> tokenizer_names() {
  std::vector<std::string> names;
  for (const auto& [name, file] : cases_json()["files"].items()) names.push_back(name);
  return names;
}

Tokenizer load(const std::string& name) { return Tokenizer::from_file(fixture(cases_json()["files"][name])); }

TEST(Tokenizer, FixturesCoverWhatTheyShould) {
  EXPECT_EQ(tokenizer_names(), (std::vector<std::string>{"gpt2", "gpt2_prefix", "llama3"}));
  std::set<std::string> names;
  for (const Case& c : cases()) names.insert(c.name);
  for (const char* n : {"empty", "invalid inside", "long spaces", "long digits", "long newlines", "contractions",
                        "cjk", "emoji zwj", "combining marks", "special tokens", "category Lo", "category Mn",
                        "category Zs", "category Cc", "category Co", "category Cn", "category Nd", "category Sk",
                        "long"})
    EXPECT_TRUE(names.count(n)) << n;
}

// Each text gives the library's ids under each tokenizer, and decodes to the text (the library's
// decode where that differs: a token that strips the spaces around it, text that was not UTF-8).
TEST(Tokenizer, IdsAreTheLibrarys) {
  for (const std::string& name : tokenizer_names()) {
    const Tokenizer tok = load(name);
    for (const Case& c : cases()) {
      const std::vector<uint32_t> ids = tok.encode(c.text);
      EXPECT_EQ(ids, c.ids.at(name)) << name << ": " << c.name;
      const auto d = c.decoded.find(name);
      EXPECT_EQ(tok.decode(ids), d == c.decoded.end() ? c.text : d->second) << name << ": " << c.name;
      if (c.utf8 && d == c.decoded.end()) {
        EXPECT_EQ(tok.decode_bytes(ids), c.text) << name << ": " << c.name;
      }
      EXPECT_TRUE(c.utf8 || d != c.decoded.end()) << c.name;
    }
  }
}

// encode_batch cuts long texts into chunks encoded on several threads; the ids stay the library's.
TEST(Tokenizer, BatchOnThreadsGivesTheSameIds) {
  const std::vector<Case> all = cases();
  std::vector<std::string_view> texts;
  for (const Case& c : all) texts.push_back(c.text);
  // One long text of everything: valid texts only, so that no U+FFFD is made at a join.
  std::string joined;
  for (const Case& c : all)
    if (c.utf8) joined += c.text + "\n";
  for (const std::string& name : tokenizer_names()) {
    const Tokenizer tok = load(name);
    for (int threads : {1, 2, 5}) {
      const auto got = tok.encode_batch(texts, threads);
      ASSERT_EQ(got.size(), all.size());
      for (size_t i = 0; i < all.size(); ++i)
        EXPECT_EQ(got[i], all[i].ids.at(name)) << name << ", " << threads << " threads: " << all[i].name;
      EXPECT_EQ(tok.encode_batch({joined}, threads).at(0), tok.encode(joined)) << name << ", " << threads << " threads";
    }
  }
}

// Where the pre-tokenizer allows a cut (a letter, then no letter), the two halves give the ids of the
// whole: the property the parallel path rests on, at every such place of the texts.
TEST(Tokenizer, CutsBetweenALetterAndWhatFollowsKeepTheIds) {
  for (const char* name : {"gpt2", "llama3"}) {
    const Tokenizer tok = load(name);
    int cuts = 0;
    for (const Case& c : cases()) {
      if (!c.utf8 || c.text.size() > 3000 || c.text.find("<|") != std::string::npos || c.text.find("hello world") != std::string::npos)
        continue;
      const std::vector<uint32_t> whole = tok.encode(c.text);
      for (size_t p = 1; p < c.text.size(); ++p) {
        const auto b = static_cast<unsigned char>(c.text[p]), a = static_cast<unsigned char>(c.text[p - 1]);
        if (b >= 0x80 || !std::isalpha(a) || std::isalpha(b)) continue;  // an ASCII letter, then ASCII no letter
        std::vector<uint32_t> two = tok.encode(std::string_view(c.text).substr(0, p));
        const std::vector<uint32_t> rest = tok.encode(std::string_view(c.text).substr(p));
        two.insert(two.end(), rest.begin(), rest.end());
        EXPECT_EQ(two, whole) << name << ": " << c.name << " cut at " << p;
        ++cuts;
      }
    }
    EXPECT_GT(cuts, 100) << name;
  }
}

// GPT-2's own tokenizer.json writes an empty continuing_subword_prefix and end_of_word_suffix: the same as
// none, for tokenizers and for tandem.
TEST(Tokenizer, EmptyPrefixAndSuffixAreNone) {
  nlohmann::json j = nlohmann::json::parse(slurp(fixture("gpt2.json")));
  j["model"]["continuing_subword_prefix"] = "";
  j["model"]["end_of_word_suffix"] = "";
  const Tokenizer with_empty = Tokenizer::from_json(j.dump(), "gpt2 with empty prefix and suffix");
  for (const Case& c : cases()) EXPECT_EQ(with_empty.encode(c.text), c.ids.at("gpt2")) << c.name;
}

TEST(Tokenizer, VocabularyAndSpecialTokens) {
  const Tokenizer gpt2 = load("gpt2"), llama3 = load("llama3");
  EXPECT_EQ(gpt2.vocab_size(), 1202);
  EXPECT_EQ(llama3.vocab_size(), 1503);
  ASSERT_TRUE(gpt2.document_token());
  EXPECT_EQ(gpt2.id_to_token(*gpt2.document_token()), "<|endoftext|>");
  ASSERT_TRUE(llama3.document_token());
  EXPECT_EQ(llama3.id_to_token(*llama3.document_token()), "<|begin_of_text|>");
  EXPECT_EQ(*llama3.document_token(), 1500u);  // after the vocabulary, as Llama 3 numbers its special tokens
  EXPECT_TRUE(gpt2.is_special(*gpt2.document_token()));
  const uint32_t hw = *gpt2.token_to_id("hello world");
  EXPECT_FALSE(gpt2.is_special(hw));
  EXPECT_EQ(gpt2.token_to_id("Ġthe").has_value(), true);
  EXPECT_FALSE(gpt2.token_to_id("no such token").has_value());
  EXPECT_FALSE(gpt2.id_to_token(5000).has_value());
  // Decoding: special tokens kept or skipped; an id that is no token is refused.
  const std::vector<uint32_t> ids = gpt2.encode("a<|endoftext|>b");
  EXPECT_EQ(gpt2.decode(ids), "a<|endoftext|>b");
  EXPECT_EQ(gpt2.decode(ids, true), "ab");
  expect_input_error([&] { gpt2.decode({1, 5000}); }, {"id 5000", "position 1", "gpt2.json"});
  // A lone piece of a character decodes to U+FFFD, or to its byte without the replacement.
  const std::vector<uint32_t> e = gpt2.encode("\xC3\xA9");  // é
  std::string bytes;
  for (uint32_t id : e) bytes += gpt2.decode_bytes({id});
  EXPECT_EQ(bytes, "\xC3\xA9");
  EXPECT_TRUE(gpt2.describe().find("1202 tokens") != std::string::npos) << gpt2.describe();
}

// The files tandem does not read are refused when loaded, naming the file and the problem.
TEST(Tokenizer, RefusesWhatItDoesNotImplement) {
  const nlohmann::json base = nlohmann::json::parse(slurp(fixture("gpt2.json")));
  const nlohmann::json llama = nlohmann::json::parse(slurp(fixture("llama3.json")));
  struct Bad {
    const char* what;
    std::function<void(nlohmann::json&)> change;
    std::vector<std::string> says;
  };
  const std::vector<Bad> bad = {
      {"a WordPiece model", [](auto& j) { j["model"]["type"] = "WordPiece"; }, {"model", "'WordPiece'", "not supported"}},
      {"a normalizer", [](auto& j) { j["normalizer"] = {{"type", "NFC"}}; }, {"normalizer", "'NFC'", "not supported"}},
      {"a pre-tokenizer", [](auto& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; },
       {"pre_tokenizer", "'Whitespace'", "not supported"}},
      {"a split pattern", [&](auto& j) {
         j = llama;
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|[^\\w\\s]+";
       }, {"pre_tokenizer.pretokenizers[0].pattern", "split pattern", "\\\\w+", "GPT-2's", "Llama 3's"}},
      {"a split behaviour", [&](auto& j) {
         j = llama;
         j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
       }, {"behavior", "'Removed'", "Isolated"}},
      {"a string pattern", [&](auto& j) {
         j = llama;
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}};
       }, {"String pattern", "not supported"}},
      {"a decoder", [](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder", "'WordPiece'"}},
      {"dropout", [](auto& j) { j["model"]["dropout"] = 0.1; }, {"dropout", "0.1"}},
      {"a subword prefix", [](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       {"continuing_subword_prefix", "not supported"}},
      {"a merge of unknown tokens", [](auto& j) { j["model"]["merges"][3] = {"zzq", "qzz"}; },
       {"model.merges", "merge 3", "\"zzq\"", "not in the vocabulary"}},
      {"a malformed merge", [](auto& j) { j["model"]["merges"][2] = "a b c"; }, {"model.merges[2]", "two tokens"}},
      {"a vocabulary id twice", [](auto& j) { j["model"]["vocab"]["zzq"] = 5; }, {"model.vocab", "id 5", "both"}},
      {"a negative id", [](auto& j) { j["model"]["vocab"]["zzq"] = -1; }, {"model.vocab", "\"zzq\"", "-1"}},
      {"no vocabulary", [](auto& j) { j["model"].erase("vocab"); }, {"model", "'vocab' is missing"}},
      {"an added token's wrong id", [](auto& j) { j["added_tokens"][1]["id"] = 7; },
       {"added_tokens[1]", "\"<|pad|>\"", "id 7", "gives it 1200"}},
      {"a single-word token", [](auto& j) { j["added_tokens"][1]["single_word"] = true; },
       {"added_tokens[1].single_word", "single words"}},
      {"truncation", [](auto& j) { j["truncation"] = {{"max_length", 8}}; }, {"truncation", "max_length"}},
      {"another version", [](auto& j) { j["version"] = "2.0"; }, {"version", "\"2.0\""}},
      {"not a tokenizer.json", [](auto& j) { j = {{"vocab", 1}}; }, {"no \"model\""}},
      {"a list", [](auto& j) { j = nlohmann::json::array(); }, {"expected a JSON object"}},
  };
  for (const Bad& b : bad) {
    nlohmann::json j = base;
    b.change(j);
    std::vector<std::string> says = b.says;
    says.push_back("'bad.json'");
    expect_input_error([&] { Tokenizer::from_json(j.dump(), "bad.json"); }, says);
  }
  // A file cut short, one that does not exist, a directory.
  TempDir dir;
  const std::string text = slurp(fixture("gpt2.json"));
  testutil::write_file(dir.file("cut.json"), testutil::Bytes(text.begin(), text.begin() + 5000));
  expect_input_error([&] { Tokenizer::from_file(dir.file("cut.json")); }, {dir.file("cut.json"), "not valid JSON", "parse error"});
  expect_input_error([&] { Tokenizer::from_file(dir.file("none.json")); }, {dir.file("none.json")});
  expect_input_error([&] { Tokenizer::from_file(dir.path()); }, {dir.path(), "directory"});
}

// The generated tables (src/data/tokenizer/make_unicode_tables.py, whose --check compares every code point
// with the library): Unicode 16.0's classes at the edges that matter.
TEST(Tokenizer, UnicodeTablesAreUnicode16s) {
  using tok::CharClass;
  using tok::char_class;
  EXPECT_STREQ(tok::kUnicodeVersion, "16.0.0");
  EXPECT_EQ(char_class(0x10D50), CharClass::letter);  // Garay, new in 16.0
  EXPECT_EQ(char_class(0x10940), CharClass::other);   // Sidetic, new in 17.0: unassigned in 16.0
  EXPECT_EQ(char_class(0x4E2D), CharClass::letter);   // 中
  EXPECT_EQ(char_class(0x0301), CharClass::other);    // a combining mark
  EXPECT_EQ(char_class(0xFF10), CharClass::number);   // fullwidth 0
  EXPECT_EQ(char_class(0x2164), CharClass::number);   // Roman numeral V (Nl)
  EXPECT_EQ(char_class(0x00BD), CharClass::number);   // ½ (No)
  for (uint32_t s : {0x09u, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u})
    EXPECT_EQ(char_class(s), CharClass::space) << std::hex << s;
  for (uint32_t o : {0x180Eu, 0x200Bu, 0x200Du, 0xFEFFu, 0x1F600u, 0xE000u, 0x10FFFFu})
    EXPECT_EQ(char_class(o), CharClass::other) << std::hex << o;
  // Ill-formed UTF-8: one U+FFFD per maximal subpart, as Python's errors="replace" gives.
  EXPECT_EQ(tok::to_valid_utf8("a\xE2\x82" "b\xF0\x9F\x98\xC0\xAF\xED\xA0\x80"),
            "a\uFFFDb\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD");
}

TEST(Tokenizer, Sha256OfAFile) {
  TempDir dir;
  testutil::write_file(dir.file("empty"), {});
  testutil::write_file(dir.file("abc"), {'a', 'b', 'c'});
  testutil::write_file(dir.file("million"), testutil::Bytes(1000000, 'a'));
  EXPECT_EQ(sha256_file(dir.file("empty")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_file(dir.file("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_file(dir.file("million")), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace tandem::data
