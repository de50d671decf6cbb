// `tandem launch`: written with the launcher.
#include "cli/commands.h"

namespace tandem::cli {
Runner add_launch_command(CLI::App& app) {
  app.add_subcommand("launch", "Start a multi-process job on this machine");
  return [] { return 0; };
}
}  // namespace tandem::cli
