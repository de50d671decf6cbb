// `tandem data text` and `tandem data info` as a user runs them: bytes in are tokens out, the
// validation split holds whole files, Project Gutenberg's licence text is left out on request, shards
// in llm.c's and nanoGPT's formats load, and mistakes end with a clear message and status 2.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e/cli_util.h"

namespace fs = std::filesystem;
using tandem::test::run_tandem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_data_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string contents(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The tokens of one shard in llm.c's format, read here from the bytes (not through tandem).
std::vector<uint16_t> read_llmc(const fs::path& p) {
  const std::string b = contents(p);
  EXPECT_GE(b.size(), 1024u) << p;
  if (b.size() < 1024) return {};
  int32_t header[256];
  std::memcpy(header, b.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520) << p;
  EXPECT_EQ(header[1], 1) << p;
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0) << p << " header int " << i;
  EXPECT_EQ(b.size(), 1024u + 2u * static_cast<size_t>(header[2])) << p;
  std::vector<uint16_t> t(static_cast<size_t>(header[2]));
  std::memcpy(t.data(), b.data() + 1024, std::min(b.size() - 1024, t.size() * 2));
  return t;
}

// Tokens of every shard of a split, in shard order.
std::string split_bytes(const fs::path& dir, const std::string& split) {
  std::string out;
  for (int i = 0;; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "%s_%06d.bin", split.c_str(), i);
    if (!fs::exists(dir / name)) break;
    for (uint16_t t : read_llmc(dir / name)) {
      EXPECT_LT(t, 256);
      out.push_back(static_cast<char>(t));
    }
  }
  return out;
}

std::string all_bytes_text(int rotate) {
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>((i + rotate) & 0xff));
  return s;
}

}  // namespace

TEST(DataCli, TextRoundTripKeepsEveryByteAndSplitsByWholeFiles) {
  const fs::path dir = temp_dir("roundtrip"), out = dir / "out";
  // Five works; every byte value occurs, and a work's length says which one it is.
  const std::vector<std::string> names = {"e_work.txt", "a_work.txt", "c_work.txt", "b_work.txt", "d_work.txt"};
  std::map<std::string, std::string> text;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string t = all_bytes_text(static_cast<int>(i)) + std::string(1000 * (i + 1), static_cast<char>('a' + i));
    text[names[i]] = t;
    write(dir / names[i], t);
  }
  std::string args = "data text";
  for (const auto& n : names) {
    args += ' ';
    args += (dir / n).string();
  }
  auto r = run_tandem(args + " -o " + out.string() + " --val 0.2 --shard-tokens 1500");
  // Every byte value, zero included: not text, unless told.
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("is not text: a NUL byte"), std::string::npos) << r.output;
  r = run_tandem(args + " -o " + out.string() + " --val 0.2 --shard-tokens 1500 --binary-ok");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("val: 1 file"), std::string::npos) << r.output;

  // Taken in order of their paths: a, b, c, d to training (a 256 + 1000*2 bytes, ...), e (the last,
  // 256 + 1000 bytes, 1256 of 16280 = 7.7 %; with d too 40 %) to validation.
  std::string train_expect = text["a_work.txt"] + text["b_work.txt"] + text["c_work.txt"] + text["d_work.txt"];
  EXPECT_EQ(split_bytes(out, "train"), train_expect);
  EXPECT_EQ(split_bytes(out, "val"), text["e_work.txt"]);
  EXPECT_TRUE(fs::exists(out / "train_000008.bin"));  // 15024 tokens in shards of 1500
  EXPECT_FALSE(fs::exists(out / "train_000011.bin"));

  const auto meta = nlohmann::json::parse(contents(out / "meta.json"));
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["train"]["tokens"], static_cast<int64_t>(train_expect.size()));
  EXPECT_EQ(meta["val"]["tokens"], static_cast<int64_t>(text["e_work.txt"].size()));
  EXPECT_EQ(meta["val"]["files"], nlohmann::json::array({(dir / "e_work.txt").string()}));
  EXPECT_EQ(meta["train"]["files"].size(), 4u);

  // The shards load through `data info` with a vocabulary check.
  r = run_tandem("data info " + (out / "train_*.bin").string() + " --vocab 256");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("total: 11 shards, " + std::to_string(train_expect.size()) + " tokens"), std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

// With --tokenizer: the shards hold the tokenizer's ids, each file's after one document token (read here
// from the bytes: uint16 under llm.c's header), meta.json names the tokenizer, its hash and vocabulary,
// `data info` reads them, and a tokenizer it cannot read is a clear error.
TEST(DataCli, TextWithATokenizerWritesItsIds) {
  const fs::path dir = temp_dir("tokenizer"), out = dir / "out";
  const std::string fixtures = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/";
  write(dir / "a.txt", "Hello world, it's tandem.\n");
  write(dir / "b.txt", "Second <|endoftext|> file");
  auto r = run_tandem("data text " + (dir / "a.txt").string() + " " + (dir / "b.txt").string() + " -o " + out.string() +
                      " --val 0 --threads 2 --tokenizer " + fixtures + "gpt2.json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("<|endoftext|> (id 0) before each file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MB/s"), std::string::npos) << r.output;
  const std::vector<uint16_t> tokens = read_llmc(out / "train_000000.bin");
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens[0], 0);  // <|endoftext|> before the first file
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), 0), 3);  // and the second, and the one inside it
  const auto meta = nlohmann::json::parse(contents(out / "meta.json"));
  EXPECT_EQ(meta["vocab_size"], 1202);
  EXPECT_EQ(meta["token_bytes"], 2);
  EXPECT_EQ(meta["tokenizer"]["sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(meta["tokenizer"]["document_token"], "<|endoftext|>");
  r = run_tandem("data info " + (out / "train_*.bin").string() + " --vocab 1202");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("llm.c, " + std::to_string(tokens.size()) + " tokens"), std::string::npos) << r.output;
  // A tokenizer.json it cannot read; --document-token without --tokenizer.
  write(dir / "bad.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
  r = run_tandem("data text " + (dir / "a.txt").string() + " -o " + out.string() + " --val 0 --tokenizer " +
                 (dir / "bad.json").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("'Unigram' is not supported"), std::string::npos) << r.output;
  r = run_tandem("data text " + (dir / "a.txt").string() + " -o " + out.string() + " --document-token x");
  EXPECT_EQ(r.status, 2) << r.output;
  fs::remove_all(dir);
}

TEST(DataCli, StripGutenbergLeavesOutTheLicence) {
  const fs::path dir = temp_dir("gutenberg"), out = dir / "out";
  const std::string body = "THE TEMPEST\n\nACT I. SCENE 1.\nOn a ship at sea.\n";
  const std::string body2 = "SONNETS\n\nFrom fairest creatures we desire increase,\n";
  write(dir / "a.txt",
        "The Project Gutenberg eBook of The Tempest\n\nThis eBook is for the use of anyone anywhere...\n\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK THE TEMPEST ***\n" +
            body + "*** END OF THE PROJECT GUTENBERG EBOOK THE TEMPEST ***\n\nSection 1. General Terms of Use...\n");
  write(dir / "b.txt", "*The Project Gutenberg Etext of Shakespeare's Sonnets*\r\n"
                       "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\r\n" +
                           body2 + "End of The Project Gutenberg Etext of Shakespeare's Sonnets\r\n");
  auto r = run_tandem("data text " + (dir / "a.txt").string() + " " + (dir / "b.txt").string() + " -o " +
                      out.string() + " --strip-gutenberg --val 0.5");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(split_bytes(out, "train"), body);
  EXPECT_EQ(split_bytes(out, "val"), body2);
  EXPECT_NE(r.output.find("Gutenberg header and footer left out"), std::string::npos) << r.output;
  // Without the flag, every byte stays.
  r = run_tandem("data text " + (dir / "a.txt").string() + " " + (dir / "b.txt").string() + " -o " + out.string() +
                 " --val 0.5");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(split_bytes(out, "train"), contents(dir / "a.txt"));
  fs::remove_all(dir);
}

TEST(DataCli, TextErrorsAreClear) {
  const fs::path dir = temp_dir("errors");
  write(dir / "a.txt", "to be");
  write(dir / "b.txt", "or not");
  write(dir / "empty.txt", "");
  write(dir / "empty2.txt", "");
  const std::string a = (dir / "a.txt").string(), b = (dir / "b.txt").string();
  struct Case {
    std::string args, fragment;
  };
  const std::vector<Case> cases = {
      {a + " " + (dir / "nope.txt").string() + " -o " + (dir / "o").string(), "nope.txt' does not exist"},
      {(dir / "empty.txt").string() + " " + (dir / "empty2.txt").string() + " -o " + (dir / "o").string(),
       "hold no text"},
      {a + " " + b + " -o /proc/self", "/proc/self"},
      {a + " " + b + " -o " + a, "exists and is not a directory"},
      {a + " " + b + " -o " + (dir / "o").string() + " --val 1.5", "--val"},
      {a + " " + b, "--output is required"},
      {"-o " + (dir / "o").string(), "files is required"},
  };
  for (const Case& c : cases) {
    auto r = run_tandem("data text " + c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.fragment), std::string::npos) << c.args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "o" / "meta.json"));
  // One file and --val 0: a training split alone.
  auto r = run_tandem("data text " + a + " -o " + (dir / "o").string() + " --val 0");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(split_bytes(dir / "o", "train"), "to be");
  EXPECT_FALSE(fs::exists(dir / "o" / "val_000000.bin"));
  r = run_tandem("data text --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--strip-gutenberg"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("llm.c"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// The commonest input, one text file, gets a validation split: its last tenth, cut at a blank line; two
// files of unequal sizes are told what fraction validation got; a binary file is refused unless
// --binary-ok; --strip-gutenberg on texts without the licence says so once; a text file given to
// `data info` is refused, saying how to make shards of it.
TEST(DataCli, OneFileIsSplitAndTheSplitIsSaid) {
  const fs::path dir = temp_dir("onefile"), out = dir / "out";
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Paragraph " + std::to_string(i) + ": some words of the one text.\n\n";
  write(dir / "input.txt", text);
  auto r = run_tandem("data text " + (dir / "input.txt").string() + " -o " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("val: the last 10."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cut at a blank line"), std::string::npos) << r.output;
  const std::string train = split_bytes(out, "train"), val = split_bytes(out, "val");
  EXPECT_EQ(train + val, text);
  EXPECT_EQ(val.rfind("Paragraph ", 0), 0u) << val.substr(0, 40);
  EXPECT_NEAR(static_cast<double>(val.size()) / static_cast<double>(text.size()), 0.1, 0.01);

  // Two files, the last far smaller: whole files give validation 2 %, and the output says so.
  write(dir / "a.txt", std::string(4900, 'a'));
  write(dir / "b.txt", std::string(100, 'b'));
  r = run_tandem("data text " + (dir / "a.txt").string() + " " + (dir / "b.txt").string() + " -o " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("val: 1 file, 100 tokens in 1 shard (2.0% of the tokens; --val asked 10%)"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("holds whole files"), std::string::npos) << r.output;

  // Random bytes are refused, and taken with --binary-ok.
  std::string noise;
  uint32_t x = 7;
  for (int i = 0; i < 8192; ++i) {
    x = x * 1664525u + 1013904223u;
    noise.push_back(static_cast<char>(x >> 24));
  }
  write(dir / "noise.bin", noise);
  r = run_tandem("data text " + (dir / "noise.bin").string() + " -o " + out.string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("tandem: error: '" + (dir / "noise.bin").string() + "' is not text"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--binary-ok"), std::string::npos) << r.output;
  r = run_tandem("data text " + (dir / "noise.bin").string() + " -o " + out.string() + " --binary-ok");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(split_bytes(out, "train") + split_bytes(out, "val"), noise);

  // --strip-gutenberg on three texts without Project Gutenberg's licence: one line says so.
  std::string args = "data text";
  for (const char* n : {"x.txt", "y.txt", "z.txt"}) {
    write(dir / n, std::string("Some text of ") + n + "\n");
    args += " " + (dir / n).string();
  }
  r = run_tandem(args + " -o " + out.string() + " --strip-gutenberg");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(tandem::test::count_lines_with(r.output, "Gutenberg"), 1) << r.output;
  EXPECT_NE(r.output.find("no Gutenberg header or footer found in any of the 3 files"), std::string::npos) << r.output;

  // A text file is no token shard.
  r = run_tandem("data info " + (dir / "input.txt").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("input.txt' holds text, not tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tandem data text " + (dir / "input.txt").string() + " -o DIR"), std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

// Shards as llm.c's GPT-2 scripts (fineweb.py, tinyshakespeare.py: np.zeros(256, int32) header, then
// np.uint16 tokens) and nanoGPT's prepare.py (np.uint16 tokens, tofile) write them.
TEST(DataCli, InfoLoadsLlmcAndNanoGptShards) {
  const fs::path dir = temp_dir("info");
  std::vector<uint16_t> tokens = {50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 50256};
  std::string llmc(1024, '\0'), bare;
  const int32_t head[3] = {20240520, 1, static_cast<int32_t>(tokens.size())};
  std::memcpy(llmc.data(), head, sizeof head);
  for (uint16_t t : tokens) {
    const char two[2] = {static_cast<char>(t & 0xff), static_cast<char>(t >> 8)};
    llmc.append(two, 2);
    bare.append(two, 2);
  }
  write(dir / "tinyshakespeare_val.bin", llmc);
  write(dir / "val.bin", bare);
  auto r = run_tandem("data info " + (dir / "tinyshakespeare_val.bin").string() + " " + (dir / "val.bin").string() +
                      " --vocab 50257");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tinyshakespeare_val.bin: llm.c, 12 tokens, largest token 50256"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("val.bin: nanoGPT (bare uint16), 12 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("total: 2 shards, 24 tokens"), std::string::npos) << r.output;
  // A vocabulary too small, and a truncated shard.
  r = run_tandem("data info " + (dir / "val.bin").string() + " --vocab 50000");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("token 50256 at position 0 is outside the vocabulary of 50000"), std::string::npos)
      << r.output;
  write(dir / "cut.bin", llmc.substr(0, llmc.size() - 4));
  r = run_tandem("data info " + (dir / "cut.bin").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cut.bin' is truncated"), std::string::npos) << r.output;
  fs::remove_all(dir);
}
