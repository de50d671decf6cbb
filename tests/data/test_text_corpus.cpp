// Byte-level text corpora: Project Gutenberg's header and footer in their modern and older styles,
// the choice of the validation files, and what write_text_corpus writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "tandem/data/text_corpus.h"
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
