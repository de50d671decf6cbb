// Messages for command lines that do not parse: misspelt commands and options get the nearest name.
#include "cli/cli_errors.h"

#include <algorithm>

namespace tandem::cli {

namespace {

std::string without_dashes(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && i < 2 && s[i] == '-') ++i;
  return s.substr(i);
}

// Edits (insertions, deletions, substitutions, swaps of neighbours) that turn a into b.
size_t osa_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// The names an option answers to: --long and -s.
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (!sub->get_name().empty()) names.push_back(sub->get_name());
  return names;
}

const CLI::App* find_command(const CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (!sub->get_name().empty() && sub->check_name(name)) return sub;
  return nullptr;
}

// "tandem train": the command line up to the (sub)command `app`.
std::string command_path(const CLI::App& app) {
  std::string path;
  for (const CLI::App* a = &app; a; a = a->get_parent())
    path = (a->get_parent() ? a->get_name() : std::string("tandem")) + (path.empty() ? "" : " " + path);
  return path;
}

}  // namespace

std::string nearest_name(const std::string& word, const std::vector<std::string>& names) {
  const std::string w = without_dashes(word);
  if (w.empty()) return "";
  std::string best;
  size_t best_d = w.size() / 3 + 1;  // more than allowed
  std::vector<std::string> prefixed;
  for (const std::string& name : names) {
    const std::string n = without_dashes(name);
    const size_t d = osa_distance(w, n);
    if (d < best_d && d <= std::max<size_t>(1, w.size() / 3)) {
      best_d = d;
      best = name;
    }
    if (w.size() >= 3 && n.rfind(w, 0) == 0) prefixed.push_back(name);
  }
  if (best.empty() && prefixed.size() == 1) best = prefixed.front();
  return best;
}

std::string parse_error_message(const CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& e) {
  const CLI::App* cur = &app;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.') {
      // --name=value, -n4: the option's own part.
      std::string name = a.rfind("--", 0) == 0 ? a.substr(0, a.find('=')) : a.substr(0, 2);
      const CLI::Option* o = cur->get_option_no_throw(name);
      if (!o) {
        const std::string near = nearest_name(name, option_names(*cur));
        return "unknown option " + name + (near.empty() ? std::string() : "; did you mean " + near + "?") + " (" +
               command_path(*cur) + " --help lists the options)";
      }
      if (o->get_items_expected_min() > 0 && a.find('=') == std::string::npos &&
          !(a.rfind("--", 0) != 0 && a.size() > 2))
        ++i;  // its value
      continue;
    }
    // A word: a (sub)command's name, or a value of the command itself.
    if (cur->get_prefix_command()) break;  // tandem launch: the program to start, with its own options
    const std::vector<std::string> commands = command_names(*cur);
    if (commands.empty()) continue;
    if (const CLI::App* sub = find_command(*cur, a)) {
      cur = sub;
      continue;
    }
    const std::string near = nearest_name(a, commands);
    std::string list;
    for (const std::string& c : commands) list += (list.empty() ? "" : ", ") + c;
    return "unknown command '" + a + "'" + (near.empty() ? std::string() : "; did you mean '" + near + "'?") +
           " (" + command_path(*cur) + " has: " + list + ")";
  }
  std::string msg = e.what();
  if (dynamic_cast<const CLI::RequiredError*>(&e) && msg.find("subcommand") != std::string::npos) {
    std::string list;
    for (const std::string& c : command_names(*cur)) list += (list.empty() ? "" : ", ") + c;
    return "give a command: " + command_path(*cur) + " COMMAND, where COMMAND is one of " + list + " (" +
           command_path(*cur) + " --help says what each does)";
  }
  return msg + " (" + command_path(*cur) + " --help lists the options)";
}

}  // namespace tandem::cli
