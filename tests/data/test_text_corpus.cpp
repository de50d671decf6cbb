// Text corpora: Project Gutenberg's header and footer in their modern and older styles, the choice of
// the validation files, and what write_text_corpus writes, byte-level and with a tokenizer.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "tandem/data/text_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/data/tokens.h"

namespace tandem::data {
namespace {

using testutil::expect_input_error;
using testutil::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

std::string body_of(const std::string& text) {
  const TextSpan s = gutenberg_body(text);
  return text.substr(s.begin, s.end - s.begin);
}

const std::string kBody = "ACT I. SCENE I.\r\nEnter two Gentlemen.\r\n\r\nFIRST GENTLEMAN.\r\nYou do not meet a man...\r\n";

TEST(GutenbergText, ModernHeaderAndFooterAreLeftOut) {
  const std::string text =
      "\xEF\xBB\xBFThe Project Gutenberg eBook of Cymbeline\r\n\r\nThis ebook is for the use of anyone anywhere...\r\n"
      "*** START OF THE PROJECT GUTENBERG EBOOK CYMBELINE ***\r\n" +
      kBody +
      "*** END OF THE PROJECT GUTENBERG EBOOK CYMBELINE ***\r\n\r\nUpdated editions will replace the previous one...\r\n";
  const TextSpan s = gutenberg_body(text);
  EXPECT_TRUE(s.header);
  EXPECT_TRUE(s.footer);
  EXPECT_EQ(body_of(text), kBody);
  // The 2000s style: "THIS" and no space after the asterisks, an "End of" line before the marker.
  const std::string older =
      "Project Gutenberg's Hamlet\n***START OF THIS PROJECT GUTENBERG EBOOK HAMLET***\n" + kBody +
      "End of the Project Gutenberg EBook of Hamlet\n\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n";
  EXPECT_EQ(body_of(older), kBody);
}

TEST(GutenbergText, SmallPrintStyleIsLeftOut) {
  const std::string text =
      "The Project Gutenberg Etext of The Tempest\n\n**Welcome To The World of Free Plain Vanilla Electronic Texts**\n"
      "...\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n" +
      kBody + "End of this Etext of The Tempest\n";
  const TextSpan s = gutenberg_body(text);
  EXPECT_TRUE(s.header && s.footer);
  EXPECT_EQ(body_of(text), kBody);
  const std::string v2 = "header\n*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*Ver.02/11/02*END*\n" + kBody +
                         "End of The Project Gutenberg Etext of Othello\n";
  EXPECT_EQ(body_of(v2), kBody);
}

TEST(GutenbergText, TextWithoutMarkersIsKeptWhole) {
  const std::string plain = "HAMLET, PRINCE OF DENMARK\n\nby William Shakespeare\n\n*** a row of stars ***\n";
  const TextSpan s = gutenberg_body(plain);
  EXPECT_FALSE(s.header);
  EXPECT_FALSE(s.footer);
  EXPECT_EQ(body_of(plain), plain);
  EXPECT_EQ(body_of(""), "");
  // A header alone, or a footer alone.
  EXPECT_EQ(body_of("licence\n*** START OF X ***\nbody\n"), "body\n");
  EXPECT_EQ(body_of("body\n*** END OF X ***\nlicence"), "body\n");
}

TEST(TextCorpus, ValidationFilesAreTheLastOnesClosestToTheFraction) {
  using V = std::vector<bool>;
  EXPECT_EQ(choose_validation_files({100, 100, 100, 100, 100, 100, 100, 100, 100, 100}, 0.1),
            (V{false, false, false, false, false, false, false, false, false, true}));
  EXPECT_EQ(choose_validation_files({100, 100, 100, 100, 100, 100, 100, 100, 100, 100}, 0.25),
            (V{false, false, false, false, false, false, false, false, true, true}))
      << "250 of 1000 bytes: two files give 200, three 300; the tie goes to fewer";
  EXPECT_EQ(choose_validation_files({500, 500}, 0.01), (V{false, true})) << "at least one file to validation";
  EXPECT_EQ(choose_validation_files({10, 10, 10}, 0.99), (V{false, true, true})) << "at least one file to training";
  EXPECT_EQ(choose_validation_files({10, 900, 50, 40}, 0.1), (V{false, false, true, true})) << "90 bytes of 1000";
  EXPECT_EQ(choose_validation_files({10, 900, 50, 40}, 0.0), (V{false, false, false, false}));
  EXPECT_EQ(choose_validation_files({100}, 0.1), (V{false})) << "one file is split within itself, not chosen";
  expect_input_error([] { choose_validation_files({1, 2}, 1.0); }, {"--val must be in [0, 1)"});
}

TEST(TextCorpus, WritesShardsAndMetadata) {
  TempDir dir;
  const std::vector<std::string> texts = {"alpha text\n", "bravo, a longer text\n", std::string("\x00\xff\x80z", 4),
                                          "delta\n"};
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); ++i) {
    files.push_back(dir.file(std::string(1, static_cast<char>('a' + i)) + ".txt"));
    write_text(files.back(), texts[i]);
  }
  TextCorpusOptions o;
  o.files = {files[2], files[0], files[3], files[1]};  // taken in order of their paths
  o.out_dir = dir.file("out/shards");
  o.val_fraction = 0.15;
  o.shard_tokens = 8;
  o.binary_ok = true;  // c.txt holds a zero byte
  std::vector<std::string> lines;
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  const TextCorpusReport r = write_text_corpus(o);
  ASSERT_EQ(r.files.size(), 4u);
  EXPECT_EQ(r.files[0].path, files[0]);
  EXPECT_TRUE(r.files[3].val);  // d.txt: 6 of 42 bytes, the closest to 15 %
  EXPECT_FALSE(r.files[0].val || r.files[1].val || r.files[2].val);
  EXPECT_EQ(r.train_tokens, 11 + 21 + 4);
  EXPECT_EQ(r.val_tokens, 6);
  ASSERT_EQ(r.train_shards.size(), 5u);  // 36 tokens, 8 a shard
  ASSERT_EQ(r.val_shards.size(), 1u);
  EXPECT_FALSE(lines.empty());
  // Training tokens are the training files' bytes, in order, across the shards.
  TokenStream train(o.out_dir + "/train_*.bin", 256);
  std::string joined = texts[0] + texts[1] + texts[2];
  ASSERT_EQ(train.size(), static_cast<int64_t>(joined.size()));
  for (int64_t i = 0; i < train.size(); ++i)
    EXPECT_EQ(train.at(i), static_cast<unsigned char>(joined[static_cast<size_t>(i)])) << i;
  for (const auto& s : train.shards()) EXPECT_EQ(s->format(), TokenFormat::llmc);
  TokenStream val(o.out_dir + "/val_*.bin", 256);
  EXPECT_EQ(val.size(), 6);
  EXPECT_EQ(val.at(0), 'd');
  std::ifstream mf(r.meta_path);
  const auto meta = nlohmann::json::parse(mf);
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_EQ(meta["train"]["tokens"], 36);
  EXPECT_EQ(meta["val"]["files"], nlohmann::json::array({files[3]}));
  EXPECT_EQ(meta["train"]["shards"].size(), 5u);

  // A second run with larger shards leaves no shard of the first behind.
  o.shard_tokens = 1000;
  const TextCorpusReport r2 = write_text_corpus(o);
  EXPECT_EQ(r2.train_shards.size(), 1u);
  EXPECT_EQ(r2.removed.size(), 4u);
  EXPECT_EQ(TokenStream(o.out_dir + "/train_*.bin").size(), 36);
}

std::string tokenizer_fixture(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

std::vector<uint32_t> stream_tokens(const TokenStream& s) {
  std::vector<uint32_t> out(static_cast<size_t>(s.size()));
  s.copy(0, s.size(), out.data());
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// With a tokenizer.json: each file's ids after one document token (the family's), uint16 shards,
// the same shards whatever the number of threads, and meta.json naming the tokenizer and its hash.
TEST(TextCorpus, TokenizerShardsHoldEachFilesIdsAfterTheDocumentToken) {
  TempDir dir;
  const std::vector<std::string> texts = {"First file: it's 2024, the year of 中文 and emoji 👍.\n",
                                          std::string(3000, ' ') + "spaces, then\n\n\nnewlines",
                                          "third<|endoftext|>file with a special token inside\n", "the last one\n"};
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); ++i) {
    files.push_back(dir.file(std::string(1, static_cast<char>('a' + i)) + ".txt"));
    write_text(files.back(), texts[i]);
  }
  for (const char* name : {"gpt2.json", "llama3.json"}) {
    const Tokenizer tok = Tokenizer::from_file(tokenizer_fixture(name));
    const uint32_t doc = *tok.document_token();
    TextCorpusOptions o;
    o.files = files;
    o.out_dir = dir.file(std::string("out-") + name);
    o.val_fraction = 0.001;  // d.txt alone
    o.tokenizer = tokenizer_fixture(name);
    o.shard_tokens = 40;
    std::vector<std::vector<uint32_t>> shards_by_threads;
    for (int threads : {1, 2}) {
      o.threads = threads;
      const TextCorpusReport r = write_text_corpus(o);
      EXPECT_EQ(r.vocab_size, tok.vocab_size());
      EXPECT_EQ(r.token_bytes, 2);
      EXPECT_EQ(r.document_token_id, static_cast<int64_t>(doc));
      ASSERT_TRUE(r.files[3].val) << name;
      std::vector<uint32_t> want;
      for (size_t i = 0; i < 3; ++i) {
        want.push_back(doc);
        const auto ids = tok.encode(texts[i]);
        want.insert(want.end(), ids.begin(), ids.end());
        EXPECT_EQ(r.files[i].tokens, static_cast<int64_t>(ids.size()) + 1);
      }
      const TokenStream train(o.out_dir + "/train_*.bin", tok.vocab_size());
      EXPECT_EQ(stream_tokens(train), want) << name;
      EXPECT_GT(train.shards().size(), 1u);
      for (const auto& s : train.shards()) EXPECT_EQ(s->format(), TokenFormat::llmc);
      std::vector<uint32_t> want_val{doc};
      const auto last = tok.encode(texts[3]);
      want_val.insert(want_val.end(), last.begin(), last.end());
      EXPECT_EQ(stream_tokens(TokenStream(o.out_dir + "/val_*.bin")), want_val) << name;
      shards_by_threads.push_back(stream_tokens(train));
      const nlohmann::json meta = read_json(r.meta_path);
      EXPECT_EQ(meta["vocab_size"], tok.vocab_size());
      EXPECT_EQ(meta["token_bytes"], 2);
      EXPECT_EQ(meta["tokenizer"]["sha256"], sha256_file(o.tokenizer));
      EXPECT_EQ(meta["tokenizer"]["file"], std::filesystem::absolute(o.tokenizer).lexically_normal().string());
      EXPECT_EQ(meta["tokenizer"]["document_token"], *tok.id_to_token(doc));
    }
    EXPECT_EQ(shards_by_threads[0], shards_by_threads[1]) << name;
  }
}

// A vocabulary beyond 65,536 tokens (as Llama 3's 128,256) is written as uint32 tokens under llm.c's
// 32-bit header, and read back as such.
TEST(TextCorpus, LargeVocabularyShardsHoldUint32Tokens) {
  TempDir dir;
  nlohmann::json j = read_json(tokenizer_fixture("gpt2.json"));
  j["added_tokens"] = nlohmann::json::array({j["added_tokens"][0]});  // <|endoftext|>, id 0
  for (int id = 1200; id < 70000; ++id) j["model"]["vocab"]["<unused_" + std::to_string(id) + ">"] = id;
  {
    std::ofstream f(dir.file("big.json"));
    f << j.dump();
  }
  const Tokenizer tok = Tokenizer::from_file(dir.file("big.json"));
  ASSERT_EQ(tok.vocab_size(), 70000);
  write_text(dir.file("a.txt"), "a text <unused_69999> with a token beyond 65,535 in it");
  TextCorpusOptions o;
  o.files = {dir.file("a.txt")};
  o.out_dir = dir.file("out");
  o.val_fraction = 0;
  o.tokenizer = dir.file("big.json");
  o.document_token = "<unused_65536>";
  const TextCorpusReport r = write_text_corpus(o);
  EXPECT_EQ(r.token_bytes, 4);
  const TokenStream train(o.out_dir + "/train_*.bin", 70000);
  ASSERT_EQ(train.shards().size(), 1u);
  EXPECT_EQ(train.shards()[0]->format(), TokenFormat::llmc32);
  EXPECT_EQ(train.width(), 4);
  std::vector<uint32_t> want{65536};
  const auto ids = tok.encode("a text <unused_69999> with a token beyond 65,535 in it");
  want.insert(want.end(), ids.begin(), ids.end());
  EXPECT_EQ(stream_tokens(train), want);
  EXPECT_EQ(read_json(r.meta_path)["token_bytes"], 4);
}

TEST(TextCorpus, TokenizerErrorsNameWhatIsWrong) {
  TempDir dir;
  write_text(dir.file("a.txt"), "some text");
  nlohmann::json j = read_json(tokenizer_fixture("gpt2.json"));
  j["added_tokens"] = nlohmann::json::array();
  {
    std::ofstream f(dir.file("plain.json"));
    f << j.dump();
  }
  TextCorpusOptions o;
  o.files = {dir.file("a.txt")};
  o.out_dir = dir.file("out");
  o.val_fraction = 0;
  o.tokenizer = dir.file("plain.json");
  expect_input_error([&] { write_text_corpus(o); }, {dir.file("plain.json"), "<|endoftext|>", "--document-token"});
  o.tokenizer = tokenizer_fixture("gpt2.json");
  o.document_token = "<|no such token|>";
  expect_input_error([&] { write_text_corpus(o); }, {"--document-token", "<|no such token|>", "gpt2.json"});
  o.tokenizer = dir.file("a.txt");
  expect_input_error([&] { write_text_corpus(o); }, {dir.file("a.txt"), "not valid JSON"});
  EXPECT_FALSE(std::filesystem::exists(o.out_dir)) << "nothing is written when the tokenizer cannot be read";
}

TEST(TextCorpus, ErrorsNameWhatIsWrong) {
  TempDir dir;
  write_text(dir.file("a.txt"), "some text");
  write_text(dir.file("b.txt"), "more text");
  write_text(dir.file("empty1.txt"), "");
  write_text(dir.file("empty2.txt"), "");
  TextCorpusOptions o;
  o.out_dir = dir.file("out");
  o.files = {dir.file("a.txt"), dir.file("missing.txt")};
  expect_input_error([&] { write_text_corpus(o); }, {"text file", dir.file("missing.txt"), "does not exist"});
  EXPECT_FALSE(std::filesystem::exists(o.out_dir)) << "nothing is written before every input was read";
  o.files = {dir.file("empty1.txt"), dir.file("empty2.txt")};
  expect_input_error([&] { write_text_corpus(o); }, {"hold no text", "nothing to write"});
  o.files = {dir.file("a.txt"), dir.file("empty1.txt")};  // the validation file is empty
  expect_input_error([&] { write_text_corpus(o); }, {"validation files hold no text"});
  o.files = {dir.file("a.txt"), dir.file("a.txt")};
  expect_input_error([&] { write_text_corpus(o); }, {"given twice"});
  write_text(dir.file("program"), std::string("\x7f" "ELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0>\0", 20) + "text");
  o.files = {dir.file("a.txt"), dir.file("program")};
  expect_input_error([&] { write_text_corpus(o); }, {dir.file("program"), "is not text", "NUL byte at offset 7",
                                                     "--binary-ok"});
  o.files = {dir.file("a.txt"), dir.file("b.txt")};
  o.out_dir = dir.file("a.txt");
  expect_input_error([&] { write_text_corpus(o); }, {"exists and is not a directory"});
  o.out_dir = dir.file("a.txt") + "/sub";
  expect_input_error([&] { write_text_corpus(o); }, {"cannot create output directory"});
  o.out_dir = "/proc/self";  // a directory no one can create files in, root included
  expect_input_error([&] { write_text_corpus(o); }, {"/proc/self"});
  o.out_dir = dir.file("out");
  o.shard_tokens = 0;
  expect_input_error([&] { write_text_corpus(o); }, {"--shard-tokens"});
}

// One text's validation part starts at a blank line near the fraction, else a line end, else a space,
// else a character boundary; both parts keep text.
TEST(TextCorpus, OneTextIsCutAtADocumentOrLineBoundary) {
  // 100 lines of 10 bytes, a blank line after every 25th.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text += "line " + std::to_string(1000 + i).substr(1) + ".\n";
    if (i % 25 == 24) text += "\n";
  }
  // 10 % is 100 of 1004 bytes, from 904; the blank line before line 75 is at 753 (251 bytes back): too
  // far, so the nearest line end, 903, where line 90 starts.
  TextCut c = validation_cut(text, 0, text.size(), 0.1);
  EXPECT_EQ(c.boundary, "a line end");
  EXPECT_EQ(c.at, 903u);
  EXPECT_EQ(text.substr(c.at, 8), "line 090");
  // 25 %: 251 bytes back is the blank line itself.
  c = validation_cut(text, 0, text.size(), 0.25);
  EXPECT_EQ(c.boundary, "a blank line");
  EXPECT_EQ(text.substr(c.at - 2, 2), "\n\n");
  EXPECT_EQ(text.substr(c.at, 8), "line 075");
  // Windows line ends make blank lines too.
  std::string crlf = "one\r\n\r\ntwo\r\n";
  c = validation_cut(crlf, 0, crlf.size(), 0.4);
  EXPECT_EQ(c.boundary, "a blank line");
  EXPECT_EQ(crlf.substr(c.at), "two\r\n");
  // One line: a space; no space: a character boundary, never inside a UTF-8 sequence.
  std::string words = "aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii jjjj";
  c = validation_cut(words, 0, words.size(), 0.1);
  EXPECT_EQ(c.boundary, "a space");
  EXPECT_EQ(words.substr(c.at), "jjjj");
  std::string accents;
  for (int i = 0; i < 20; ++i) accents += "\xc3\xa9";  // é, two bytes each
  for (double f : {0.1, 0.25, 0.33, 0.5, 0.77}) {
    c = validation_cut(accents, 0, accents.size(), f);
    EXPECT_EQ(c.boundary, "a character");
    EXPECT_EQ(c.at % 2, 0u) << f;
    EXPECT_GT(c.at, 0u);
    EXPECT_LT(c.at, accents.size());
  }
  // Within [begin, end) only (a stripped header and footer stay out), and never empty either side.
  c = validation_cut("ab", 0, 2, 0.9);
  EXPECT_EQ(c.at, 1u);
  expect_input_error([] { validation_cut("a", 0, 1, 0.1); }, {"too short to split", "--val 0"});
}

// A single file makes both splits, its last part validating; a binary file needs --binary-ok.
TEST(TextCorpus, OneFileIsSplitWithinItself) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "Paragraph " + std::to_string(i) + " of the one file.\n\n";
  write_text(dir.file("input.txt"), text);
  TextCorpusOptions o;
  o.files = {dir.file("input.txt")};
  o.out_dir = dir.file("out");
  const TextCorpusReport r = write_text_corpus(o);
  ASSERT_EQ(r.files.size(), 1u);
  const TextFileReport& f = r.files[0];
  EXPECT_FALSE(f.val);
  EXPECT_EQ(f.cut_at, "a blank line");
  ASSERT_GT(f.val_from, 0);
  EXPECT_EQ(r.train_tokens, f.val_from);
  EXPECT_EQ(r.val_tokens, static_cast<int64_t>(text.size()) - f.val_from);
  EXPECT_NEAR(static_cast<double>(r.val_tokens) / static_cast<double>(text.size()), 0.1, 0.02);
  TokenStream train(o.out_dir + "/train_*.bin", 256), val(o.out_dir + "/val_*.bin", 256);
  std::string back;
  for (int64_t i = 0; i < train.size(); ++i) back.push_back(static_cast<char>(train.at(i)));
  for (int64_t i = 0; i < val.size(); ++i) back.push_back(static_cast<char>(val.at(i)));
  EXPECT_EQ(back, text) << "the two splits are the file, in order";
  EXPECT_EQ(static_cast<char>(val.at(0)), 'P');
  std::ifstream mf(r.meta_path);
  const auto meta = nlohmann::json::parse(mf);
  EXPECT_EQ(meta["files"][0]["split"], "train, then val");
  EXPECT_EQ(meta["files"][0]["val_from_byte"], f.val_from);
  EXPECT_EQ(meta["val"]["tokens"], r.val_tokens);
  // Random bytes are not text; with binary_ok they are tokens like any others.
  std::string noise;
  uint32_t x = 12345;
  for (int i = 0; i < 4096; ++i) {
    x = x * 1664525u + 1013904223u;
    noise.push_back(static_cast<char>(x >> 24));
  }
  write_text(dir.file("noise.dat"), noise);
  o.files = {dir.file("noise.dat")};
  expect_input_error([&] { write_text_corpus(o); }, {"noise.dat' is not text", "--binary-ok"});
  o.binary_ok = true;
  const TextCorpusReport rb = write_text_corpus(o);
  EXPECT_EQ(rb.train_tokens + rb.val_tokens, 4096);
  // A file of one token cannot be split.
  write_text(dir.file("one.txt"), "x");
  o.files = {dir.file("one.txt")};
  expect_input_error([&] { write_text_corpus(o); }, {"one.txt' holds 1 token", "--val 0"});
}

}  // namespace
}  // namespace tandem::data
