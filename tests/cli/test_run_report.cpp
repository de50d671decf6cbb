// The end-of-run summary, the stamped metrics lines and the progress bar's text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "cli/progress.h"
#include "cli/run_report.h"
#include "tandem/error.h"

namespace fs = std::filesystem;
using namespace tandem::cli;

TEST(RunSummary, FinalBestRateAndBytes) {
  RunSummary s;
  s.add({.epoch = 0, .eval_acc = 0.80, .train_s = 10.0, .train_samples = 60000, .bytes_per_step = 2e6});
  s.add({.epoch = 1, .eval_acc = 0.90, .train_s = 10.0, .train_samples = 60000, .bytes_per_step = 2e6});
  s.add({.epoch = 2, .eval_acc = 0.85, .train_s = 20.0, .train_samples = 60000, .bytes_per_step = 1e6});
  // 180,000 samples in 40 s of training; (2 + 2 + 1) / 3 MB per step.
  EXPECT_EQ(s.line(45.04),
            "done: 3 epochs in 45.0 s; final accuracy 0.8500, best 0.9000 (epoch 1); 4,500 images/s; 1.667 MB sent per step");
  EXPECT_EQ(RunSummary().line(0.2), "done: no epoch to train, 0.2 s");
}

TEST(Metrics, LinesCarryRunIdAndTimestamps) {
  fs::path p = fs::temp_directory_path() / ("tandem_metrics_" + std::to_string(getpid()) + ".jsonl");
  fs::remove(p);
  std::string a = new_run_id(), b = new_run_id();
  EXPECT_TRUE(std::regex_match(a, std::regex("[0-9a-f]{16}"))) << a;
  EXPECT_NE(a, b);
  {
    MetricsFile m1(p.string(), a);
    m1.write({{"epoch", 0}});
  }
  {
    MetricsFile m2(p.string(), b);  // a second run appends, told apart by its id
    m2.write({{"epoch", 0}});
  }
  std::ifstream f(p);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(f, line)) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["run_id"], a);
  EXPECT_EQ(lines[1]["run_id"], b);
  EXPECT_TRUE(std::regex_match(lines[0]["time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));
  EXPECT_GT(lines[1]["unix_time"].get<double>(), 1.7e9);
  fs::remove(p);
}

TEST(Metrics, ALinkAtThePathIsRefusedNotFollowed) {
  fs::path dir = fs::temp_directory_path() / ("tandem_metrics_link_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "victim") << "not yours\n";
  fs::create_symlink(dir / "victim", dir / "m.jsonl");
  try {
    MetricsFile m((dir / "m.jsonl").string(), new_run_id());
    m.write({{"epoch", 0}});
    ADD_FAILURE() << "a metrics path that is a symbolic link was written through";
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.kind(), tandem::Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find((dir / "m.jsonl").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
  std::ifstream f(dir / "victim");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()), "not yours\n");
  fs::remove_all(dir);
}

TEST(Progress, BarShowsRateAndTimeLeft) {
  ProgressBar bar(false, 100, "epoch 0");
  // 25 of 100 steps in 10 s: 30 s left; 1,600 samples in 10 s.
  EXPECT_EQ(bar.render(25, 1600, 10.0), "epoch 0 [=======>                      ] 25/100  160 samples/s  eta 0:30 ");
  EXPECT_EQ(bar.render(100, 6400, 40.0).find("eta"), std::string::npos);
  EXPECT_EQ(format_duration(3725), "1:02:05");
}
