// `tandem train` end to end: a short real training run, the guide's output format, and the exit
// status and message for bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "e2e/cli_util.h"
#include "text_util.h"

namespace fs = std::filesystem;
using tandem::test::contains;
using tandem::test::count_lines_with;
using tandem::test::have_fashion_mnist;
using tandem::test::kFashionDir;
using tandem::test::run_tandem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_e2e_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

double last_value(const std::string& out, const std::string& label) {
  std::regex re(label + " = ([0-9.]+)");
  double v = -1;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v = std::stod((*it)[1]);
  return v;
}

}  // namespace

TEST(TrainCli, OneEpochOnASubsetLearnsWellAboveChance) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  fs::path dir = temp_dir("train");
  fs::path metrics = dir / "m.jsonl";
  auto r = run_tandem("train --model cnn --dataset fashion-mnist --epochs 2 --batch-size 64 --lr 0.005 "
                      "--momentum 0.9 --weight-decay 1e-5 --limit-train 12800 --limit-test 2000 --progress off "
                      "--metrics " + metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  // The guide's three lines per epoch, in order.
  std::regex epoch_block(
      "Starting Epoch 1:\nTraining loss = [0-9]+\\.[0-9]{6}, training accuracy = 0\\.[0-9]{6}\n"
      "Evaluation accuracy = 0\\.[0-9]{6}, Elapsed Time = [0-9]+\\.[0-9]{6}s\n");
  EXPECT_TRUE(std::regex_search(r.output, epoch_block)) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "Starting Epoch"), 2);
  double eval = last_value(r.output, "Evaluation accuracy");
  double train = last_value(r.output, "training accuracy");
  EXPECT_GT(eval, 0.6) << "ten classes: chance is 0.1\n" << r.output;
  EXPECT_GT(train, 0.5) << r.output;
  // Loss: the sum of per-batch mean losses, 200 batches at well under log(10) each after an epoch.
  double loss = last_value(r.output, "Training loss");
  EXPECT_GT(loss, 10.0);
  EXPECT_LT(loss, 200 * 2.31);
  std::ifstream m(metrics);
  std::string line;
  int lines = 0;
  while (std::getline(m, line)) {
    ++lines;
    EXPECT_NE(line.find("\"eval_acc\""), std::string::npos) << line;
  }
  EXPECT_EQ(lines, 2);
  fs::remove_all(dir);
}

TEST(TrainCli, HelpListsTheGuideFlags) {
  auto r = run_tandem("train --help");
  ASSERT_EQ(r.status, 0);
  for (const char* flag : {"--epochs", "-m", "--batch-size", "-b", "--lr", "-l", "--device", "--metrics", "--seed",
                           "--dist-option", "--spars"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

TEST(TrainCli, UnknownFlagExitsWithStatus2) {
  auto r = run_tandem("train --no-such-flag");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

// A misspelt option or command is named with the nearest one, not CLI11's "The following arguments were not
// expected"; every message starts with "tandem: error:".
TEST(TrainCli, MisspeltOptionsAndCommandsAreNamedWithTheNearest) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"train --epoch 1", "tandem: error: unknown option --epoch; did you mean --epochs?"},
      {"trian --epochs 1", "tandem: error: unknown command 'trian'; did you mean 'train'?"},
      {"data txt a.txt -o out", "tandem: error: unknown command 'txt'; did you mean 'text'?"},
      {"bench allreduce --iter 3", "tandem: error: unknown option --iter; did you mean --iters?"},
      {"", "tandem: error: give a command: tandem COMMAND, where COMMAND is one of train, launch"},
      {"train --epochs 0", "tandem: error: --epochs"},
      {"data text", "tandem: error: "},
  };
  for (const Case& c : cases) {
    auto r = run_tandem(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind(c.message, 0), 0u) << c.args << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "were not expected")) << r.output;
    EXPECT_FALSE(contains(r.output, "A subcommand is required")) << r.output;
  }
}

// Flags that would do nothing for the model or optimizer chosen are refused (or, for the synchronisation
// options a -d method ignores, warned about).
TEST(TrainCli, FlagsThatDoNothingForTheModelAreRefused) {
  auto r = run_tandem("train --model cnn --hidden 64 --epochs 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--hidden sets the hidden layers of --model mlp; --model cnn has none")) << r.output;
  r = run_tandem("train --model mlp --beta2 0.9 --epochs 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--beta2 sets adam and adamw; --optimizer sgd has none")) << r.output;
  r = run_tandem("train --model mlp --optimizer adam --momentum 0.5 --epochs 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--momentum sets sgd; --optimizer adam has none")) << r.output;
  r = run_tandem("bench train --model cnn --hidden 8 -b 4 --steps 1 --warmup 0");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--hidden sets the hidden layers of --model mlp")) << r.output;
  r = run_tandem("bench train --model mlp --hidden 8 -b 4 --steps 1 --warmup 0 --threads 1 -s 0.1 --half-dtype bf16");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "tandem: warning: -d plain ignores -s/--spars (sparseTopK, sparseThreshold), "
                                 "--half-dtype (half)")) << r.output;
}

// The training run's first line comes before its first epoch's, also through tandem launch, which passes a
// rank's stdout and stderr on in the order they were written.
TEST(TrainCli, TheHeaderComesBeforeTheFirstEpoch) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  const std::string train = " train --model mlp --hidden 16 --epochs 1 --limit-train 256 --limit-test 64 --threads 1 "
                            "--progress off";
  for (int attempt = 0; attempt < 3; ++attempt)
    for (const std::string& args : {train, "launch -n 1 -- " + std::string(TANDEM_BIN) + train}) {
      auto r = run_tandem(args);
      ASSERT_EQ(r.status, 0) << r.output;
      const size_t header = r.output.find("tandem: mlp ("), epoch = r.output.find("Starting Epoch 0:");
      ASSERT_NE(header, std::string::npos) << r.output;
      ASSERT_NE(epoch, std::string::npos) << r.output;
      EXPECT_LT(header, epoch) << args << "\n" << r.output;
    }
}

TEST(TrainCli, InvalidValuesExitWithStatus2) {
  for (const char* args : {"train --model resnet9000", "train --epochs 0", "train --batch-size -3",
                           "train --lr abc", "train --dataset imagenet", "train -d sparse-everything"}) {
    auto r = run_tandem(std::string(args) + " --limit-train 64 --limit-test 64");
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
  }
}

TEST(TrainCli, MissingDataDirectoryIsNamed) {
  auto r = run_tandem("train --data-dir /nonexistent/tandem-data --epochs 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/tandem-data"), std::string::npos) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "\n"), 1) << "one line:\n" << r.output;
}

TEST(TrainCli, CorruptDataFileIsNamed) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  fs::path dir = temp_dir("corrupt");
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(fs::path(kFashionDir) / f, dir / f);
  {
    std::ofstream bad(dir / "train-images-idx3-ubyte", std::ios::binary);
    bad << "this is not an IDX file";
  }
  auto r = run_tandem("train --data-dir " + dir.string() + " --epochs 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("train-images-idx3-ubyte"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(TrainCli, TruncatedDataFileIsNamed) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  fs::path dir = temp_dir("truncated");
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"})
    fs::copy_file(fs::path(kFashionDir) / f, dir / f);
  {
    std::ifstream in(fs::path(kFashionDir) / "t10k-labels-idx1-ubyte.gz", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(dir / "t10k-labels-idx1-ubyte.gz", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  auto r = run_tandem("train --data-dir " + dir.string() + " --epochs 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("t10k-labels-idx1-ubyte"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(TrainCli, MissingGpuIsAnInputError) {
  auto r = run_tandem("train --device cuda:7 --epochs 1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cuda:7"), std::string::npos) << r.output;
  // Where there is no GPU at all, every command that wants one says how to run on the CPU.
  if (contains(run_tandem("info").output, "gpus: 0")) {
    for (const std::string& args : {std::string("train --device cuda --epochs 1"),
                                    std::string("bench train --device cuda --steps 1"),
                                    std::string("bench allreduce --device cuda"),
                                    "launch -n 1 -- " + std::string(TANDEM_BIN) + " train --device cuda"}) {
      auto g = run_tandem(args);
      EXPECT_EQ(g.status, 2) << args << "\n" << g.output;
      EXPECT_TRUE(contains(g.output, "--device cpu")) << args << "\n" << g.output;
    }
  }
  auto bad = run_tandem("train --device tpu --epochs 1");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("tpu"), std::string::npos) << bad.output;
}

TEST(TrainCli, ARepeatedFlagTakesItsLastValue) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  auto r = run_tandem("train --epochs 10 --limit-train 256 --limit-test 64 --progress off --epochs 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "Starting Epoch"), 1) << r.output;
}

// Batch-norm statistics legitimately differ between ranks during an epoch (each sees its own
// samples); the per-step consistency check compares parameters, and the end-of-epoch check, after
// the statistics are averaged, compares everything.
TEST(TrainCli, BatchNormModelPassesConsistencyChecksOnTwoRanks) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  std::string bin = TANDEM_BIN;
  auto r = run_tandem("launch -n 2 -- " + bin +
                      " train --model resnet18 --epochs 1 --limit-train 128 --limit-test 64 --batch-size 32 "
                      "--threads 1 --check-consistency 1 --progress off");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "Evaluation accuracy"), 1) << r.output;
}

// Ranks started with different settings stop at once, naming the setting and the ranks, instead of
// failing inside a collective (a different batch size) or hanging until the timeout (another method);
// a different seed is only warned about.
TEST(TrainCli, RanksStartedDifferentlyStopNamingTheSetting) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  const std::string bin = TANDEM_BIN;
  const std::string common = " train --epochs 1 --limit-train 128 --limit-test 64 --threads 1 --progress off --timeout 60";
  auto per_rank = [&](const std::string& flag_of_rank) {  // flag_of_rank: shell text using $TANDEM_RANK
    return run_tandem("launch -n 2 -- sh -c '" + bin + common + " " + flag_of_rank + "'");
  };
  auto batch = per_rank("--batch-size $((32 + 32 * TANDEM_RANK))");
  EXPECT_EQ(batch.status, 2) << batch.output;
  EXPECT_NE(batch.output.find("--batch-size"), std::string::npos) << batch.output;
  EXPECT_EQ(batch.output.find("Starting Epoch"), std::string::npos) << batch.output;
  auto method = per_rank("-d $([ $TANDEM_RANK = 0 ] && echo plain || echo half)");
  EXPECT_EQ(method.status, 2) << method.output;
  EXPECT_NE(method.output.find("-d/--dist-option"), std::string::npos) << method.output;
  auto seed = per_rank("--seed $TANDEM_RANK");
  EXPECT_EQ(seed.status, 0) << seed.output;
  EXPECT_NE(seed.output.find("--seed"), std::string::npos) << seed.output;
  // Settings that used to fail inside a collective (the first bucket's size) or let the replicas drift
  // apart silently (the optimizer's) stop every rank too, named.
  const std::pair<const char*, const char*> settings[] = {
      {"--first-bucket-mb $((1 + TANDEM_RANK))", "--first-bucket-mb"},
      {"$([ $TANDEM_RANK = 0 ] && echo --nesterov)", "--nesterov"},
      {"--lr 0.0$((1 + TANDEM_RANK))", "--lr"},
      {"--momentum 0.$((5 + TANDEM_RANK))", "--momentum"},
      {"--weight-decay 0.00$((1 + TANDEM_RANK))", "--weight-decay"},
      {"--check-consistency $TANDEM_RANK", "--check-consistency"},
      {"$([ $TANDEM_RANK = 0 ] && echo --master-weights bf16)", "--master-weights"}};
  for (const auto& [flag, name] : settings) {
    auto r = per_rank(flag);
    EXPECT_EQ(r.status, 2) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string("the ranks were started with different ") + name + ":"), std::string::npos)
        << flag << "\n" << r.output;
    EXPECT_EQ(r.output.find("Starting Epoch"), std::string::npos) << r.output;
  }
  // Asked for, per-rank learning rates are only warned about.
  auto lr = per_rank("--per-rank-optimizer-settings --lr 0.0$((1 + TANDEM_RANK))");
  EXPECT_EQ(lr.status, 0) << lr.output;
  EXPECT_NE(lr.output.find("warning: the ranks were started with different --lr"), std::string::npos) << lr.output;
}

TEST(TrainCli, TheEvaluationBatchChangesNeitherTrainingNorAccuracy) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  // 300 test samples: 7 batches of 43 and one of 1 against the default 4 x 32 = 128 (2 batches and 44).
  std::string common =
      " --epochs 1 --batch-size 32 --lr 0.01 --momentum 0.9 --limit-train 640 --limit-test 300 --progress off --seed 4";
  auto def = run_tandem("train" + common);
  ASSERT_EQ(def.status, 0) << def.output;
  auto small = run_tandem("train --eval-batch-size 43" + common);
  ASSERT_EQ(small.status, 0) << small.output;
  EXPECT_EQ(last_value(small.output, "Training loss"), last_value(def.output, "Training loss"));
  const double a = last_value(def.output, "Evaluation accuracy"), b = last_value(small.output, "Evaluation accuracy");
  EXPECT_GT(a, 0.3) << def.output;
  EXPECT_NEAR(a, b, 1.0 / 300) << def.output << small.output;  // at most one near-tie decided differently
  auto bad = run_tandem("train --eval-batch-size 0" + common);
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("--eval-batch-size"), std::string::npos) << bad.output;
}

// The data set kept in the device's memory (here the CPU's: each batch gathered by the step through
// the loader's deferred fill, also under --accumulate) trains on the same batches as the host loader.
TEST(TrainCli, DataOnTheDeviceTrainsOnTheSameBatches) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  std::string common = " --epochs 2 --batch-size 32 --lr 0.01 --momentum 0.9 --limit-train 650 --limit-test 100 "
                       "--progress off --seed 4 --threads 1";
  for (const char* extra : {"", " --accumulate 2"}) {
    auto host = run_tandem(std::string("train --data-on-device off") + extra + common);
    auto kept = run_tandem(std::string("train --data-on-device on") + extra + common);
    ASSERT_EQ(host.status, 0) << host.output;
    ASSERT_EQ(kept.status, 0) << kept.output;
    EXPECT_EQ(last_value(kept.output, "Training loss"), last_value(host.output, "Training loss")) << extra;
    EXPECT_EQ(last_value(kept.output, "Evaluation accuracy"), last_value(host.output, "Evaluation accuracy")) << extra;
    EXPECT_GT(last_value(kept.output, "Evaluation accuracy"), 0.2) << kept.output;
  }
}

TEST(TrainCli, ResumingFromACheckpointMatchesAnUninterruptedRun) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  fs::path dir = temp_dir("resume");
  std::string common = " --limit-train 640 --limit-test 128 --progress off --seed 4";
  auto whole = run_tandem("train --epochs 3" + common);
  ASSERT_EQ(whole.status, 0) << whole.output;
  std::string ck = (dir / "ck.bin").string();
  auto first = run_tandem("train --epochs 2 --checkpoint " + ck + common);
  ASSERT_EQ(first.status, 0) << first.output;
  auto rest = run_tandem("train --epochs 3 --resume --checkpoint " + ck + common);
  ASSERT_EQ(rest.status, 0) << rest.output;
  EXPECT_EQ(count_lines_with(rest.output, "Starting Epoch"), 1) << rest.output;
  EXPECT_EQ(last_value(rest.output, "Training loss"), last_value(whole.output, "Training loss"));
  EXPECT_EQ(last_value(rest.output, "Evaluation accuracy"), last_value(whole.output, "Evaluation accuracy"));
  auto other = run_tandem("train --epochs 3 --resume --model mlp --checkpoint " + ck + common);
  EXPECT_EQ(other.status, 2) << other.output;
  EXPECT_NE(other.output.find("--model"), std::string::npos) << other.output;
  fs::remove_all(dir);
}
