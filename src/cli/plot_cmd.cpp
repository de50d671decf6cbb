// `tandem plot`: loss and accuracy curves of a --metrics file as a PNG, drawn by gnuplot.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace {

struct PlotConfig {
  std::string metrics, output = "curves.png", run;
};

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && access((std::filesystem::path(dir) / program).c_str(), X_OK) == 0) return true;
  return false;
}

// gnuplot's single-quoted strings escape a quote by doubling it.
std::string gnuplot_string(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// The per-epoch lines of one run: the named one, else the file's last run.
std::vector<nlohmann::json> epochs_of_run(const PlotConfig& cfg, std::string& run) {
  std::ifstream in(cfg.metrics);
  TANDEM_CHECK(in.good(), "cannot read the metrics file '", cfg.metrics, "'");
  std::vector<nlohmann::json> lines;
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (text.empty()) continue;
    auto j = nlohmann::json::parse(text, nullptr, false);
    TANDEM_CHECK(!j.is_discarded() && j.is_object(), cfg.metrics, ":", n, ": not a JSON object (is this a --metrics file?)");
    if (!j.contains("epoch") || !j["epoch"].is_number() || !j.contains("eval_acc")) continue;
    lines.push_back(j);
  }
  TANDEM_CHECK(!lines.empty(), cfg.metrics, " holds no epoch lines (written by tandem train --metrics FILE)");
  auto id = [](const nlohmann::json& j) { return j.contains("run_id") ? j["run_id"].dump() : std::string("\"\""); };
  run = cfg.run.empty() ? id(lines.back()) : nlohmann::json(cfg.run).dump();
  std::vector<nlohmann::json> out;
  for (auto& j : lines)
    if (id(j) == run) out.push_back(j);
  TANDEM_CHECK(!out.empty(), cfg.metrics, " has no run with id ", run);
  return out;
}

int run_plot(const PlotConfig& cfg) {
  std::string run;
  auto epochs = epochs_of_run(cfg, run);
  TANDEM_CHECK(on_path("gnuplot"), "tandem plot draws with gnuplot, which is not installed: apt-get install gnuplot-nox");
  auto series = [&](const char* key) {
    std::string data;
    for (auto& j : epochs)
      if (j.contains(key) && j[key].is_number()) data += j["epoch"].dump() + " " + j[key].dump() + "\n";
    return data + "e\n";
  };
  const std::string shown = run.size() >= 2 ? run.substr(1, run.size() - 2) : run;  // without the JSON quotes
  std::string title = "tandem run " + shown;
  if (!epochs.back().value("model", std::string()).empty())
    title += ": " + epochs.back()["model"].get<std::string>() + " on " + epochs.back().value("dataset", std::string("?"));
  std::string script = "set terminal pngcairo size 1200,450 font ',10'\nset output " + gnuplot_string(cfg.output) + "\n" +
                       "set multiplot layout 1,2 title " + gnuplot_string(title) + "\nset xlabel 'epoch'\nset grid\n" +
                       (epochs.size() <= 20 ? "set xtics 1\n" : "") +
                       "set key bottom right\nset ylabel 'training loss (sum of batch means)'\n" +
                       "plot '-' with linespoints title 'training loss'\n" + series("train_loss") +
                       "set ylabel 'accuracy'\nset key bottom right\n" +
                       "plot '-' with linespoints title 'training', '-' with linespoints title 'evaluation'\n" +
                       series("train_acc") + series("eval_acc") + "unset multiplot\n";
  FILE* gp = popen("gnuplot", "w");
  TANDEM_RUNTIME_CHECK(gp != nullptr, "cannot start gnuplot");
  std::fwrite(script.data(), 1, script.size(), gp);
  int status = pclose(gp);
  TANDEM_RUNTIME_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                       "gnuplot failed to draw '", cfg.output, "' (is its directory writable?)");
  std::printf("wrote %s (%zu epochs of run %s)\n", cfg.output.c_str(), epochs.size(), shown.c_str());
  return 0;
}

}  // namespace

Runner add_plot_command(CLI::App& app) {
  auto cfg = std::make_shared<PlotConfig>();
  CLI::App* sub = app.add_subcommand("plot", "Draw loss and accuracy per epoch from a --metrics file (PNG, with gnuplot)");
  sub->add_option("metrics", cfg->metrics, "JSON-lines file written by tandem train --metrics")->required();
  sub->add_option("-o,--output", cfg->output, "PNG file to write")->capture_default_str();
  sub->add_option("--run", cfg->run, "Run id to draw (default: the file's last run)");
  return [cfg] { return run_plot(*cfg); };
}

}  // namespace tandem::cli
