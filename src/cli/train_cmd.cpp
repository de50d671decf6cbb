// `tandem train`: written with the trainer.
#include "cli/commands.h"

namespace tandem::cli {
Runner add_train_command(CLI::App& app) {
  app.add_subcommand("train", "Train a model");
  return [] { return 0; };
}
}  // namespace tandem::cli
