// What a run leaves behind and the commands that use it: checkpoints (damaged, finished, unwritable),
// eval, plot, stamped metrics and the summary line; data files that are not files; bench allreduce and bench train;
// outputs that meet a planted symbolic link or name their own input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "e2e/cli_util.h"
#include "tandem/checkpoint.h"
#include "tandem/nn/models.h"

namespace fs = std::filesystem;
using tandem::test::have_fashion_mnist;
using tandem::test::run_tandem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_out_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string contents(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A small mlp's checkpoint at p, written through the library (no data set needed).
void save_small_checkpoint(const fs::path& p) {
  tandem::nn::ModelConfig c;
  c.hidden = {8};
  tandem::save_checkpoint(p.string(), *tandem::nn::make_model("mlp", c), nullptr, R"({"model":"mlp"})");
}

const std::string kSmall = " --model mlp --hidden 16 --limit-train 256 --limit-test 128 --threads 1 --progress off";

}  // namespace

TEST(OutputsCli, CheckpointEvalResumeAndDamage) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  fs::path dir = temp_dir("ckpt");
  const std::string ck = (dir / "model.ckpt").string(), metrics = (dir / "m.jsonl").string();
  auto run = run_tandem("train --epochs 2 --checkpoint " + ck + " --metrics " + metrics + kSmall);
  ASSERT_EQ(run.status, 0) << run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.output, m, std::regex(R"(Evaluation accuracy = ([0-9.]+), Elapsed[^\n]*\n[^\n]*done: 2 epochs)")))
      << "no summary line after the last epoch:\n" << run.output;
  const std::string final_acc = m[1];
  EXPECT_NE(run.output.find("final accuracy " + final_acc.substr(0, 6)), std::string::npos) << run.output;

  // eval gives the accuracy the run printed for its last epoch.
  auto eval = run_tandem("eval --checkpoint " + ck + " --limit-test 128");
  ASSERT_EQ(eval.status, 0) << eval.output;
  EXPECT_NE(eval.output.find("Evaluation accuracy = " + final_acc), std::string::npos) << eval.output;

  // Resuming a finished run trains nothing and succeeds; a changed seed is stated.
  auto again = run_tandem("train --epochs 2 --resume --checkpoint " + ck + kSmall);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("finished run"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("Starting Epoch"), std::string::npos) << again.output;
  auto more = run_tandem("train --epochs 3 --seed 9 --resume --checkpoint " + ck + " --metrics " + metrics + kSmall);
  EXPECT_EQ(more.status, 0) << more.output;
  EXPECT_NE(more.output.find("--seed 0, resuming with --seed 9"), std::string::npos) << more.output;

  // A flipped byte in the tensors: refused with status 2, and the file is left as it was.
  {
    std::fstream f(ck, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c = static_cast<char>(f.get() ^ 0x40);
    f.seekp(-3, std::ios::end);
    f.put(c);
  }
  auto size_before = fs::file_size(ck);
  auto damaged = run_tandem("train --epochs 5 --resume --checkpoint " + ck + kSmall);
  EXPECT_EQ(damaged.status, 2) << damaged.output;
  EXPECT_NE(damaged.output.find("is damaged"), std::string::npos) << damaged.output;
  EXPECT_EQ(fs::file_size(ck), size_before);
  EXPECT_EQ(run_tandem("eval --checkpoint " + ck).status, 2);

  // Two runs appended to one metrics file: each line names its run.
  std::ifstream in(metrics);
  std::set<std::string> ids;
  for (std::string line; std::getline(in, line);) {
    std::smatch id;
    ASSERT_TRUE(std::regex_search(line, id, std::regex(R"re("run_id":"([0-9a-f]{16})")re"))) << line;
    EXPECT_NE(line.find("\"time\":\""), std::string::npos) << line;
    ids.insert(id[1]);
  }
  EXPECT_EQ(ids.size(), 2u);
  fs::remove_all(dir);
}

TEST(OutputsCli, CheckpointDirectoryIsCheckedBeforeTraining) {
  auto r = run_tandem("train --epochs 1 --checkpoint /nonexistent-dir/ck.bin" + kSmall);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Starting Epoch"), std::string::npos) << r.output;
}

TEST(OutputsCli, FifoInPlaceOfADataFileIsRefused) {
  fs::path dir = temp_dir("fifo");
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"})
    ASSERT_EQ(mkfifo((dir / f).c_str(), 0600), 0);
  auto r = run_tandem("train --dataset mnist --data-dir " + dir.string() + kSmall);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("not a regular file"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(OutputsCli, PlotDrawsAPngOrSaysWhatIsMissing) {
  fs::path dir = temp_dir("plot");
  const fs::path metrics = dir / "m.jsonl", png = dir / "curves.png";
  std::ofstream(metrics) << R"({"epoch":0,"train_loss":9.5,"train_acc":0.5,"eval_acc":0.6,"run_id":"a"})" "\n"
                         << R"({"epoch":1,"train_loss":5.5,"train_acc":0.7,"eval_acc":0.75,"run_id":"a"})" "\n";
  auto r = run_tandem("plot " + metrics.string() + " -o " + png.string());
  if (r.status == 2 && r.output.find("gnuplot") != std::string::npos) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(png, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  EXPECT_EQ(run_tandem("plot " + (dir / "absent.jsonl").string()).status, 2);
  fs::remove_all(dir);
}

TEST(OutputsCli, BenchAllReduceRunsOnTheCpuWithNcclTestsFlags) {
  auto r = run_tandem("bench allreduce -b 1K -e 16K -f 4 -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(tandem::test::count_lines_with(r.output, " ok"), 3) << r.output;  // 1K, 4K, 16K
  // One rank exchanges nothing: no time or bandwidth is printed for it, and it says how to run two.
  EXPECT_NE(r.output.find("single rank: an all-reduce of one rank moves no data"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tandem launch -n 2 -- tandem bench allreduce"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("algbw(GB/s)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(" 0.0 "), std::string::npos) << r.output;
  if (!TANDEM_TEST_WITH_GLOO) return;
  // Two ranks measure, in the units the header names.
  r = run_tandem(std::string("launch -n 2 -- ") + TANDEM_BIN + " bench allreduce -b 1K -e 4K -f 4 -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("time(us)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("busbw(GB/s)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("moves no data"), std::string::npos) << r.output;
  EXPECT_EQ(tandem::test::count_lines_with(r.output, " ok"), 2) << r.output;
}

// bench train takes train's synchronisation options: two CPU ranks, plain against powerSGD of rank 1.
TEST(OutputsCli, BenchTrainTakesTheSynchronisationOptions) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  auto bytes_sent = [](const std::string& flags) {
    auto r = run_tandem(std::string("launch -n 2 -- ") + TANDEM_BIN +
                        " bench train --model mlp --hidden 64 -b 16 --steps 3 --warmup 1 --threads 1 " + flags);
    EXPECT_EQ(r.status, 0) << r.output;
    const size_t at = r.output.find("RESULT {");
    if (at == std::string::npos) {
      ADD_FAILURE() << "no RESULT line: " << r.output;
      return std::make_pair(-1.0, std::string());
    }
    auto j = nlohmann::json::parse(r.output.substr(at + 7, r.output.find('\n', at) - at - 7));
    EXPECT_EQ(j["world"], 2) << r.output;
    EXPECT_TRUE(j["params_changed"].get<bool>()) << r.output;
    return std::make_pair(j["bytes_sent_per_step"].get<double>(), j["dist_option"].get<std::string>());
  };
  const auto plain = bytes_sent("-d plain");
  const auto low_rank = bytes_sent("-d powerSGD --rank 1 --no-error-feedback --bucket-mb 0.01");
  EXPECT_EQ(plain.second, "plain");
  EXPECT_EQ(low_rank.second, "powerSGD");
  EXPECT_GT(low_rank.first, 0.0);
  // 784 x 64 and 64 x 10 gradients sent as rank-1 factors: a small fraction of plain's bytes.
  EXPECT_LT(low_rank.first, plain.first / 4) << plain.first;
  auto misplaced = run_tandem("bench train --model mlp --hidden 8 -b 4 --steps 1 --warmup 0 --rank 2");
  EXPECT_EQ(misplaced.status, 2) << misplaced.output;
  EXPECT_NE(misplaced.output.find("--rank"), std::string::npos) << misplaced.output;
}

// bench train's RESULT says what each rank keeps: with SGD's momentum on 2 ranks, 4 bytes a parameter
// each of parameters, gradients and momentum unsharded; half the momentum under --shard optimizer,
// half the gradients too under --shard gradients; and the same bytes sent (up to the padding of the
// buckets to whole blocks).
TEST(OutputsCli, BenchTrainReportsTheStateEachRankKeeps) {
  if (!TANDEM_TEST_WITH_GLOO) GTEST_SKIP() << "tandem was built without Gloo";
  double plain_bytes = 0;
  for (const char* shard : {"none", "optimizer", "gradients"}) {
    auto r = run_tandem(std::string("launch -n 2 -- ") + TANDEM_BIN +
                        " bench train --model mlp --hidden 64 -b 16 --steps 3 --warmup 1 --threads 1 --shard " + shard);
    ASSERT_EQ(r.status, 0) << r.output;
    const size_t at = r.output.find("RESULT {");
    ASSERT_NE(at, std::string::npos) << r.output;
    auto j = nlohmann::json::parse(r.output.substr(at + 7, r.output.find('\n', at) - at - 7));
    EXPECT_EQ(j["shard"], shard);
    const double psi = j["parameters"].get<double>();
    const auto& m = j["state_bytes_per_rank"];
    const bool grads_split = std::string(shard) == "gradients", state_split = std::string(shard) != "none";
    // Padding: fewer than 2 values a bucket.
    EXPECT_NEAR(m["parameters"].get<double>(), 4 * psi, 64) << r.output;
    EXPECT_NEAR(m["gradients"].get<double>(), grads_split ? 2 * psi : 4 * psi, 64) << r.output;
    EXPECT_NEAR(m["optimizer_state"].get<double>(), state_split ? 2 * psi : 4 * psi, 64) << r.output;
    EXPECT_EQ(m["master_weights"].get<double>(), 0.0);
    EXPECT_EQ(m["total"].get<double>(), m["parameters"].get<double>() + m["gradients"].get<double>() +
                                            m["optimizer_state"].get<double>());
    const double sent = j["bytes_sent_per_step"].get<double>();
    if (plain_bytes == 0) plain_bytes = sent;
    EXPECT_NEAR(sent, plain_bytes, 64) << "--shard " << shard;
  }
}

TEST(OutputsCli, ExportDoesNotWriteThroughALinkBesideItsOutput) {
  fs::path dir = temp_dir("export_link");
  save_small_checkpoint(dir / "m.ck");
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", dir / "m.safetensors.partial");
  fs::create_symlink(dir / "victim", dir / "linked.safetensors");
  for (const char* out : {"m.safetensors", "linked.safetensors"}) {
    auto r = run_tandem("export --checkpoint " + (dir / "m.ck").string() + " -o " + (dir / out).string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(contents(dir / "victim"), "not yours") << out;
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / out))) << out;
    const std::string st = contents(dir / out);
    ASSERT_GT(st.size(), 8u) << out;
    uint64_t len = 0;
    std::memcpy(&len, st.data(), 8);
    ASSERT_LE(8 + len, st.size()) << out;
    auto header = nlohmann::json::parse(st.substr(8, len));
    EXPECT_EQ(header["__metadata__"]["tandem.model"], "mlp") << header;
    // Every parameter of the checkpoint, under its own name, with its bytes.
    auto tensors = tandem::read_checkpoint_tensors((dir / "m.ck").string());
    ASSERT_FALSE(tensors.empty());
    for (auto& [name, t] : tensors) {
      const std::string key = name.substr(name.find('/') + 1);
      ASSERT_TRUE(header.contains(key)) << key << " missing from " << header;
      const uint64_t from = header[key]["data_offsets"][0], to = header[key]["data_offsets"][1];
      ASSERT_EQ(to - from, t.nbytes()) << key;
      ASSERT_LE(8 + len + to, st.size()) << key;
      EXPECT_EQ(std::memcmp(st.data() + 8 + len + from, t.data_ptr(), t.nbytes()), 0) << key;
    }
  }
  fs::remove_all(dir);
}

TEST(OutputsCli, ExportRefusesToOverwriteItsInput) {
  fs::path dir = temp_dir("export_self");
  const fs::path ck = dir / "m.ck";
  save_small_checkpoint(ck);
  const std::string before = contents(ck);
  fs::create_symlink(ck, dir / "soft.ck");
  fs::create_hard_link(ck, dir / "hard.ck");
  for (const fs::path& out : {ck, dir / "soft.ck", dir / "hard.ck", dir / "." / "m.ck"}) {
    auto r = run_tandem("export --checkpoint " + ck.string() + " -o " + out.string());
    EXPECT_EQ(r.status, 2) << out << ": " << r.output;
    EXPECT_NE(r.output.find("is the checkpoint"), std::string::npos) << r.output;
    EXPECT_EQ(contents(ck), before) << out;
  }
  EXPECT_TRUE(fs::is_symlink(dir / "soft.ck"));
  fs::remove_all(dir);
}

TEST(OutputsCli, TrainDoesNotWriteThroughPlantedLinks) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  fs::path dir = temp_dir("train_links");
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", dir / "ck.partial");
  auto ok = run_tandem("train --epochs 1 --checkpoint " + (dir / "ck").string() + kSmall);
  ASSERT_EQ(ok.status, 0) << ok.output;
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "ck")));
  EXPECT_EQ(run_tandem("eval --checkpoint " + (dir / "ck").string() + " --limit-test 64").status, 0);

  fs::create_symlink(dir / "victim", dir / "m.jsonl");
  auto refused = run_tandem("train --epochs 1 --metrics " + (dir / "m.jsonl").string() + kSmall);
  EXPECT_EQ(refused.status, 2) << refused.output;
  EXPECT_NE(refused.output.find("symbolic link"), std::string::npos) << refused.output;
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  fs::remove_all(dir);
}

TEST(OutputsCli, PlotReplacesALinkAtItsOutput) {
  fs::path dir = temp_dir("plot_link");
  const fs::path metrics = dir / "m.jsonl", png = dir / "curves.png";
  std::ofstream(metrics) << R"({"epoch":0,"train_loss":9.5,"train_acc":0.5,"eval_acc":0.6,"run_id":"a"})" "\n";
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", png);
  auto r = run_tandem("plot " + metrics.string() + " -o " + png.string());
  if (r.status == 2 && r.output.find("gnuplot") != std::string::npos) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(png)));
  EXPECT_EQ(contents(png).substr(1, 3), "PNG");
  fs::remove_all(dir);
}

TEST(OutputsCli, BenchJsonIsNotAppendedThroughALink) {
  fs::path dir = temp_dir("bench_link");
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", dir / "bench.jsonl");
  auto r = run_tandem("bench allreduce -b 1K -e 1K -n 1 -w 0 --json " + (dir / "bench.jsonl").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("symbolic link"), std::string::npos) << r.output;
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  fs::remove_all(dir);
}
