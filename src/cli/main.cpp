// The `tandem` executable: subcommands train, launch, bench, eval, export, plot, data, generate, info.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/cli_errors.h"
#include "cli/commands.h"
#include "tandem/device.h"
#include "tandem/error.h"
#include "tandem/version.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: data-parallel training on CPUs and GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tandem ") + tandem::build_info().version);
  std::map<CLI::App*, tandem::cli::Runner> runners;
  auto add = [&](tandem::cli::Runner (*f)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    tandem::cli::Runner r = f(app);
    auto subs = app.get_subcommands({});
    for (size_t i = before; i < subs.size(); ++i) runners[subs[i]] = r;
  };
  add(tandem::cli::add_train_command);
  add(tandem::cli::add_launch_command);
  add(tandem::cli::add_bench_command);
  add(tandem::cli::add_eval_command);
  add(tandem::cli::add_export_command);
  add(tandem::cli::add_plot_command);
  add(tandem::cli::add_data_command);
  add(tandem::cli::add_generate_command);
  CLI::App* info = app.add_subcommand("info", "Print the build's components and the GPUs this process sees");
  runners[info] = [] {
    tandem::BuildInfo b = tandem::build_info();
    auto yn = [](bool v) { return v ? "yes" : "no"; };
    std::printf("tandem %s\ncuda: %s\nnccl: %s\ngloo: %s\nmpi: %s\ngpus: %d\nthreads: %d\n", b.version, yn(b.cuda),
                yn(b.nccl), yn(b.gloo), yn(b.mpi), tandem::cuda_device_count(), tandem::num_threads());
    return 0;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fflush(stdout);
    const std::vector<std::string> args(argv + 1, argv + argc);
    std::fprintf(stderr, "tandem: error: %s\n", tandem::cli::parse_error_message(app, args, e).c_str());
    return 2;
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
    return 2;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    int rc = e.kind() == tandem::Error::Kind::Input ? 2 : 1;
    tandem::dist::abort_job_after_error(rc);  // under mpiexec: stop every rank, not only this one
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    tandem::dist::abort_job_after_error(1);
    return 1;
  }
}
