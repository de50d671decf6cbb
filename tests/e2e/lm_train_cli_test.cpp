// `tandem train` and `tandem bench train` for language models, as a user runs them, on a small corpus
// made here by `tandem data text`: the loss goes down, accumulated micro-batches make the step one
// batch of them all would, a resumed run ends in the bits of the uninterrupted one, two ranks train as
// one does, and wrong flags end with a clear message and status 2.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <tuple>

#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"
#include "tandem/checkpoint.h"
#include "text_util.h"

namespace fs = std::filesystem;
using tandem::test::expect_same_checkpoints;
using tandem::test::make_corpus;
using tandem::test::run_tandem;
using tandem::test::tensors_of;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_lm_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using tandem::test::contains;

const std::string kBin = TANDEM_BIN;

// The bigram's training command on the corpus, one CPU thread.
std::string bigram(const fs::path& corpus, const std::string& extra) {
  return "train --model bigram --data " + corpus.string() + " --threads 1 --seed 5 --timeout 60 " + extra;
}

using tandem::test::step_losses;

using tandem::test::validation_losses;

// The largest difference between the two checkpoints' parameter `name` (f32).
double max_difference(const std::string& a, const std::string& b, const std::string& name) {
  auto ta = tensors_of(a), tb = tensors_of(b);
  EXPECT_TRUE(ta.count(name) && tb.count(name)) << name;
  if (!ta.count(name) || !tb.count(name)) return INFINITY;
  const std::vector<float> va = ta[name].to_vector<float>(), vb = tb[name].to_vector<float>();
  EXPECT_EQ(va.size(), vb.size());
  double m = 0;
  for (size_t i = 0; i < std::min(va.size(), vb.size()); ++i) m = std::max(m, std::fabs(double(va[i]) - vb[i]));
  return m;
}

std::vector<nlohmann::json> json_lines(const fs::path& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}

}  // namespace

// The bigram learns the corpus: the training loss falls from about ln 256 (plus the table's spread) to
// far below, and so does the validation loss; the metrics file has a line per step and per evaluation.
TEST(LmTrainCli, BigramLossGoesDownAndIsReported) {
  const fs::path dir = temp_dir("down"), corpus = make_corpus(dir);
  const fs::path metrics = dir / "m.jsonl";
  auto r = run_tandem(bigram(corpus, "--steps 60 --batch-size 8 --context 64 --lr 0.1 --eval-every 30 --eval-steps 4 "
                                     "--metrics " + metrics.string() + " --tensorboard " + (dir / "tb").string()));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto losses = step_losses(r.output);
  ASSERT_EQ(losses.size(), 60u) << r.output;
  EXPECT_GT(losses.at(1), 5.0) << r.output;
  EXPECT_LT(losses.at(60), 3.0) << r.output;
  const auto vals = validation_losses(r.output);
  ASSERT_EQ(vals.size(), 3u) << r.output;  // at steps 0 and 30, and at the end
  EXPECT_LT(vals.back(), vals.front() - 2.0) << r.output;
  EXPECT_TRUE(contains(r.output, "tok/s")) << r.output;
  EXPECT_TRUE(contains(r.output, "| norm ")) << r.output;     // --clip-norm 1 by default
  EXPECT_FALSE(contains(r.output, "MFU")) << r.output;        // no peak for a CPU, no FLOPs for a bigram
  EXPECT_TRUE(contains(r.output, "tandem: done: 60 steps")) << r.output;
  const auto lines = json_lines(metrics);
  int steps = 0, evals = 0;
  for (const auto& j : lines) {
    if (j.contains("val_loss")) {
      ++evals;
      continue;
    }
    ++steps;
    for (const char* key : {"step", "loss", "lr", "grad_norm", "step_ms", "tokens_per_s", "tokens", "flops_per_token",
                            "run_id", "model", "precision", "context", "batch_size"})
      EXPECT_TRUE(j.contains(key)) << key << " missing from " << j.dump();
    EXPECT_GT(j.value("tokens_per_s", 0.0), 0.0) << j.dump();
    EXPECT_FALSE(j.contains("mfu")) << j.dump();  // reported only where the device's peak is known
  }
  EXPECT_EQ(steps, 60);
  EXPECT_EQ(evals, 3);
  EXPECT_EQ(lines.back().value("step", -1), 60);
  bool events = false;
  for (const auto& e : fs::directory_iterator(dir / "tb")) events = events || contains(e.path().string(), "tfevents");
  EXPECT_TRUE(events);
  // tandem plot draws a language model's run by step.
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    auto plot = run_tandem("plot " + metrics.string() + " -o " + (dir / "curves.png").string());
    EXPECT_EQ(plot.status, 0) << plot.output;
    EXPECT_TRUE(contains(plot.output, "steps up to 60 of run")) << plot.output;
    EXPECT_TRUE(fs::exists(dir / "curves.png"));
  }
  fs::remove_all(dir);
}

// Two micro-batches of 2 sequences make the step one batch of 4 makes (the same windows: window j of
// the rank is drawn from the seed alone), within float rounding; one micro-batch of 2 does not.
// A GPT of GPT-2's configuration trained on the byte-level shards of `tandem data text` takes their
// vocabulary of 256 (their meta.json's), not GPT-2's 50304, so that tandem generate samples from it.
TEST(LmTrainCli, AGptOnByteShardsTakesTheirVocabularyAndGenerates) {
  const fs::path dir = temp_dir("bytes"), corpus = make_corpus(dir);
  const std::string ck = (dir / "g.ck").string();
  auto r = run_tandem("train --model gpt --layers 1 --heads 2 --width 32 --context 32 --data " + corpus.string() +
                      " --steps 3 --batch-size 2 --eval-every 0 --eval-steps 1 --threads 1 --checkpoint " + ck);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 256 (" + (corpus / "meta.json").string() + "'s)")) << r.output;
  auto g = run_tandem("generate --checkpoint " + ck + " --prompt 'the ' -n 8 --seed 1");
  EXPECT_EQ(g.status, 0) << g.output;
  EXPECT_EQ(g.output.rfind("the ", 0), 0u) << g.output;
  // --vocab still chooses.
  auto w = run_tandem("train --model gpt --layers 1 --heads 2 --width 32 --context 32 --data " + corpus.string() +
                      " --steps 1 --batch-size 2 --eval-every 0 --eval-steps 1 --threads 1 --vocab 384");
  ASSERT_EQ(w.status, 0) << w.output;
  EXPECT_TRUE(contains(w.output, "vocabulary 384, context 32")) << w.output;
  fs::remove_all(dir);
}

// The whole path with a tokenizer of more than 65,536 tokens: tandem data text --tokenizer writes uint32
// shards, a GPT trains on them with the vocabulary their meta.json gives, and tandem generate reads the
// prompt and writes the text with the tokenizer.json beside the checkpoint.
TEST(LmTrainCli, AGptOnUint32TokenizerShardsTrainsAndGenerates) {
  const fs::path dir = temp_dir("tokenizer"), run = dir / "run";
  fs::create_directories(run);
  std::ifstream fixture(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/gpt2.json");
  nlohmann::json j = nlohmann::json::parse(fixture);
  j["added_tokens"] = nlohmann::json::array({j["added_tokens"][0]});  // <|endoftext|>, id 0
  for (int id = 1200; id < 70000; ++id) j["model"]["vocab"]["<unused_" + std::to_string(id) + ">"] = id;
  std::ofstream(run / "tokenizer.json") << j.dump();
  std::ofstream(dir / "a_work.txt") << tandem::test::corpus_text(1, 20000);
  std::ofstream(dir / "b_work.txt") << tandem::test::corpus_text(2, 5000);
  const fs::path corpus = dir / "corpus";
  auto r = run_tandem("data text " + (dir / "a_work.txt").string() + " " + (dir / "b_work.txt").string() + " -o " +
                      corpus.string() + " --val 0.2 --tokenizer " + (run / "tokenizer.json").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 70000, 32-bit tokens")) << r.output;
  const std::string ck = (run / "g.ck").string();
  r = run_tandem("train --model gpt --layers 1 --heads 2 --width 16 --context 16 --data " + corpus.string() +
                 " --steps 2 --batch-size 2 --eval-every 0 --eval-steps 1 --threads 1 --checkpoint " + ck);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 70000 (" + (corpus / "meta.json").string() + "'s)")) << r.output;
  auto g = run_tandem("generate --checkpoint " + ck + " --prompt 'the king' -n 4 --seed 1");
  EXPECT_EQ(g.status, 0) << g.output;
  EXPECT_TRUE(contains(g.output, "beside the checkpoint")) << g.output;
  EXPECT_TRUE(contains(g.output, "the king")) << g.output;
  fs::remove_all(dir);
}

TEST(LmTrainCli, AccumulatedMicroBatchesMakeTheStepOfOneBatch) {
  const fs::path dir = temp_dir("accumulate"), corpus = make_corpus(dir);
  const std::string one = (dir / "one.ck").string(), two = (dir / "two.ck").string(), half = (dir / "half.ck").string();
  auto a = run_tandem(bigram(corpus, "--steps 2 --context 32 --batch-size 4 --lr 0.01 --checkpoint " + one));
  ASSERT_EQ(a.status, 0) << a.output;
  auto b = run_tandem(bigram(corpus, "--steps 2 --context 32 --batch-size 2 --total-batch-tokens 128 --lr 0.01 "
                                     "--checkpoint " + two));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "2 micro-batches per step (128 tokens)")) << b.output;
  auto c = run_tandem(bigram(corpus, "--steps 2 --context 32 --batch-size 2 --lr 0.01 --checkpoint " + half));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_LT(max_difference(one, two, "param/table.weight"), 1e-5);
  EXPECT_GT(max_difference(one, half, "param/table.weight"), 1e-3);  // the comparison can tell batches apart
  const auto la = step_losses(a.output), lb = step_losses(b.output);
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  EXPECT_NEAR(la.at(2), lb.at(2), 1e-4);
  fs::remove_all(dir);
}

// A run stopped at step 4 and resumed ends in the bits of the uninterrupted run (model, AdamW's moments
// and step counts), with the same losses after the resume: the windows drawn, the schedule's step and the
// rank's state are restored, with micro-batches accumulated.
TEST(LmTrainCli, ResumedRunEndsBitForBitWhereTheUninterruptedOneEnds) {
  const fs::path dir = temp_dir("resume"), corpus = make_corpus(dir);
  const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
  const std::string run = "--steps 8 --warmup 3 --context 32 --batch-size 2 --total-batch-tokens 128 --lr 0.05 "
                          "--eval-every 4 --eval-steps 2 ";
  auto a = run_tandem(bigram(corpus, run + "--checkpoint " + whole));
  ASSERT_EQ(a.status, 0) << a.output;
  auto b1 = run_tandem(bigram(corpus, run + "--stop-at 4 --checkpoint " + parted));
  ASSERT_EQ(b1.status, 0) << b1.output;
  EXPECT_TRUE(contains(b1.output, "stopped at step 4 of 8")) << b1.output;
  auto b2 = run_tandem(bigram(corpus, run + "--resume --checkpoint " + parted));
  ASSERT_EQ(b2.status, 0) << b2.output;
  EXPECT_TRUE(contains(b2.output, "resuming from '" + parted + "' at step 4")) << b2.output;
  expect_same_checkpoints(whole, parted, 1);
  const auto la = step_losses(a.output), lb = step_losses(b2.output);
  ASSERT_EQ(lb.size(), 4u) << b2.output;
  for (int step = 5; step <= 8; ++step) EXPECT_EQ(la.at(step), lb.at(step)) << "step " << step;
  EXPECT_EQ(validation_losses(a.output).back(), validation_losses(b2.output).back());
  // The run the checkpoint holds is finished now.
  auto again = run_tandem(bigram(corpus, run + "--resume --checkpoint " + parted));
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "holds a finished run (8 of --steps 8 steps done)")) << again.output;
  // What the checkpoint says of itself.
  const auto meta = nlohmann::json::parse(tandem::checkpoint_meta(whole));
  EXPECT_EQ(meta.value("model", ""), "bigram");
  EXPECT_EQ(meta.value("kind", ""), "language model");
  EXPECT_EQ(meta.value("step", -1), 8);
  EXPECT_EQ(meta.value("vocab", -1), 256);
  EXPECT_EQ(meta.value("context", -1), 32);
  EXPECT_FALSE(meta.contains("gpt"));  // a GPT's shape, for --model gpt only
  // A checkpoint of another shape is refused, naming both.
  auto other = run_tandem(bigram(corpus, "--steps 8 --context 16 --resume --checkpoint " + parted));
  EXPECT_EQ(other.status, 2) << other.output;
  EXPECT_TRUE(contains(other.output, "context 32 and vocabulary 256; this run builds context 16")) << other.output;
  // tandem eval measures image classifiers and says so.
  auto ev = run_tandem("eval --checkpoint " + whole);
  EXPECT_EQ(ev.status, 2) << ev.output;
  EXPECT_TRUE(contains(ev.output, "holds the language model bigram")) << ev.output;
  fs::remove_all(dir);
}

// On two ranks too, with each rank's own powerSGD state (its Q and error-feedback residuals) saved
// beside the checkpoint: the resumed run ends in the uninterrupted run's bits.
TEST(LmTrainCli, TwoRanksResumeBitForBitWithPowerSgdState) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("resume2"), corpus = make_corpus(dir);
  const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
  const std::string run = "--steps 6 --warmup 2 --context 32 --batch-size 2 --lr 0.05 -d powerSGD --eval-every 0 "
                          "--eval-steps 2 ";
  auto launch2 = [&](const std::string& args) { return run_tandem("launch -n 2 -- " + kBin + " " + bigram(corpus, args)); };
  auto a = launch2(run + "--checkpoint " + whole);
  ASSERT_EQ(a.status, 0) << a.output;
  auto b1 = launch2(run + "--stop-at 3 --checkpoint " + parted);
  ASSERT_EQ(b1.status, 0) << b1.output;
  auto b2 = launch2(run + "--resume --checkpoint " + parted);
  ASSERT_EQ(b2.status, 0) << b2.output;
  EXPECT_FALSE(contains(b2.output, "start afresh")) << b2.output;
  expect_same_checkpoints(whole, parted, 2);
  fs::remove_all(dir);
}

// partialUpdate: the replicas differ between averages. Each rank's own replica is saved beside the
// checkpoint (the file holds their average, the model to generate with) and taken again on resume, and an
// evaluation (here also the one at --stop-at) evaluates the average without changing any replica: the
// resumed run ends in the uninterrupted run's bits.
TEST(LmTrainCli, TwoRanksResumeBitForBitUnderPartialUpdate) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("resume_partial"), corpus = make_corpus(dir);
  const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
  const std::string run = "--steps 6 --warmup 2 --context 32 --batch-size 2 --lr 0.05 -d partialUpdate "
                          "--bucket-mb 0.001 --first-bucket-mb 0.001 --eval-every 2 --eval-steps 2 ";
  auto launch2 = [&](const std::string& args) { return run_tandem("launch -n 2 -- " + kBin + " " + bigram(corpus, args)); };
  auto a = launch2(run + "--checkpoint " + whole);
  ASSERT_EQ(a.status, 0) << a.output;
  auto b1 = launch2(run + "--stop-at 3 --checkpoint " + parted);
  ASSERT_EQ(b1.status, 0) << b1.output;
  auto b2 = launch2(run + "--resume --checkpoint " + parted);
  ASSERT_EQ(b2.status, 0) << b2.output;
  EXPECT_FALSE(contains(b2.output, "start afresh")) << b2.output;
  EXPECT_FALSE(contains(b2.output, "starts from the checkpoint's parameters")) << b2.output;
  expect_same_checkpoints(whole, parted, 2);
  EXPECT_EQ(validation_losses(a.output).back(), validation_losses(b2.output).back());
  // The replicas did differ at the stop (else the test would not tell a shared model from two).
  auto r0 = tensors_of(parted + ".rank0"), r1 = tensors_of(parted + ".rank1");
  fs::remove_all(dir);
  ASSERT_TRUE(r0.count("dist/param/0") && r1.count("dist/param/0"));
  EXPECT_NE(r0["dist/param/0"].to_vector<float>(), r1["dist/param/0"].to_vector<float>());
}

// Two ranks over Gloo with 4 sequences each train as one rank with 8 does: the final validation loss
// (over the whole validation split) within 1 % of one rank's for plain and half (f16) gradients under
// AdamW, and within 2 % for powerSGD's rank-2 gradients under SGD with momentum. (The ranks draw other
// windows, from their halves of the data, so the runs are not the same bits. Under AdamW, whose
// per-element normalisation enlarges the low-rank approximation's errors, powerSGD trains the bigram
// more slowly: about 2.5 against 1.6 after these 100 steps.)
TEST(LmTrainCli, TwoRanksTrainAsOneForPlainHalfAndPowerSgd) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("ranks"), corpus = make_corpus(dir);
  const std::string run = "--steps 100 --context 64 --eval-every 0 --eval-steps 1000 --log-every 50 ";
  const std::string adamw = "--lr 0.1 ", sgd = "--optimizer sgd --lr 2 --momentum 0.9 --weight-decay 0 ";
  for (const auto& [method, opt, tolerance] : {std::tuple<const char*, std::string, double>{"plain", adamw, 0.01},
                                               {"half", adamw, 0.01},
                                               {"powerSGD", sgd, 0.02}}) {
    SCOPED_TRACE(method);
    auto single = run_tandem(bigram(corpus, run + opt + "--batch-size 8"));
    ASSERT_EQ(single.status, 0) << single.output;
    const auto v1 = validation_losses(single.output);
    ASSERT_EQ(v1.size(), 1u) << single.output;
    EXPECT_LT(v1[0], 2.0) << single.output;
    auto two = run_tandem("launch -n 2 -- " + kBin + " " + bigram(corpus, run + opt + "--batch-size 4 -d " + method));
    ASSERT_EQ(two.status, 0) << two.output;
    EXPECT_TRUE(contains(two.output, std::string("2 ranks (gloo, ") + method + ")")) << two.output;
    const auto v2 = validation_losses(two.output);
    ASSERT_EQ(v2.size(), 1u) << two.output;
    EXPECT_NEAR(v2[0], v1[0], tolerance * v1[0]) << two.output;
  }
  fs::remove_all(dir);
}

// The same for a tiny GPT (2 blocks of width 64, 2 heads, context 64; AdamW) on a corpus whose training shard
// is one text in lower case and then one in capitals, so that each of two ranks draws its windows from one of
// them alone, and whose validation text has both. Two ranks with 4 sequences each end within 2 % of one rank
// with 8 for plain and half (f16) gradients, also with the bias gradients taken by the weight-gradient
// products (TANDEM_BIAS_FROM_PRODUCT=1, the CUDA default), and within 8 % for powerSGD's rank-8 gradients,
// which train a little more slowly (measured: 0.787 for one rank; 0.788, 0.784 and 0.788 for plain, half and
// plain from the products; 0.818 for powerSGD). A model trained on the lower-case text alone, as a rank that
// never synchronised would be, scores more than twice one rank's loss (measured 5.97): the comparison tells
// synchronised ranks from ranks that train apart.
TEST(LmTrainCli, TwoRanksTrainATinyGptAsOne) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const fs::path dir = temp_dir("gpt_ranks");
  std::ofstream(dir / "a_lower.txt") << tandem::test::corpus_text(1, 40000);
  std::ofstream(dir / "b_upper.txt") << tandem::test::upper_case(tandem::test::corpus_text(2, 40000));
  std::ofstream(dir / "c_both.txt") << tandem::test::corpus_text(3, 10000)
                                    << tandem::test::upper_case(tandem::test::corpus_text(4, 10000));
  // Shards of the files in DIR/out, the last file held out for validation.
  auto shards = [&dir](const std::string& out, std::initializer_list<const char*> files, const char* val) {
    std::string paths;
    for (const char* f : files) paths += (dir / f).string() + " ";
    auto r = run_tandem("data text " + paths + "-o " + (dir / out).string() + " --val " + val);
    EXPECT_EQ(r.status, 0) << r.output;
    return dir / out;
  };
  const fs::path both = shards("both", {"a_lower.txt", "b_upper.txt", "c_both.txt"}, "0.2");
  const fs::path lower = shards("lower", {"a_lower.txt", "c_both.txt"}, "0.3");
  ASSERT_FALSE(HasFailure());
  auto gpt = [](const fs::path& data, const std::string& extra) {
    return "train --model gpt --gpt-config char --layers 2 --heads 2 --width 64 --context 64 --dropout 0 --threads 1 "
           "--seed 5 --timeout 120 --steps 700 --lr 0.003 --eval-every 0 --eval-steps 1000 --log-every 1000 --data " +
           data.string() + " " + extra;
  };
  auto final_val = [](const tandem::test::RunResult& r) {
    const auto v = validation_losses(r.output);
    EXPECT_EQ(v.size(), 1u) << r.output;
    return v.empty() ? INFINITY : v.back();
  };
  auto single = run_tandem(gpt(both, "--batch-size 8"));
  ASSERT_EQ(single.status, 0) << single.output;
  const double one = final_val(single);
  EXPECT_LT(one, 1.0) << single.output;
  auto apart = run_tandem(gpt(lower, "--batch-size 4"));
  ASSERT_EQ(apart.status, 0) << apart.output;
  const double alone = final_val(apart);
  std::printf("validation loss: one rank %.4f, trained on the lower-case text alone %.4f\n", one, alone);
  EXPECT_GT(alone, 2.0 * one) << apart.output;
  for (const auto& [method, bias_from_product, tolerance] : {std::tuple<std::string, bool, double>{"plain", false, 0.02},
                                                             {"half", false, 0.02},
                                                             {"powerSGD --rank 8", false, 0.08},
                                                             {"plain", true, 0.02}}) {
    SCOPED_TRACE(method + (bias_from_product ? ", TANDEM_BIAS_FROM_PRODUCT=1" : ""));
    if (bias_from_product) setenv("TANDEM_BIAS_FROM_PRODUCT", "1", 1);
    auto two = run_tandem("launch -n 2 -- " + kBin + " " + gpt(both, "--batch-size 4 -d " + method));
    unsetenv("TANDEM_BIAS_FROM_PRODUCT");
    ASSERT_EQ(two.status, 0) << two.output;
    EXPECT_TRUE(contains(two.output, "2 ranks (gloo, " + method.substr(0, method.find(' ')) + ")")) << two.output;
    const double v = final_val(two);
    std::printf("validation loss: two ranks, %s%s: %.4f\n", method.c_str(),
                bias_from_product ? ", TANDEM_BIAS_FROM_PRODUCT=1" : "", v);
    EXPECT_NEAR(v, one, tolerance * one) << two.output;
  }
  fs::remove_all(dir);
}

// Flags of the other kind of model, and settings that cannot work, stop before training with status 2
// and a message that says what to do.
TEST(LmTrainCli, WrongFlagsAreClearErrors) {
  const fs::path dir = temp_dir("flags"), corpus = make_corpus(dir);
  const std::string base = bigram(corpus, "--steps 2 ");
  auto expect_error = [&](const std::string& args, const std::string& message) {
    auto r = run_tandem(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, message)) << args << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/")) << args << "\n" << r.output;
  };
  expect_error(base + "--epochs 3", "--epochs is for image models; --model bigram is a language model: language "
                                    "models train for --steps");
  expect_error(base + "--dataset mnist", "--dataset is for image models");
  expect_error(base + "--accumulate 2", "accumulate to --total-batch-tokens");
  expect_error("train --model cnn --data " + corpus.string(), "--data is for language models");
  expect_error("train --model cnn --steps 3", "--steps is for language models");
  expect_error(base + "--train-data " + (corpus / "train_000000.bin").string(), "give one or the other");
  expect_error("train --model bigram --steps 2", "give --data DIR");
  expect_error("train --model bigram --data " + (dir / "nowhere").string(), "is not a directory");
  expect_error(base + "--batch-size 3 --context 10 --total-batch-tokens 100",
               "--total-batch-tokens 100 is not a multiple of the tokens of one micro-batch on every rank, "
               "--batch-size x --context x ranks = 3 x 10 x 1 = 30");
  expect_error(base + "--warmup 2", "--warmup 2 must be below --steps 2");
  expect_error(base + "--layers 2", "--layers shapes --model gpt");
  expect_error(base + "--vocab 100", "the data's largest token is 121, beyond --vocab 100: give --vocab 122");
  expect_error(base + "--min-lr 1", "--min-lr 1 is above --lr");
  expect_error(base + "--optimizer sgd --beta2 0.9", "--optimizer sgd has none");
  expect_error(base + "--stop-at 3 --checkpoint " + (dir / "c.ck").string(), "--stop-at 3 is beyond --steps 2");
  expect_error(base + "--stop-at 1", "--checkpoint");  // CLI11: --stop-at needs --checkpoint
  expect_error(base + "--context 100000", "fewer than one window");
  fs::remove_all(dir);
}

// --train-data DIR of nanoGPT's train.bin and val.bin (or llm.c's NAME_train.bin and NAME_val.bin) trains on
// the training shard alone and validates on the other; a text file given as shards is refused, pointing to
// `tandem data text`, for the gpt configuration and for char alike.
TEST(LmTrainCli, TrainDataDirectoryOfBothSplitsTrainsOnTheTrainingShardOnly) {
  const fs::path dir = temp_dir("splits");
  auto bare = [](const std::string& text) {
    std::string b;
    for (char c : text) {
      b.push_back(c);
      b.push_back('\0');  // nanoGPT's uint16 tokens of bytes, little-endian
    }
    return b;
  };
  const std::string train = tandem::test::corpus_text(1, 3000), val = tandem::test::corpus_text(2, 1000);
  auto commas = [](size_t n) {
    const std::string d = std::to_string(n);
    std::string out;
    for (size_t i = 0; i < d.size(); ++i) out += (i > 0 && (d.size() - i) % 3 == 0 ? "," : "") + d.substr(i, 1);
    return out;
  };
  const std::string both = commas(train.size()) + " training / " + commas(val.size()) + " validation tokens";
  const std::string same = commas(train.size()) + " training / " + commas(train.size()) + " validation tokens";
  for (const auto& [sub, train_name, val_name] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"nano", "train.bin", "val.bin"}, {"llmc", "shakespeare_char_train.bin", "shakespeare_char_val.bin"}}) {
    SCOPED_TRACE(sub);
    fs::create_directories(dir / sub);
    std::ofstream(dir / sub / train_name, std::ios::binary) << bare(train);
    std::ofstream(dir / sub / val_name, std::ios::binary) << bare(val);
    auto r = run_tandem("train --model bigram --train-data " + (dir / sub).string() +
                        " --steps 2 --context 16 --batch-size 2 --eval-every 0 --eval-steps 1 --threads 1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, both)) << both << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "holds training and validation shards: training on")) << r.output;
    EXPECT_EQ(validation_losses(r.output).size(), 1u) << r.output;
    // --val-data names the validation shards itself.
    r = run_tandem("train --model bigram --train-data " + (dir / sub).string() + " --val-data " +
                   (dir / sub / train_name).string() + " --steps 1 --context 16 --batch-size 2 --threads 1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, same)) << same << "\n" << r.output;
  }
  // Text where shards were expected.
  std::ofstream(dir / "input.txt") << tandem::test::corpus_text(3, 2000);
  for (const std::string& model : {std::string("--model gpt --gpt-config gpt2"), std::string("--model gpt --gpt-config char")}) {
    auto r = run_tandem("train " + model + " --train-data " + (dir / "input.txt").string() +
                        " --layers 1 --heads 1 --width 8 --context 16 --steps 1 --threads 1");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "input.txt' holds text, not tokens")) << r.output;
    EXPECT_TRUE(contains(r.output, "tandem data text " + (dir / "input.txt").string() + " -o DIR")) << r.output;
    EXPECT_FALSE(contains(r.output, "--vocab")) << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/")) << r.output;
  }
  fs::remove_all(dir);
}

// bench train times a language model's steps on random tokens and says so in its RESULT line.
TEST(LmTrainCli, BenchTrainReportsTokensPerSecond) {
  auto r = run_tandem("bench train --model bigram --batch-size 4 --context 32 --steps 3 --warmup 1 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t at = r.output.find("RESULT ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(at + 7, r.output.find('\n', at) - at - 7));
  EXPECT_EQ(j.value("model", ""), "bigram");
  EXPECT_EQ(j.value("context", 0), 32);
  EXPECT_EQ(j.value("batch_per_rank", 0), 4);
  EXPECT_EQ(j.value("optimizer", ""), "adamw");
  EXPECT_GT(j.value("tokens_per_s", 0.0), 0.0);
  EXPECT_GT(j.value("ms_per_step", 0.0), 0.0);
  EXPECT_TRUE(j.contains("flops_per_token"));
  EXPECT_FALSE(j.contains("mfu"));  // a CPU: no peak
  auto bad = run_tandem("bench train --model bigram --image 32");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "--image is for image models")) << bad.output;
}

// --recompute full: the blocks of a Llama and a GPT run again in backward; the run is the one without it (the same
// printed losses), its gradients landing in the released gradients' buckets as without it, on one rank and on two
// under --shard parameters; dropout and a bigram are refused, naming what to change.
TEST(LmTrainCli, RecomputeTrainsTheRunWithoutIt) {
  const fs::path dir = temp_dir("recompute"), corpus = make_corpus(dir);
  for (const std::string model : {"llama --kv-heads 2", "gpt"}) {
    const std::string run = "train --model " + model + " --layers 2 --heads 4 --width 32 --context 32 --data " +
                            corpus.string() + " --steps 20 --batch-size 4 --device cpu --dropout 0 --eval-every 0 "
                            "--eval-steps 2 --log-every 5";
    auto plain = run_tandem(run);
    ASSERT_EQ(plain.status, 0) << plain.output;
    const auto a = step_losses(plain.output);
    ASSERT_EQ(a.size(), 4u) << plain.output;
    for (const std::string policy : {"full", "selective"}) {
      auto again = run_tandem(run + " --recompute " + policy);
      ASSERT_EQ(again.status, 0) << again.output;
      EXPECT_EQ(step_losses(again.output), a) << model << " " << policy;
      EXPECT_EQ(tandem::test::final_validation_loss(again.output), tandem::test::final_validation_loss(plain.output))
          << model << " " << policy;
    }
  }
  // Two ranks under --shard parameters: each group's parameters are gathered again for its second run.
  const std::string two = "launch -n 2 -- " + kBin + " train --model llama --kv-heads 2 --layers 2 --heads 4 --width 32 "
                          "--context 32 --data " + corpus.string() + " --steps 10 --batch-size 2 --device cpu "
                          "--eval-every 0 --eval-steps 2 --shard parameters";
  auto sharded = run_tandem(two);
  ASSERT_EQ(sharded.status, 0) << sharded.output;
  for (const std::string policy : {"full", "selective"}) {
    auto sharded_again = run_tandem(two + " --recompute " + policy);
    ASSERT_EQ(sharded_again.status, 0) << sharded_again.output;
    EXPECT_EQ(tandem::test::final_validation_loss(sharded_again.output),
              tandem::test::final_validation_loss(sharded.output)) << policy;
  }
  // Dropout: the second run of each block draws the first's masks again.
  const std::string drop = "train --model gpt --layers 2 --heads 4 --width 32 --context 32 --data " + corpus.string() +
                           " --steps 10 --batch-size 4 --device cpu --dropout 0.2 --eval-every 0 --eval-steps 2 "
                           "--log-every 5";
  auto dropped = run_tandem(drop), dropped_again = run_tandem(drop + " --recompute full");
  ASSERT_EQ(dropped.status, 0) << dropped.output;
  ASSERT_EQ(dropped_again.status, 0) << dropped_again.output;
  EXPECT_EQ(step_losses(dropped_again.output), step_losses(dropped.output));
  EXPECT_FALSE(step_losses(dropped.output).empty()) << dropped.output;
  EXPECT_EQ(tandem::test::final_validation_loss(dropped_again.output),
            tandem::test::final_validation_loss(dropped.output));
  auto bigram_run = run_tandem("train --model bigram --data " + corpus.string() + " --steps 2 --device cpu --recompute full");
  EXPECT_NE(bigram_run.status, 0);
  EXPECT_TRUE(contains(bigram_run.output, "--recompute")) << bigram_run.output;
  fs::remove_all(dir);
}

// --offload optimizer: the host's AdamW gives the run on the device's, on one rank and on two Gloo ranks under each
// --shard stage (bf16 master weights too); a run stopped with offload resumes without it (and the other way) in the
// uninterrupted run's bits; the help names the flag.
TEST(LmTrainCli, OffloadedOptimizerTrainsAndResumesAsTheDevicesDoes) {
  const fs::path dir = temp_dir("offload"), corpus = make_corpus(dir);
  const std::string run = "train --model llama --kv-heads 2 --layers 2 --heads 4 --width 32 --context 32 --data " +
                          corpus.string() + " --steps 8 --batch-size 4 --device cpu --eval-every 0 --eval-steps 2 "
                          "--log-every 2 --clip-norm 0.5 ";
  for (const std::string extra : {"", "--master-weights bf16 "}) {
    auto plain = run_tandem(run + extra), off = run_tandem(run + extra + "--offload optimizer");
    ASSERT_EQ(plain.status, 0) << plain.output;
    ASSERT_EQ(off.status, 0) << off.output;
    ASSERT_EQ(step_losses(plain.output).size(), 4u) << plain.output;
    EXPECT_EQ(step_losses(off.output), step_losses(plain.output)) << extra;
    EXPECT_EQ(tandem::test::final_validation_loss(off.output), tandem::test::final_validation_loss(plain.output));
  }
  if (TANDEM_TEST_WITH_GLOO) {
    auto launch2 = [&](const std::string& args) { return run_tandem("launch -n 2 -- " + kBin + " " + args); };
    for (const std::string shard : {"optimizer", "gradients", "parameters"}) {
      auto plain = launch2(run + "--shard " + shard), off = launch2(run + "--shard " + shard + " --offload optimizer");
      ASSERT_EQ(plain.status, 0) << plain.output;
      ASSERT_EQ(off.status, 0) << off.output;
      EXPECT_FALSE(step_losses(plain.output).empty()) << plain.output;
      EXPECT_EQ(step_losses(off.output), step_losses(plain.output)) << "--shard " << shard;
      EXPECT_EQ(tandem::test::final_validation_loss(off.output), tandem::test::final_validation_loss(plain.output))
          << "--shard " << shard;
    }
    // Stopped with offload, resumed without it, and the other way: the uninterrupted run's checkpoint.
    const std::string whole = (dir / "whole.ck").string();
    auto a = launch2(run + "--shard optimizer --checkpoint " + whole);
    ASSERT_EQ(a.status, 0) << a.output;
    for (const bool first_offloaded : {true, false}) {
      const std::string parted = (dir / (first_offloaded ? "on_off.ck" : "off_on.ck")).string();
      const std::string on = " --offload optimizer", off = "";
      auto b1 = launch2(run + "--shard optimizer --stop-at 4 --checkpoint " + parted + (first_offloaded ? on : off));
      ASSERT_EQ(b1.status, 0) << b1.output;
      auto b2 = launch2(run + "--shard optimizer --resume --checkpoint " + parted + (first_offloaded ? off : on));
      ASSERT_EQ(b2.status, 0) << b2.output;
      EXPECT_FALSE(contains(b2.output, "start afresh")) << b2.output;
      tandem::test::expect_same_tensors(whole, parted, "the checkpoint");
    }
  }
  auto help = run_tandem("train --help");
  EXPECT_TRUE(contains(help.output, "--offload")) << help.output;
  fs::remove_all(dir);
}

// --offload parameters: stage 3's slices kept on the host (the values the host's step writes), each layer group's
// copied to the device as its gather starts: the run of --offload optimizer --shard parameters, bit for bit, on one
// rank and on two Gloo ranks; stopped with it and resumed without offload, the uninterrupted run's checkpoint; other
// stages and master weights refused, naming the flags.
TEST(LmTrainCli, OffloadedParametersTrainAsStage3Does) {
  const fs::path dir = temp_dir("offload_params"), corpus = make_corpus(dir);
  const std::string run = "train --model llama --kv-heads 2 --layers 2 --heads 4 --width 32 --context 32 --data " +
                          corpus.string() + " --steps 8 --batch-size 4 --device cpu --eval-every 0 --eval-steps 2 "
                          "--log-every 2 --clip-norm 0.5 ";
  auto stage3 = run_tandem(run + "--offload optimizer --shard parameters"), off = run_tandem(run + "--offload parameters");
  ASSERT_EQ(stage3.status, 0) << stage3.output;
  ASSERT_EQ(off.status, 0) << off.output;
  ASSERT_EQ(step_losses(off.output).size(), 4u) << off.output;
  EXPECT_EQ(step_losses(off.output), step_losses(stage3.output));
  EXPECT_TRUE(contains(off.output, "--offload parameters on the CPU: the host is the device")) << off.output;
  EXPECT_EQ(tandem::test::final_validation_loss(off.output), tandem::test::final_validation_loss(stage3.output));
  if (TANDEM_TEST_WITH_GLOO) {
    auto launch2 = [&](const std::string& args) { return run_tandem("launch -n 2 -- " + kBin + " " + args); };
    const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
    auto a = launch2(run + "--shard parameters --checkpoint " + whole);
    auto b = launch2(run + "--offload parameters --checkpoint " + (dir / "b.ck").string());
    ASSERT_EQ(a.status, 0) << a.output;
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_EQ(step_losses(b.output), step_losses(a.output));
    tandem::test::expect_same_tensors(whole, (dir / "b.ck").string(), "--offload parameters on 2 ranks");
    auto c1 = launch2(run + "--offload parameters --stop-at 4 --checkpoint " + parted);
    ASSERT_EQ(c1.status, 0) << c1.output;
    auto c2 = launch2(run + "--shard parameters --resume --checkpoint " + parted);
    ASSERT_EQ(c2.status, 0) << c2.output;
    EXPECT_FALSE(contains(c2.output, "start afresh")) << c2.output;
    tandem::test::expect_same_tensors(whole, parted, "stopped with --offload parameters, resumed without");
  }
  auto stage1 = run_tandem(run + "--offload parameters --shard optimizer");
  EXPECT_EQ(stage1.status, 2) << stage1.output;
  EXPECT_TRUE(contains(stage1.output, "it takes --shard parameters")) << stage1.output;
  auto masters = run_tandem(run + "--offload parameters --master-weights bf16");
  EXPECT_NE(masters.status, 0) << masters.output;
  EXPECT_TRUE(contains(masters.output, "master weights")) << masters.output;
  fs::remove_all(dir);
}
