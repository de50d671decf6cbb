// What language-model training computes before and around its steps: the step line, MFU and the
// peak table, micro-batches per step, the model's shape and vocabulary against the data, the data specs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/lm_report.h"
#include "cli/lm_trainer.h"
#include "tandem/error.h"
#include "text_util.h"

using namespace tandem;
using namespace tandem::cli;

namespace {

using tandem::test::error_of;
bool has(const std::string& s, const std::string& part) { return tandem::test::contains(s, part); }

}  // namespace

TEST(LmReport, StepLineHasLlmcsLayout) {
  LmStepFigures f;
  f.step = 12;
  f.steps = 5000;
  f.loss = 2.34512;
  f.lr = 1e-3;
  f.grad_norm = 0.912;
  f.step_ms = 45.23;
  f.tokens_per_s = 363000.4;
  f.mfu = 0.381;
  EXPECT_EQ(lm_step_line(f), "step 12/5000 | loss 2.3451 | lr 1.0e-03 | norm 0.91 | 45.2 ms | 363,000 tok/s | MFU 38.1%");
  f.grad_norm = -1;  // not clipped: no norm
  f.mfu = 0;         // unknown: no MFU
  EXPECT_EQ(lm_step_line(f), "step 12/5000 | loss 2.3451 | lr 1.0e-03 | 45.2 ms | 363,000 tok/s");
  EXPECT_EQ(with_commas(0), "0");
  EXPECT_EQ(with_commas(999), "999");
  EXPECT_EQ(with_commas(1000), "1,000");
  EXPECT_EQ(with_commas(-1234567), "-1,234,567");
}

TEST(LmReport, PeakTableAndMfu) {
  EXPECT_EQ(peak_flops("NVIDIA H200", Precision::bf16), 989e12);
  EXPECT_EQ(peak_flops("NVIDIA H200", Precision::f16), 989e12);
  EXPECT_EQ(peak_flops("NVIDIA H200", Precision::tf32), 989e12 / 2);
  EXPECT_EQ(peak_flops("NVIDIA H200", Precision::f32), 0.0);  // not in the table: no MFU
  EXPECT_EQ(peak_flops("NVIDIA H100 80GB HBM3", Precision::bf16), 989e12);
  EXPECT_EQ(peak_flops("NVIDIA H100 PCIe", Precision::bf16), 756e12);
  EXPECT_EQ(peak_flops("NVIDIA A100-SXM4-80GB", Precision::bf16), 312e12);
  EXPECT_EQ(peak_flops("cpu", Precision::bf16), 0.0);
  EXPECT_EQ(peak_flops("Some Future GPU", Precision::bf16), 0.0);
  // GPT-2 124M's 6 N + 12 L T d at 400k tokens/s on an H200: about 32 %.
  const double fpt = 6.0 * 124.475e6 + 12.0 * 12 * 1024 * 768;
  EXPECT_NEAR(mfu(400e3, fpt, 989e12), 400e3 * fpt / 989e12, 1e-12);
  EXPECT_NEAR(mfu(400e3, fpt, 989e12), 0.3479, 1e-3);
  EXPECT_EQ(mfu(400e3, 0.0, 989e12), 0.0);
  EXPECT_EQ(mfu(400e3, fpt, 0.0), 0.0);
}

TEST(LmReport, TotalBatchTokensMustBeWholeMicroBatches) {
  EXPECT_EQ(lm_accumulation(0, 8, 1024, 2), 1);
  EXPECT_EQ(lm_accumulation(8 * 1024 * 2, 8, 1024, 2), 1);
  EXPECT_EQ(lm_accumulation(524288, 16, 1024, 8), 4);
  const std::string e = error_of([] { lm_accumulation(500000, 8, 1024, 2); });
  EXPECT_TRUE(has(e, "--total-batch-tokens 500000 is not a multiple")) << e;
  EXPECT_TRUE(has(e, "8 x 1024 x 2 = 16384")) << e;
  EXPECT_TRUE(has(e, "507904 is the next")) << e;
}

TEST(LmReport, ShapeAndVocabularyFollowTheConfigAndTheData) {
  LmTrainConfig c;
  c.model = "gpt";
  c.gpt_config = "char";
  nn::GptConfig g = lm_model_shape(c, 255);
  EXPECT_EQ(g.vocab, 256);
  EXPECT_EQ(g.context, 256);
  EXPECT_EQ(g.layers, 6);
  c.layers = 2;
  c.width = 64;
  c.heads = 4;
  c.context = 32;
  c.dropout = 0.0;
  g = lm_model_shape(c, 100);
  EXPECT_EQ(g.layers, 2);
  EXPECT_EQ(g.width, 64);
  EXPECT_EQ(g.heads, 4);
  EXPECT_EQ(g.context, 32);
  EXPECT_EQ(g.dropout, 0.0);
  // Tokens the configuration's vocabulary cannot hold: both are named.
  std::string e = error_of([&] { lm_model_shape(c, 300); });
  EXPECT_TRUE(has(e, "largest token is 300")) << e;
  EXPECT_TRUE(has(e, "--gpt-config char, 256")) << e;
  EXPECT_TRUE(has(e, "--vocab 301")) << e;
  c.vocab = 512;
  EXPECT_EQ(lm_model_shape(c, 300).vocab, 512);
  c.heads = 3;
  e = error_of([&] { lm_model_shape(c, 300); });
  EXPECT_TRUE(has(e, "--width 64 is not a multiple of --heads 3")) << e;
  // GPT-2's vocabulary by default.
  LmTrainConfig d;
  d.model = "gpt";
  EXPECT_EQ(lm_model_shape(d, 50256).vocab, 50304);
  EXPECT_EQ(lm_model_shape(d, 50256).context, 1024);
  // bigram: as small as the data allows, 256 for bytes; context 256.
  LmTrainConfig b;
  b.model = "bigram";
  EXPECT_EQ(lm_model_shape(b, 97).vocab, 256);
  EXPECT_EQ(lm_model_shape(b, 97).context, 256);
  EXPECT_EQ(lm_model_shape(b, 1000).vocab, 1001);
  EXPECT_EQ(lm_model_shape(b, -1).vocab, 256);  // no data (benchmarks)
}

TEST(LmReport, GptShapeJsonRoundTrips) {
  nn::GptConfig g = nn::gpt_config("char");
  g.bias = false;
  const nlohmann::json j = gpt_shape_json(g);
  for (const char* key : {"layers", "heads", "width", "context", "vocab", "dropout", "bias"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(gpt_shape_json(gpt_shape_from_json(j)), j);
  EXPECT_EQ(j["vocab"], 256);
  EXPECT_EQ(j["bias"], false);
}

TEST(LmReport, DataSpecsOfADirectoryAndTheirErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_lm_specs_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  LmTrainConfig c;
  c.data_dir = dir.string();
  std::string e = error_of([&] { lm_data_specs(c); });
  EXPECT_TRUE(has(e, "holds no training shards")) << e;
  std::ofstream(dir / "train_000000.bin") << "x";
  LmDataSpecs s = lm_data_specs(c);
  EXPECT_EQ(s.train, (dir / "*train*.bin").string());
  EXPECT_EQ(s.val, "");  // no validation shards
  std::ofstream(dir / "val_000000.bin") << "x";
  EXPECT_EQ(lm_data_specs(c).val, (dir / "*val*.bin").string());
  c.train_data = "other.bin";
  e = error_of([&] { lm_data_specs(c); });
  EXPECT_TRUE(has(e, "give one or the other")) << e;
  c.data_dir = (dir / "train_000000.bin").string();
  c.train_data.clear();
  e = error_of([&] { lm_data_specs(c); });
  EXPECT_TRUE(has(e, "is not a directory")) << e;
  LmTrainConfig none;
  e = error_of([&] { lm_data_specs(none); });
  EXPECT_TRUE(has(e, "give --data DIR")) << e;
  fs::remove_all(dir);
}

// The vocabulary a directory's meta.json declares (as `tandem data text` writes it) is the model's
// unless --vocab is given; a meta.json without one leaves the configuration's; a broken one is named.
TEST(LmReport, TheDataDirectorysMetaGivesTheVocabulary) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_lm_vocab_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "train_000000.bin") << "x";
  LmTrainConfig c;
  c.model = "gpt";
  c.data_dir = dir.string();
  EXPECT_EQ(lm_data_specs(c).vocab, 0);  // no meta.json
  EXPECT_EQ(lm_model_shape(c, 200, lm_data_specs(c)).vocab, 50304);
  const std::string meta = (dir / "meta.json").string();
  std::ofstream(meta) << R"({"tokenizer": "byte", "vocab_size": 256})";
  LmDataSpecs s = lm_data_specs(c);
  EXPECT_EQ(s.vocab, 256);
  EXPECT_EQ(s.vocab_from, meta);
  EXPECT_EQ(lm_model_shape(c, 200, s).vocab, 256);  // not gpt2's 50304
  EXPECT_EQ(lm_model_shape(c, 200, s).width, 768);  // the rest is the configuration's
  std::string e = error_of([&] { lm_model_shape(c, 300, s); });
  EXPECT_TRUE(has(e, "largest token is 300, beyond the vocabulary 256 that '" + meta + "' gives")) << e;
  EXPECT_TRUE(has(e, "--vocab 301")) << e;
  c.vocab = 512;  // --vocab wins
  EXPECT_EQ(lm_model_shape(c, 300, s).vocab, 512);
  c.vocab = 0;
  c.model = "bigram";
  EXPECT_EQ(lm_model_shape(c, 97, s).vocab, 256);
  std::ofstream(meta) << R"({"tokenizer": "byte"})";
  EXPECT_EQ(lm_data_specs(c).vocab, 0);
  std::ofstream(meta) << R"({"vocab_size": "many"})";
  e = error_of([&] { lm_data_specs(c); });
  EXPECT_TRUE(has(e, "gives vocab_size \"many\": it must be a positive integer")) << e;
  std::ofstream(meta) << R"({"vocab_size": 0})";
  e = error_of([&] { lm_data_specs(c); });
  EXPECT_TRUE(has(e, "it must be a positive integer")) << e;
  std::ofstream(meta) << "{\"vocab_size\": 2";
  e = error_of([&] { lm_data_specs(c); });
  EXPECT_TRUE(has(e, "'" + meta + "' is not a JSON object")) << e;
  fs::remove_all(dir);
}
