// `tandem train --model llama` from the command line: a tied Llama with grouped-query attention on 2 Gloo
// ranks trains under --shard parameters as unsharded, resumes from a checkpoint to the bits of the
// uninterrupted run, is exported as a Hugging Face directory that `tandem generate` samples from exactly as from
// the checkpoint, and a later run starts from that directory (--init), its shape taken from config.json.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"

namespace fs = std::filesystem;
using tandem::test::make_corpus;
using tandem::test::run_tandem;
using tandem::test::step_losses;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_llama_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const std::string kBin = TANDEM_BIN;

}  // namespace

TEST(LlamaCli, ShardedTrainingResumeExportAndInit) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("cli"), corpus = make_corpus(dir);
  const std::string run = "launch -n 2 -- " + kBin +
                          " train --model llama --layers 2 --width 32 --heads 4 --kv-heads 2 --mlp-hidden 64 "
                          "--context 32 --data " + corpus.string() + " --steps 6 --batch-size 2 --lr 3e-3 --warmup 2 "
                          "--clip-norm 0 --eval-every 0 --eval-steps 2 --threads 1 --timeout 60 --seed 1 ";
  const std::string none = (dir / "none.ck").string(), params = (dir / "params.ck").string(),
                    resumed = (dir / "resumed.ck").string();
  auto a = run_tandem(run + "--shard none --checkpoint " + none);
  ASSERT_EQ(a.status, 0) << a.output;
  auto b = run_tandem(run + "--shard parameters --checkpoint " + params);
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_EQ(step_losses(a.output).size(), 6u) << a.output;
  EXPECT_EQ(step_losses(b.output), step_losses(a.output));
  // Two ranks: the same sums in the same order, so the same bits.
  tandem::test::expect_same_tensors(params, none, "--shard parameters");

  // Stopped after 3 steps and resumed: the checkpoint of the uninterrupted run.
  auto s = run_tandem(run + "--shard parameters --checkpoint " + resumed + " --stop-at 3");
  ASSERT_EQ(s.status, 0) << s.output;
  auto r = run_tandem(run + "--shard parameters --checkpoint " + resumed + " --resume");
  ASSERT_EQ(r.status, 0) << r.output;
  tandem::test::expect_same_tensors(resumed, params, "a resumed --shard parameters run");

  // A Hugging Face directory of the weights in f32: the same text, draw for draw.
  const std::string hf = (dir / "hf").string();
  auto e = run_tandem("export --checkpoint " + params + " --format hf -o " + hf);
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_TRUE(fs::exists(hf + "/config.json") && fs::exists(hf + "/model.safetensors")) << e.output;
  const std::string sample = " --prompt 'the ' -n 24 --temperature 1 --top-k 0 --seed 4 --no-prompt 2>/dev/null";
  auto g1 = run_tandem("generate --checkpoint " + params + sample);
  auto g2 = run_tandem("generate --checkpoint " + hf + sample);
  ASSERT_EQ(g1.status, 0) << g1.output;
  ASSERT_EQ(g2.status, 0) << g2.output;
  EXPECT_EQ(g1.output.size(), 24u);
  EXPECT_EQ(g2.output, g1.output);

  // --init DIR: the shape comes from config.json (shape flags are refused), training goes on from its weights.
  const std::string init = "train --model llama --data " + corpus.string() + " --steps 2 --batch-size 2 "
                           "--context 32 --eval-every 0 --eval-steps 1 --threads 1 --lr 1e-3 --warmup 0 --init " + hf;
  auto bad = run_tandem(init + " --layers 3");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--layers would change the shape"), std::string::npos) << bad.output;
  auto i = run_tandem(init);
  ASSERT_EQ(i.status, 0) << i.output;
  // The first loss is the exported model's on the first batch, not a fresh model's (about ln 256 = 5.55).
  const auto li = step_losses(i.output), la = step_losses(a.output);
  ASSERT_EQ(li.size(), 2u) << i.output;
  EXPECT_LT(li.at(1), la.at(1) - 0.05) << i.output;
  fs::remove_all(dir);
}
