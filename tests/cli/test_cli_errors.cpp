// What `tandem` says about a command line it cannot parse: a misspelt command or option is named with
// the nearest one that exists, and CLI11's own message is kept for the rest.
#include <gtest/gtest.h>

#include "cli/cli_errors.h"

using tandem::cli::nearest_name;
using tandem::cli::parse_error_message;

TEST(CliErrors, NearestNameIsASlipAwayOrTheOnlyOneBegun) {
  const std::vector<std::string> options = {"--epochs", "--batch-size", "-b", "--lr", "--limit-train",
                                            "--limit-test", "--checkpoint", "--check-consistency", "--hidden"};
  EXPECT_EQ(nearest_name("--epoch", options), "--epochs");
  EXPECT_EQ(nearest_name("--epcohs", options), "--epochs");  // two letters swapped
  EXPECT_EQ(nearest_name("--batchsize", options), "--batch-size");
  EXPECT_EQ(nearest_name("--hiden", options), "--hidden");
  EXPECT_EQ(nearest_name("--check-cons", options), "--check-consistency");  // the only one it begins
  EXPECT_EQ(nearest_name("--limit", options), "");  // begins two
  EXPECT_EQ(nearest_name("--frobnicate", options), "");
  EXPECT_EQ(nearest_name("--", options), "");
  const std::vector<std::string> commands = {"train", "launch", "bench", "eval", "export", "plot", "data",
                                             "generate", "info"};
  EXPECT_EQ(nearest_name("trian", commands), "train");
  EXPECT_EQ(nearest_name("lanuch", commands), "launch");
  EXPECT_EQ(nearest_name("dat", commands), "data");
  EXPECT_EQ(nearest_name("xyz", commands), "");
}

namespace {
// A small program of the same shape as tandem's: commands with options, one with commands of its own.
struct Program {
  CLI::App app{"test"};
  int epochs = 1;
  bool deterministic = false;
  std::string out;
  Program() {
    app.require_subcommand(1);
    CLI::App* train = app.add_subcommand("train", "");
    train->add_option("-m,--epochs", epochs, "");
    train->add_flag("--deterministic", deterministic, "");
    CLI::App* data = app.add_subcommand("data", "");
    data->require_subcommand(1);
    CLI::App* text = data->add_subcommand("text", "");
    text->add_option("-o,--output", out, "")->required();
  }
  std::string error(std::vector<std::string> args) {
    std::vector<const char*> argv = {"tandem"};
    for (const auto& a : args) argv.push_back(a.c_str());
    try {
      app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    } catch (const CLI::ParseError& e) {
      return parse_error_message(app, args, e);
    }
    return "(parsed)";
  }
};
}  // namespace

TEST(CliErrors, MessagesNameTheMistakeAndTheNearestName) {
  EXPECT_EQ(Program().error({"train", "--epoch", "1"}),
            "unknown option --epoch; did you mean --epochs? (tandem train --help lists the options)");
  EXPECT_EQ(Program().error({"train", "-m", "2", "--deterministic", "--epoch=3"}),
            "unknown option --epoch; did you mean --epochs? (tandem train --help lists the options)");
  EXPECT_EQ(Program().error({"trian", "--epochs", "1"}),
            "unknown command 'trian'; did you mean 'train'? (tandem has: train, data)");
  EXPECT_EQ(Program().error({"data", "txt", "-o", "x"}),
            "unknown command 'txt'; did you mean 'text'? (tandem data has: text)");
  EXPECT_EQ(Program().error({"train", "--nothing-like-it"}),
            "unknown option --nothing-like-it (tandem train --help lists the options)");
  EXPECT_EQ(Program().error({}).rfind("give a command: tandem COMMAND, where COMMAND is one of train, data", 0), 0u);
  // Not a misspelling: CLI11's message, with where the options are listed.
  const std::string required = Program().error({"data", "text"});
  EXPECT_NE(required.find("--output is required"), std::string::npos) << required;
  EXPECT_NE(required.find("tandem data text --help"), std::string::npos) << required;
  EXPECT_NE(Program().error({"train", "--epochs", "x"}).find("--epochs"), std::string::npos);
}
