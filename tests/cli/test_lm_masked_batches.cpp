// The batches `tandem train --data DIR` draws from instruction data (`tandem data jsonl`): the data specs
// read the loss mask and the windows from meta.json, the context follows the data's, each window is one
// of the data's, and a target is -100 (ignore_index) exactly where the mask says the token is not trained on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/lm_trainer.h"
#include "tandem/data/jsonl_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/error.h"
#include "text_util.h"

using namespace tandem;
using namespace tandem::cli;
namespace fs = std::filesystem;

namespace {

using tandem::test::error_of;
bool has(const std::string& s, const std::string& part) { return tandem::test::contains(s, part); }

struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("tandem_masked_batches_" + std::to_string(getpid()));
  ScratchDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
};

// 24 prompt/response examples, the last 4 validating, in windows of 33 tokens.
data::JsonlCorpusReport make_data(const fs::path& dir, bool pack) {
  {
    std::ofstream f(dir / "qa.jsonl");
    for (int i = 0; i < 24; ++i)
      f << "{\"prompt\": \"What is " << i << " plus " << i << "?\", \"response\": \" It is " << 2 * i << ".\"}\n";
  }
  data::JsonlCorpusOptions o;
  o.files = {(dir / "qa.jsonl").string()};
  o.out_dir = (dir / "qa").string();
  o.tokenizer = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/llama3.json";
  o.val_fraction = 4.0 / 24.0;
  o.context = 32;
  o.pack = pack;
  return data::write_jsonl_corpus(o);
}

}  // namespace

TEST(LmMaskedBatches, TargetsOfUntrainedTokensAreIgnoreIndex) {
  ScratchDir dir;
  for (const bool pack : {false, true}) {
    const data::JsonlCorpusReport made = make_data(dir.path, pack);
    ASSERT_EQ(made.train.examples, 20);
    LmTrainConfig cfg;
    cfg.data_dir = (dir.path / "qa").string();
    cfg.batch_size = 6;
    cfg.seed = 3;
    const LmDataSpecs specs = lm_data_specs(cfg);
    ASSERT_TRUE(specs.loss_mask);
    EXPECT_EQ(specs.frame, 33);
    EXPECT_EQ(specs.packing, pack ? "pack" : "pad");
    const int64_t T = lm_data_context(cfg, specs);
    EXPECT_EQ(T, 32);  // the data's, --context not given
    const data::TokenStream train = lm_token_stream(specs.train, specs);
    ASSERT_TRUE(train.masked());
    for (const bool validation : {false, true}) {
      const data::TokenStream& stream = validation ? lm_token_stream(specs.val, specs) : train;
      data::TokenBatches b(stream, lm_batch_options(cfg, specs, T, 0, 1, Device::cpu(), validation));
      EXPECT_EQ(b.windows(), (validation ? made.val.windows : made.train.windows));
      Tensor x, y;
      int64_t ignored = 0, kept = 0;
      for (int step = 0; step < 3; ++step) {
        b.next(x, y);
        ASSERT_EQ(y.shape(), (Shape{6, 32}));
        const auto xs = x.to_vector<int32_t>(), ys = y.to_vector<int32_t>();
        for (int64_t r = 0; r < 6; ++r) {
          const int64_t start = b.window_start(step * 6 + r);
          ASSERT_EQ(start % 33, 0) << "a window starts inside an example";
          EXPECT_EQ(stream.at(start), static_cast<uint32_t>(made.bos_id));  // an example's first token
          for (int64_t t = 0; t < T; ++t) {
            const size_t i = static_cast<size_t>(r * T + t);
            ASSERT_EQ(xs[i], static_cast<int32_t>(stream.at(start + t)));
            if (stream.mask_at(start + t + 1) == 0) {
              ASSERT_EQ(ys[i], -100) << "window " << start / 33 << " position " << t;
              ++ignored;
            } else {
              ASSERT_EQ(ys[i], static_cast<int32_t>(stream.at(start + t + 1)));
              ++kept;
            }
          }
        }
      }
      // Prompts and padding are left out, the responses and their end tokens kept.
      EXPECT_GT(kept, 6 * 3 * 2);
      EXPECT_GT(ignored, kept);
    }
  }
}

TEST(LmMaskedBatches, TheDataFixesTheContextAndItsMasksAreNotSkipped) {
  ScratchDir dir;
  make_data(dir.path, false);
  LmTrainConfig cfg;
  cfg.data_dir = (dir.path / "qa").string();
  const LmDataSpecs specs = lm_data_specs(cfg);
  cfg.context = 32;
  EXPECT_EQ(lm_data_context(cfg, specs), 32);
  cfg.context = 64;
  const std::string e = error_of([&] { lm_data_context(cfg, specs); });
  EXPECT_TRUE(has(e, "--context 64 differs from the context 32")) << e;
  EXPECT_TRUE(has(e, "--context 64`")) << e;
  // Without meta.json's word, shards with masks beside them would train on every token: refused.
  LmTrainConfig by_file;
  by_file.train_data = (dir.path / "qa" / "train_000000.bin").string();
  const LmDataSpecs plain = lm_data_specs(by_file);
  EXPECT_FALSE(plain.loss_mask);
  const std::string m = error_of([&] { lm_token_stream(plain.train, plain); });
  EXPECT_TRUE(has(m, "train_000000.mask")) << m;
  EXPECT_TRUE(has(m, "--data")) << m;
}
