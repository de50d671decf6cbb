#pragma once
// Internal: what the `tandem` program says about a command line it cannot parse. CLI11's own words
// ("The following arguments were not expected: 1 --epoch", "A subcommand is required") name neither
// the mistake nor its fix: a misspelt command or option is named with the nearest one that exists.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tandem::cli {

/// The known name nearest to `word` (optimal string alignment distance, leading dashes aside) when it
/// is near enough to be a slip: at most a third of the word's letters (at least one) apart, or the only
/// name that `word` begins (3 letters or more). "" when none is.
std::string nearest_name(const std::string& word, const std::vector<std::string>& names);

/// The message (without "tandem: error: ") for `args` (argv without the program's name) that `app`
/// refused with `e`: "unknown command 'trian'; did you mean 'train'?", "unknown option --epoch; did you
/// mean --epochs?" (with where to find the list), else CLI11's own message.
std::string parse_error_message(const CLI::App& app, const std::vector<std::string>& args,
                                const CLI::ParseError& e);

}  // namespace tandem::cli
