// `tandem plot`: loss and accuracy curves of a --metrics file as a PNG, drawn by gnuplot.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/safe_file.h"
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

// A line of an image run (per epoch) or of a language model's (per reported step or evaluation).
bool epoch_line(const nlohmann::json& j) { return j.contains("epoch") && j["epoch"].is_number() && j.contains("eval_acc"); }
bool step_line(const nlohmann::json& j) {
  return j.contains("step") && j["step"].is_number() && (j.contains("loss") || j.contains("val_loss"));
}

// The lines of one run: the named one, else the file's last run.
std::vector<nlohmann::json> lines_of_run(const PlotConfig& cfg, std::string& run) {
  std::ifstream in(cfg.metrics);
  TANDEM_CHECK(in.good(), "cannot read the metrics file '", cfg.metrics, "'");
  std::vector<nlohmann::json> lines;
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (text.empty()) continue;
    auto j = nlohmann::json::parse(text, nullptr, false);
    TANDEM_CHECK(!j.is_discarded() && j.is_object(), cfg.metrics, ":", n, ": not a JSON object (is this a --metrics file?)");
    if (!epoch_line(j) && !step_line(j)) continue;
    lines.push_back(j);
  }
  TANDEM_CHECK(!lines.empty(), cfg.metrics, " holds no epoch or step lines (written by tandem train --metrics FILE)");
  auto id = [](const nlohmann::json& j) { return j.contains("run_id") ? j["run_id"].dump() : std::string("\"\""); };
  run = cfg.run.empty() ? id(lines.back()) : nlohmann::json(cfg.run).dump();
  std::vector<nlohmann::json> out;
  for (auto& j : lines)
    if (id(j) == run) out.push_back(j);
  TANDEM_CHECK(!out.empty(), cfg.metrics, " has no run with id ", run);
  return out;
}

// Feeds script to gnuplot, whose standard output (the PNG) is out_fd: gnuplot opens no file itself,
// so the picture lands in the file tandem created and nothing else.
void draw_with_gnuplot(const std::string& script, int out_fd, const std::string& output) {
  int in[2];
  TANDEM_RUNTIME_CHECK(pipe2(in, O_CLOEXEC) == 0, "cannot start gnuplot: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  // SIGPIPE is ignored below while the script is written; gnuplot gets the default back.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &pipe_only);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  char* argv[] = {const_cast<char*>("gnuplot"), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, "gnuplot", &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  if (rc != 0) ::close(in[1]);
  TANDEM_RUNTIME_CHECK(rc == 0, "cannot start gnuplot: ", std::strerror(rc));
  // A gnuplot that stops early must fail the plot, not kill tandem with SIGPIPE.
  struct sigaction ignore {}, before {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &before);
  for (size_t at = 0; at < script.size();) {
    ssize_t w = ::write(in[1], script.data() + at, script.size() - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;  // gnuplot's exit status says what went wrong
    at += static_cast<size_t>(w);
  }
  ::close(in[1]);
  sigaction(SIGPIPE, &before, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  TANDEM_RUNTIME_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gnuplot failed to draw '", output, "'");
}

// A language model's run: the training and validation loss, and the tokens per second, by step.
std::string step_script(const std::vector<nlohmann::json>& lines, const std::string& title) {
  auto series = [&](const char* key) {
    std::string data;
    for (auto& j : lines)
      if (j.contains(key) && j[key].is_number()) data += j["step"].dump() + " " + j[key].dump() + "\n";
    return data + "e\n";
  };
  return "set terminal pngcairo size 1200,450 font ',10'\n"
         "set multiplot layout 1,2 title " + gnuplot_string(title) + "\nset xlabel 'step'\nset grid\n" +
         "set key top right\nset ylabel 'loss (mean cross-entropy)'\n" +
         "plot '-' with lines title 'training', '-' with linespoints title 'validation'\n" + series("loss") +
         series("val_loss") + "set ylabel 'tokens/s'\nset key bottom right\n" +
         "plot '-' with lines title 'tokens/s'\n" + series("tokens_per_s") + "unset multiplot\n";
}

int run_plot(const PlotConfig& cfg) {
  std::string run;
  auto epochs = lines_of_run(cfg, run);
  TANDEM_CHECK(on_path("gnuplot"), "tandem plot draws with gnuplot, which is not installed: apt-get install gnuplot-nox");
  const std::string run_shown = run.size() >= 2 ? run.substr(1, run.size() - 2) : run;
  if (step_line(epochs.back())) {
    std::vector<nlohmann::json> steps;
    for (auto& j : epochs)
      if (step_line(j)) steps.push_back(j);
    std::string title = "tandem run " + run_shown;
    if (!steps.back().value("model", std::string()).empty()) title += ": " + steps.back()["model"].get<std::string>();
    const std::string script = step_script(steps, title);
    io::write_file_atomically(cfg.output, "plot", [&](int fd) { draw_with_gnuplot(script, fd, cfg.output); });
    std::printf("wrote %s (steps up to %s of run %s)\n", cfg.output.c_str(), steps.back()["step"].dump().c_str(),
                run_shown.c_str());
    return 0;
  }
  std::vector<nlohmann::json> kept;
  for (auto& j : epochs)
    if (epoch_line(j)) kept.push_back(j);
  epochs = kept;
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
  std::string script = "set terminal pngcairo size 1200,450 font ',10'\n"
                       "set multiplot layout 1,2 title " + gnuplot_string(title) + "\nset xlabel 'epoch'\nset grid\n" +
                       (epochs.size() <= 20 ? "set xtics 1\n" : "") +
                       "set key bottom right\nset ylabel 'training loss (sum of batch means)'\n" +
                       "plot '-' with linespoints title 'training loss'\n" + series("train_loss") +
                       "set ylabel 'accuracy'\nset key bottom right\n" +
                       "plot '-' with linespoints title 'training', '-' with linespoints title 'evaluation'\n" +
                       series("train_acc") + series("eval_acc") + "unset multiplot\n";
  // Drawn into a new file beside the output and renamed over it: a link at the output is replaced.
  io::write_file_atomically(cfg.output, "plot", [&](int fd) { draw_with_gnuplot(script, fd, cfg.output); });
  std::printf("wrote %s (%zu epochs of run %s)\n", cfg.output.c_str(), epochs.size(), shown.c_str());
  return 0;
}

}  // namespace

Runner add_plot_command(CLI::App& app) {
  auto cfg = std::make_shared<PlotConfig>();
  CLI::App* sub = app.add_subcommand("plot", "Draw loss and accuracy per epoch (language models: loss and tokens/s "
                                             "per step) from a --metrics file (PNG, with gnuplot)");
  sub->add_option("metrics", cfg->metrics, "JSON-lines file written by tandem train --metrics")->required();
  sub->add_option("-o,--output", cfg->output, "PNG file to write")->capture_default_str();
  sub->add_option("--run", cfg->run, "Run id to draw (default: the file's last run)");
  return [cfg] { return run_plot(*cfg); };
}

}  // namespace tandem::cli
