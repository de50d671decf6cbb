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
  expect_input_error([] { choose_validation_files({100}, 0.1); }, {"only 1 file", "--val 0"});
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

}  // namespace
}  // namespace tandem::data
