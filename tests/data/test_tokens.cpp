// Token shards (llm.c's and nanoGPT's formats), streams of several shards, the damage each format
// check catches, rank parts, and the batches of token windows the CPU kernel draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "backend/backend.h"
#include "core/counter_rng.h"
#include "data/data_test_util.h"
#include "tandem/data/tokens.h"

namespace tandem::data {
namespace {

using testutil::Bytes;
using testutil::expect_input_error;
using testutil::TempDir;
using testutil::write_file;

// A shard as llm.c's data scripts write it: np.zeros(256, int32) with magic, version and count, then
// the tokens as uint16. count < 0: the true count.
Bytes llmc_shard(const std::vector<uint16_t>& tokens, int32_t version = 1, int64_t count = -1,
                 int32_t magic = kLlmcMagic) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count < 0 ? static_cast<int64_t>(tokens.size()) : count);
  Bytes b(header.size() * 4 + tokens.size() * 2);
  std::memcpy(b.data(), header.data(), header.size() * 4);
  std::memcpy(b.data() + header.size() * 4, tokens.data(), tokens.size() * 2);
  return b;
}

// A shard as llm.c's LLaMA-3 data scripts write it: the header with magic 20240801 and version 7, then
// the tokens as uint32.
Bytes llmc32_shard(const std::vector<uint32_t>& tokens, int32_t version = kLlmc32Version) {
  std::vector<int32_t> header(256, 0);
  header[0] = kLlmc32Magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  Bytes b(header.size() * 4 + tokens.size() * 4);
  std::memcpy(b.data(), header.data(), header.size() * 4);
  std::memcpy(b.data() + header.size() * 4, tokens.data(), tokens.size() * 4);
  return b;
}

// A shard as nanoGPT's prepare.py writes it: np.array(ids, dtype=np.uint16).tofile(path).
Bytes bare_shard(const std::vector<uint16_t>& tokens) {
  Bytes b(tokens.size() * 2);
  std::memcpy(b.data(), tokens.data(), b.size());
  return b;
}

std::vector<uint16_t> iota_tokens(size_t n, uint16_t first, uint16_t modulo = 50257) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((first + i * 7919) % modulo);
  return t;
}

std::vector<uint32_t> shard_tokens(const TokenShard& s) {
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < s.size(); ++i) out.push_back(s.at(i));
  return out;
}

std::vector<uint32_t> widened(const std::vector<uint16_t>& t) { return {t.begin(), t.end()}; }

TEST(TokenShards, LlmcFormatLoads) {
  TempDir dir;
  const auto tokens = iota_tokens(1000, 3);
  write_file(dir.file("fineweb_train_000001.bin"), llmc_shard(tokens));
  TokenShard s(dir.file("fineweb_train_000001.bin"), 50257);
  EXPECT_EQ(s.format(), TokenFormat::llmc);
  EXPECT_EQ(s.size(), 1000);
  EXPECT_EQ(s.width(), 2);
  EXPECT_EQ(shard_tokens(s), widened(tokens));
  EXPECT_EQ(s.max_token(), *std::max_element(tokens.begin(), tokens.end()));
}

// llm.c's 32-bit shards (what tandem data text writes for Llama 3's 128,256 tokens) load, and a stream
// that mixes them with 16-bit shards is read 4 bytes a token, the 16-bit tokens widened.
TEST(TokenShards, Llmc32FormatLoadsAndWidensAStream) {
  TempDir dir;
  std::vector<uint32_t> big(700);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint32_t>(128255 - i * 97);
  write_file(dir.file("train_000000.bin"), llmc32_shard(big));
  const auto small = iota_tokens(40, 9);
  write_file(dir.file("train_000001.bin"), llmc_shard(small));
  const TokenShard s(dir.file("train_000000.bin"), 128256);
  EXPECT_EQ(s.format(), TokenFormat::llmc32);
  EXPECT_STREQ(token_format_name(s.format()), "llm.c 32-bit");
  EXPECT_EQ(s.width(), 4);
  EXPECT_EQ(shard_tokens(s), big);
  EXPECT_EQ(s.max_token(), 128255u);
  expect_input_error([&] { TokenShard t(dir.file("train_000000.bin"), 128255); },
                     {"token 128255 at position 0", "vocabulary of 128255"});

  const TokenStream stream(dir.path());
  EXPECT_EQ(stream.width(), 4);
  std::vector<uint32_t> all = big;
  for (uint16_t t : small) all.push_back(t);
  std::vector<uint32_t> got(all.size());
  stream.copy(0, stream.size(), got.data());
  EXPECT_EQ(got, all);
  const Tensor t = stream.upload(690, 710, Device::cpu());
  ASSERT_EQ(t.shape(), (Shape{20, 4}));
  std::vector<uint32_t> up(20);
  std::memcpy(up.data(), t.data_ptr(), 80);
  EXPECT_EQ(up, std::vector<uint32_t>(all.begin() + 690, all.begin() + 710));
}

TEST(TokenShards, NanoGptBareFormatLoads) {
  TempDir dir;
  const auto tokens = iota_tokens(777, 11);
  write_file(dir.file("train.bin"), bare_shard(tokens));
  TokenShard s(dir.file("train.bin"), 50304);
  EXPECT_EQ(s.format(), TokenFormat::bare);
  EXPECT_EQ(s.size(), 777);
  EXPECT_EQ(shard_tokens(s), widened(tokens));
  // One token is a file too.
  write_file(dir.file("one.bin"), bare_shard({42}));
  EXPECT_EQ(shard_tokens(TokenShard(dir.file("one.bin"))), std::vector<uint32_t>{42});
}

TEST(TokenShards, SeveralShardsFormOneStream) {
  TempDir dir;
  const auto a = iota_tokens(300, 1), b = iota_tokens(5, 2), c = iota_tokens(1234, 3);
  write_file(dir.file("train_000000.bin"), llmc_shard(a));
  write_file(dir.file("train_000001.bin"), bare_shard(b));  // formats may mix
  write_file(dir.file("train_000002.bin"), llmc_shard(c));
  write_file(dir.file("notes.txt"), Bytes{'x'});
  std::vector<uint16_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());

  for (const std::string& spec : {dir.path(), dir.file("train_*.bin")}) {
    TokenStream stream(spec);
    ASSERT_EQ(stream.shards().size(), 3u) << spec;
    ASSERT_EQ(stream.size(), static_cast<int64_t>(all.size())) << spec;
    std::vector<uint32_t> got(all.size());
    stream.copy(0, stream.size(), got.data());
    EXPECT_EQ(got, widened(all)) << spec;
    EXPECT_EQ(stream.width(), 2);
    for (int64_t i : {int64_t{0}, int64_t{299}, int64_t{300}, int64_t{304}, int64_t{305}, stream.size() - 1})
      EXPECT_EQ(stream.at(i), all[static_cast<size_t>(i)]) << "position " << i;
    // A range across all three shards, uploaded as u8 [n, 2].
    Tensor t = stream.upload(290, 320, Device::cpu());
    ASSERT_EQ(t.shape(), (Shape{30, 2}));
    std::vector<uint16_t> up(30);
    std::memcpy(up.data(), t.data_ptr(), 60);
    EXPECT_EQ(up, std::vector<uint16_t>(all.begin() + 290, all.begin() + 320));
  }
  // Files named one by one, in the order given.
  TokenStream listed({dir.file("train_000002.bin"), dir.file("train_000000.bin")});
  EXPECT_EQ(listed.size(), static_cast<int64_t>(c.size() + a.size()));
  EXPECT_EQ(listed.at(0), c[0]);
  EXPECT_EQ(listed.at(static_cast<int64_t>(c.size())), a[0]);
  expect_input_error([&] { listed.at(listed.size()); }, {"position", "outside"});
}

TEST(TokenShards, DirectoryWithBothSplitsMustNameOne) {
  TempDir dir;
  write_file(dir.file("train_000000.bin"), llmc_shard({1, 2, 3}));
  write_file(dir.file("val_000000.bin"), llmc_shard({4, 5}));
  expect_input_error([&] { TokenStream s(dir.path()); },
                     {dir.path(), "both training shards (train_000000.bin)", "*train*.bin", "--data"});
  EXPECT_EQ(TokenStream(dir.file("val_*.bin")).size(), 2);
  EXPECT_TRUE(holds_both_splits(dir.path()));
  // nanoGPT's names and llm.c's are splits too: neither directory is read as one stream.
  TempDir nano, llmc, one;
  write_file(nano.file("train.bin"), bare_shard({1, 2, 3}));
  write_file(nano.file("val.bin"), bare_shard({4, 5}));
  write_file(llmc.file("tinyshakespeare_train.bin"), llmc_shard({1, 2, 3}));
  write_file(llmc.file("tinyshakespeare_val.bin"), llmc_shard({4, 5}));
  write_file(one.file("train.bin"), bare_shard({1, 2, 3}));
  for (const TempDir* d : {&nano, &llmc}) {
    EXPECT_TRUE(holds_both_splits(d->path())) << d->path();
    expect_input_error([&] { TokenStream s(d->path()); }, {d->path(), "both training shards", "validation shards"});
  }
  EXPECT_FALSE(holds_both_splits(one.path()));
  EXPECT_FALSE(holds_both_splits(one.file("train.bin")));
  EXPECT_EQ(TokenStream(one.path()).size(), 3);
}

// A text file given as a shard would be read as bare uint16 tokens, two bytes a token: it is refused,
// saying how to make shards of it, whatever its size; shards whose bytes include text are not.
TEST(TokenShards, ATextFileIsNotTakenForBareTokens) {
  TempDir dir;
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak!\n\n";
  ASSERT_EQ(text.size() % 2, 0u);
  write_file(dir.file("input.txt"), Bytes(text.begin(), text.end()));
  write_file(dir.file("odd.txt"), Bytes(text.begin(), text.end() - 1));
  std::string accented = "Fran\xc3\xa7" "ais, d\xc3\xa9j\xc3\xa0 vu \xe2\x80\x94 na\xc3\xafve.\n";
  std::string big;
  while (big.size() < (1 << 17)) big += accented;  // more than the part looked at, cut inside a character
  big.resize((1 << 17) + 2);
  write_file(dir.file("big.txt"), Bytes(big.begin(), big.end()));
  for (const char* name : {"input.txt", "odd.txt", "big.txt"})
    expect_input_error([&] { TokenShard s(dir.file(name)); },
                       {dir.file(name), "text", "tandem data text " + dir.file(name) + " -o DIR"});
  // Bare tokens: GPT-2's ids of the same words, and byte-level ids (each with a zero high byte).
  write_file(dir.file("gpt2.bin"), bare_shard({5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502}));
  std::vector<uint16_t> bytes(text.begin(), text.end());
  write_file(dir.file("bytes.bin"), bare_shard(bytes));
  EXPECT_EQ(TokenShard(dir.file("gpt2.bin")).size(), 12);
  EXPECT_EQ(TokenShard(dir.file("bytes.bin")).size(), static_cast<int64_t>(text.size()));
  // The header's mistakes say so too.
  write_file(dir.file("version.bin"), llmc_shard({1, 2}, 3));
  expect_input_error([&] { TokenShard s(dir.file("version.bin")); }, {"header version 3", "tandem data text"});
}

TEST(TokenShards, CorruptFilesSayWhatIsWrong) {
  TempDir dir;
  const auto tokens = iota_tokens(64, 5);
  struct Case {
    std::string name;
    Bytes bytes;
    std::vector<std::string> fragments;
  };
  Bytes short_header = llmc_shard(tokens);
  short_header.resize(500);
  Bytes truncated = llmc_shard(tokens);
  truncated.resize(truncated.size() - 10);
  Bytes longer = llmc_shard(tokens);
  longer.insert(longer.end(), {1, 0, 2, 0});
  Bytes odd_tail = llmc_shard(tokens);
  odd_tail.push_back(9);
  Bytes odd_bare = bare_shard(tokens);
  odd_bare.push_back(0);
  const std::vector<Case> cases = {
      {"version.bin", llmc_shard(tokens, 2), {"header version 2", "expected 1"}},
      {"header.bin", short_header, {"truncated", "500 bytes", "1024-byte header"}},
      {"truncated.bin", truncated, {"truncated", "announces 64 tokens", "118 bytes follow"}},
      {"longer.bin", longer, {"count mismatch", "announces 64 tokens", "132 bytes", "66 tokens"}},
      {"oddtail.bin", odd_tail, {"count mismatch", "129 bytes"}},
      {"count.bin", llmc_shard(tokens, 1, 0), {"announces 0 tokens"}},
      {"negative.bin", llmc_shard(tokens, 1, -5 + (int64_t{1} << 32)), {"announces -5 tokens"}},
      {"odd.bin", odd_bare, {"odd number of bytes (129)", "tandem data text"}},
      {"empty.bin", Bytes{}, {"is empty"}},
      {"llama3.bin", llmc32_shard(widened(tokens), 1), {"header version 1", "expected 7", "uint32"}},
      {"llama3_short.bin", llmc_shard(tokens, 7, -1, kLlmc32Magic), {"truncated", "announces 64 tokens (256 bytes"}},
  };
  for (const Case& c : cases) {
    write_file(dir.file(c.name), c.bytes);
    std::vector<std::string> frags = c.fragments;
    frags.push_back(dir.file(c.name));
    expect_input_error([&] { TokenShard s(dir.file(c.name)); }, frags);
  }
  // A token outside the vocabulary, in either format.
  auto bad = tokens;
  bad[17] = 50257;
  write_file(dir.file("vocab_llmc.bin"), llmc_shard(bad));
  write_file(dir.file("vocab_bare.bin"), bare_shard(bad));
  for (const char* name : {"vocab_llmc.bin", "vocab_bare.bin"}) {
    expect_input_error([&] { TokenShard s(dir.file(name), 50257); },
                       {dir.file(name), "token 50257 at position 17", "vocabulary of 50257"});
    EXPECT_EQ(TokenShard(dir.file(name), 50258).size(), 64);  // fits a larger one
    EXPECT_EQ(TokenShard(dir.file(name)).size(), 64);         // and is not checked without one
  }
  // Missing files, patterns matching nothing, a directory without shards, a directory as a shard.
  expect_input_error([&] { TokenStream s(dir.file("absent.bin")); }, {dir.file("absent.bin"), "does not exist"});
  expect_input_error([&] { TokenStream s(dir.file("nothing_*.bin")); }, {"no token shards match", "nothing_*.bin"});
  TempDir empty;
  expect_input_error([&] { TokenStream s(empty.path()); }, {empty.path(), "holds no token shards"});
  expect_input_error([&] { TokenShard s(empty.path()); }, {empty.path(), "is a directory"});
}

TEST(TokenShards, RankPartsAreDisjointAndCoverTheStream) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1001}, int64_t{9'000'000'000'000'000'000}}) {
    for (int w : {1, 2, 3, 7, 8}) {
      int64_t expect_begin = 0;
      for (int r = 0; r < w; ++r) {
        const TokenRange p = rank_part(n, r, w);
        EXPECT_EQ(p.begin, expect_begin) << "n " << n << " w " << w << " r " << r;
        EXPECT_LE(p.begin, p.end);
        // Sizes differ by at most one token between ranks: floor(n / w) or that plus one.
        EXPECT_GE(p.size(), n / w);
        EXPECT_LE(p.size(), n / w + 1);
        if (n < (int64_t{1} << 40)) {
          EXPECT_EQ(p.begin, r * n / w);
        }
        expect_begin = p.end;
      }
      EXPECT_EQ(expect_begin, n) << "n " << n << " w " << w;
    }
  }
  expect_input_error([] { rank_part(10, 2, 2); }, {"rank 2", "[0, 2)"});
}

// A stream of n tokens 0, 1, 2, ... (mod 65536) in two shards, so each token's value says where it is.
TokenStream counting_stream(const TempDir& dir, int64_t n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  const auto half = t.begin() + n / 3;
  write_file(dir.file("s_0.bin"), llmc_shard(std::vector<uint16_t>(t.begin(), half)));
  write_file(dir.file("s_1.bin"), bare_shard(std::vector<uint16_t>(half, t.end())));
  return TokenStream(dir.file("s_*.bin"));
}

TEST(TokenBatches, RandomWindowsAreDeterministicAcrossRuns) {
  TempDir dir;
  const TokenStream stream = counting_stream(dir, 5000);
  TokenBatchOptions o;
  o.batch = 6;
  o.context = 17;
  o.seed = 1234;
  auto draw = [&](TokenBatchOptions opt, int steps) {
    TokenBatches b(stream, opt);
    std::vector<std::vector<int32_t>> xs;
    Tensor x, y;
    for (int i = 0; i < steps; ++i) {
      b.next(x, y);
      xs.push_back(x.to_vector<int32_t>());
    }
    return xs;
  };
  const auto first = draw(o, 4), again = draw(o, 4);
  EXPECT_EQ(first, again);
  EXPECT_NE(first[0], first[1]) << "two steps drew the same windows";
  TokenBatchOptions other = o;
  other.seed = 1235;
  EXPECT_NE(draw(other, 1)[0], first[0]) << "another seed drew the same windows";
  // Resuming at step 3 draws step 3's windows.
  TokenBatches resumed(stream, o);
  resumed.seek(3);
  Tensor x, y;
  resumed.next(x, y);
  EXPECT_EQ(x.to_vector<int32_t>(), first[3]);
  EXPECT_EQ(resumed.cursor().to_vector<int64_t>(), (std::vector<int64_t>{4 * o.batch, 0}));
}

// The CPU kernel against a reference computed here from the counter RNG, per rank of three: every
// window lies in its rank's part, and y is x shifted by one token.
TEST(TokenBatches, CpuKernelMatchesTheReference) {
  TempDir dir;
  const int64_t n = 40'000;
  const TokenStream stream = counting_stream(dir, n);  // token i is i mod 65536; n < 65536
  const int world = 3;
  std::set<int32_t> firsts[world];
  for (int rank = 0; rank < world; ++rank) {
    TokenBatchOptions o;
    o.batch = 9;
    o.context = 64;
    o.seed = 77;
    o.rank = rank;
    o.world_size = world;
    TokenBatches b(stream, o);
    const TokenRange part = b.part();
    EXPECT_EQ(part.begin, rank * n / world);
    EXPECT_EQ(part.end, (rank + 1) * n / world);
    const uint64_t seed = window_seed(o.seed, rank);
    Tensor x, y;
    for (int step = 0; step < 5; ++step) {
      b.next(x, y);
      ASSERT_EQ(x.shape(), (Shape{9, 64}));
      ASSERT_EQ(y.dtype(), DType::i32);
      const auto xs = x.to_vector<int32_t>(), ys = y.to_vector<int32_t>();
      for (int64_t r = 0; r < o.batch; ++r) {
        const uint64_t j = static_cast<uint64_t>(step * o.batch + r);
        const auto start = static_cast<int64_t>(rng::mix(seed, j) % static_cast<uint64_t>(part.size() - o.context));
        EXPECT_EQ(b.window_start(static_cast<int64_t>(j)), start);
        for (int64_t t = 0; t < o.context; ++t) {
          ASSERT_EQ(xs[static_cast<size_t>(r * 64 + t)], part.begin + start + t) << "rank " << rank << " row " << r;
          ASSERT_EQ(ys[static_cast<size_t>(r * 64 + t)], part.begin + start + t + 1) << "rank " << rank << " row " << r;
        }
        ASSERT_GE(xs[static_cast<size_t>(r * 64)], part.begin);
        ASSERT_LT(ys[static_cast<size_t>(r * 64 + 63)], part.end);
        firsts[rank].insert(xs[static_cast<size_t>(r * 64)]);
      }
    }
    EXPECT_EQ(b.cursor().to_vector<int64_t>(), (std::vector<int64_t>{5 * o.batch, 0}));
  }
  // Ranks draw different windows (their parts are disjoint).
  for (int r = 1; r < world; ++r) EXPECT_GT(*firsts[r].begin(), *firsts[r - 1].rbegin());
}

// The backend kernel itself: one window that fills the part exactly, and the largest starts.
TEST(TokenBatches, WindowsStayInsideThePart) {
  const int64_t T = 5, n = T + 1;
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < n; ++i) {
    bytes.push_back(static_cast<uint8_t>(i + 300));  // low byte
    bytes.push_back(static_cast<uint8_t>((i + 300) >> 8));
  }
  Tensor tokens = Tensor::from_vector(bytes, {n, 2});
  Tensor cursor = Tensor::zeros({2}, DType::i64);
  Tensor x = Tensor::empty({4, T}, DType::i32), y = Tensor::empty({4, T}, DType::i32);
  for (bool random : {true, false}) {
    backend::cpu_backend().token_windows(tokens, Tensor(), cursor, 99, random, 0, x, y);
    const auto xs = x.to_vector<int32_t>(), ys = y.to_vector<int32_t>();
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(xs[static_cast<size_t>(r * T + t)], 300 + t);  // the only window there is
        EXPECT_EQ(ys[static_cast<size_t>(r * T + t)], 301 + t);
      }
  }
  EXPECT_EQ(cursor.to_vector<int64_t>(), (std::vector<int64_t>{8, 0}));
  // Tokens above 255 keep both bytes; the largest uint16 survives.
  std::vector<uint8_t> high = {0xff, 0xff, 0x01, 0x80, 0x00, 0x00};
  Tensor h = Tensor::from_vector(high, {3, 2});
  Tensor hx = Tensor::empty({1, 2}, DType::i32), hy = Tensor::empty({1, 2}, DType::i32);
  Tensor c2 = Tensor::zeros({2}, DType::i64);
  backend::cpu_backend().token_windows(h, Tensor(), c2, 0, false, 0, hx, hy);
  EXPECT_EQ(hx.to_vector<int32_t>(), (std::vector<int32_t>{65535, 0x8001}));
  EXPECT_EQ(hy.to_vector<int32_t>(), (std::vector<int32_t>{0x8001, 0}));
  // Every start of many random windows is a valid one.
  const int64_t big = 1000, ctx = 10;
  for (int64_t j = 0; j < 5000; ++j) {
    const int64_t s = window_start(5, j, big, ctx, true);
    ASSERT_GE(s, 0);
    ASSERT_LE(s + ctx + 1, big);
  }
}

TEST(TokenBatches, ValidationWindowsAreSequential) {
  TempDir dir;
  const int64_t n = 1000, T = 32;
  const TokenStream stream = counting_stream(dir, n);
  TokenBatchOptions o;
  o.batch = 4;
  o.context = T;
  o.sequential = true;
  o.seed = 5;  // no effect on sequential windows
  TokenBatches b(stream, o);
  const int64_t W = (n - 1) / T;  // 31 windows: starts 0, 32, ..., 960; the last target is token 992
  ASSERT_EQ(b.windows(), W);
  Tensor x, y;
  int64_t j = 0;
  for (int batch = 0; batch < 10; ++batch) {  // past the end: starts over at window 0
    b.next(x, y);
    const auto xs = x.to_vector<int32_t>(), ys = y.to_vector<int32_t>();
    for (int64_t r = 0; r < o.batch; ++r, ++j) {
      const int64_t start = (j % W) * T;
      EXPECT_EQ(b.window_start(j), start);
      EXPECT_EQ(xs[static_cast<size_t>(r * T)], start) << "window " << j;
      EXPECT_EQ(xs[static_cast<size_t>(r * T + T - 1)], start + T - 1);
      EXPECT_EQ(ys[static_cast<size_t>(r * T + T - 1)], start + T) << "window " << j;
    }
  }
  // One pass over the validation windows: 7 full batches and a last one of 3 rows.
  TokenBatches pass(stream, o);
  std::vector<int32_t> starts;
  for (int64_t k = 0; k < W / o.batch; ++k) {
    pass.next(x, y);
    const auto xs = x.to_vector<int32_t>();
    for (int64_t r = 0; r < o.batch; ++r) starts.push_back(xs[static_cast<size_t>(r * T)]);
  }
  Tensor xl = Tensor::empty({W % o.batch, T}, DType::i32), yl = Tensor::empty({W % o.batch, T}, DType::i32);
  pass.fill(xl, yl);
  const auto last = xl.to_vector<int32_t>();
  for (int64_t r = 0; r < W % o.batch; ++r) starts.push_back(last[static_cast<size_t>(r * T)]);
  ASSERT_EQ(static_cast<int64_t>(starts.size()), W);
  for (int64_t i = 0; i < W; ++i) EXPECT_EQ(starts[static_cast<size_t>(i)], i * T);
}

TEST(TokenBatches, BadOptionsAreClearErrors) {
  TempDir dir;
  const TokenStream stream = counting_stream(dir, 100);
  TokenBatchOptions o;
  o.context = 100;  // 100 tokens hold no window of 101
  expect_input_error([&] { TokenBatches b(stream, o); }, {"100 tokens", "context + 1 = 101"});
  o.context = 40;
  o.world_size = 3;  // 33 tokens a rank
  expect_input_error([&] { TokenBatches b(stream, o); }, {"rank 0 of 3", "33", "fewer ranks"});
  o.world_size = 1;
  o.batch = 0;
  expect_input_error([&] { TokenBatches b(stream, o); }, {"batch must be"});
  o.batch = 2;
  o.rank = 1;
  expect_input_error([&] { TokenBatches b(stream, o); }, {"rank 1", "[0, 1)"});
  o.rank = 0;
  TokenBatches b(stream, o);
  Tensor wrong = Tensor::empty({3, 40}, DType::i32), y = Tensor::empty({3, 40}, DType::i32);
  expect_input_error([&] { b.fill(wrong, y); }, {"B <= 2"});
  Tensor f32 = Tensor::empty({2, 40}), y2 = Tensor::empty({2, 40}, DType::i32);
  expect_input_error([&] { b.fill(f32, y2); }, {"token_windows", "i32 [B, T]"});
}

// Windows of uint32 tokens: the CPU kernel reads 4 bytes a token, tokens above 65,535 included; each
// window's x is the tokens from its start and y the same shifted by one.
TEST(TokenBatches, WindowsOfUint32Tokens) {
  TempDir dir;
  const int64_t n = 3000;
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint32_t>(100000 + i);
  write_file(dir.file("a.bin"), llmc32_shard(std::vector<uint32_t>(t.begin(), t.begin() + 1000)));
  write_file(dir.file("b.bin"), llmc32_shard(std::vector<uint32_t>(t.begin() + 1000, t.end())));
  const TokenStream stream(dir.file("*.bin"));
  for (bool sequential : {false, true}) {
    TokenBatchOptions o;
    o.batch = 5;
    o.context = 33;
    o.seed = 3;
    o.sequential = sequential;
    TokenBatches b(stream, o);
    ASSERT_EQ(b.tokens().shape(), (Shape{n, 4}));
    Tensor x, y;
    for (int step = 0; step < 3; ++step) {
      b.next(x, y);
      const auto xs = x.to_vector<int32_t>(), ys = y.to_vector<int32_t>();
      for (int64_t r = 0; r < o.batch; ++r) {
        const int64_t start = b.window_start(step * o.batch + r);
        for (int64_t k = 0; k < o.context; ++k) {
          ASSERT_EQ(xs[static_cast<size_t>(r * o.context + k)], 100000 + start + k) << r << " " << k;
          ASSERT_EQ(ys[static_cast<size_t>(r * o.context + k)], 100000 + start + k + 1) << r << " " << k;
        }
      }
    }
  }
}

// Framed, masked streams (`tandem data jsonl`'s): windows start at frames only, each rank takes whole
// frames, and a target is -100 exactly where the mask holds 0 for the token it names.
TEST(TokenBatches, FramedWindowsWithALossMask) {
  TempDir dir;
  const int64_t F = 9, frames = 14, n = F * frames;  // two shards of 7 frames
  std::vector<uint16_t> t(static_cast<size_t>(n));
  Bytes mask(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    t[static_cast<size_t>(i)] = static_cast<uint16_t>(1000 + i);
    mask[static_cast<size_t>(i)] = static_cast<uint8_t>((i % F) >= 4 && (i % 3) != 0);  // a "response" part
  }
  const size_t half = static_cast<size_t>(n / 2);
  write_file(dir.file("train_000000.bin"), llmc_shard(std::vector<uint16_t>(t.begin(), t.begin() + half)));
  write_file(dir.file("train_000001.bin"), llmc_shard(std::vector<uint16_t>(t.begin() + half, t.end())));
  write_file(dir.file("train_000000.mask"), Bytes(mask.begin(), mask.begin() + half));
  write_file(dir.file("train_000001.mask"), Bytes(mask.begin() + half, mask.end()));
  EXPECT_EQ(mask_path(dir.file("train_000001.bin")), dir.file("train_000001.mask"));
  const TokenStream stream(dir.path(), 0, /*masks=*/true);
  ASSERT_TRUE(stream.masked());
  int64_t ones = 0;
  for (uint8_t m : mask) ones += m;
  EXPECT_EQ(stream.trained(), ones);
  EXPECT_FALSE(TokenStream(dir.path()).masked());

  for (const int64_t T : {F - 1, F - 3})  // windows of the whole frame, and of its first T + 1 tokens
  for (const int world : {1, 2})
  for (const bool sequential : {false, true})
  for (int rank = 0; rank < world; ++rank) {
    TokenBatchOptions o;
    o.batch = 5;
    o.context = T;
    o.seed = 17;
    o.rank = rank;
    o.world_size = world;
    o.sequential = sequential;
    o.frame = F;
    TokenBatches b(stream, o);
    const TokenRange part = b.part();
    EXPECT_EQ(part.begin % F, 0);
    EXPECT_EQ(part.size(), F * frames / world);
    EXPECT_EQ(b.windows(), frames / world);
    ASSERT_EQ(b.mask().shape(), (Shape{part.size()}));
    Tensor x, y;
    std::set<int64_t> seen;
    int64_t masked = 0;
    for (int step = 0; step < 6; ++step) {
      b.next(x, y);
      const auto xs = x.to_vector<int32_t>(), ys = y.to_vector<int32_t>();
      for (int64_t r = 0; r < o.batch; ++r) {
        const int64_t j = step * o.batch + r, start = b.window_start(j);
        ASSERT_EQ(start % F, 0) << "window " << j;
        if (sequential) {
          EXPECT_EQ(start, (j % b.windows()) * F);
        }
        seen.insert(start);
        for (int64_t k = 0; k < T; ++k) {
          const int64_t at = part.begin + start + k;  // the stream position of x's token
          ASSERT_EQ(xs[static_cast<size_t>(r * T + k)], 1000 + at);
          const int32_t want = mask[static_cast<size_t>(at + 1)] ? static_cast<int32_t>(1000 + at + 1) : -100;
          ASSERT_EQ(ys[static_cast<size_t>(r * T + k)], want) << "window " << j << " position " << k;
          masked += want == -100;
        }
      }
    }
    EXPECT_GT(masked, 0);
    if (sequential) {
      EXPECT_EQ(static_cast<int64_t>(seen.size()), b.windows());
    }
  }

  // A stream that is not whole frames, frames that cannot hold a window, a missing or damaged mask.
  TokenBatchOptions o;
  o.context = 8;
  o.frame = 10;
  expect_input_error([&] { TokenBatches b(stream, o); }, {"not a whole number of frames of 10"});
  o.frame = 7;
  expect_input_error([&] { TokenBatches b(stream, o); }, {"frames of 7", "context + 1 = 9"});
  o.frame = F;
  o.world_size = 15;
  expect_input_error([&] { TokenBatches b(stream, o); }, {"gets none of", "14 windows"});
  write_file(dir.file("train_000001.mask"), Bytes(mask.begin(), mask.begin() + 3));
  expect_input_error([&] { TokenStream s(dir.path(), 0, true); }, {"train_000001.mask", "3 bytes", "63 tokens"});
  Bytes bad(mask.begin() + static_cast<long>(half), mask.end());
  bad[5] = 7;
  write_file(dir.file("train_000001.mask"), bad);
  expect_input_error([&] { TokenStream s(dir.path(), 0, true); }, {"train_000001.mask", "byte 5 is 7"});
  std::filesystem::remove(dir.file("train_000001.mask"));
  expect_input_error([&] { TokenStream s(dir.path(), 0, true); }, {"train_000001.bin", "no loss mask"});
}

}  // namespace
}  // namespace tandem::data
