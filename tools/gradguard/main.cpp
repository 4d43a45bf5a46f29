// gradguard CLI entry point: parses the command line and maps failures to the exit codes
// of docs/design.md: 0 success, 2 bad input (with a message naming the file or key), 3 halted
// by the guard, 1 anything else.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "gradguard/config/config.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/error.h"
#include "gradguard/dist/env.h"

int main(int argc, char** argv) {
  gradguard::configure_allocator();  // before any tensor exists
  CLI::App app{"gradguard: stable large-batch training of transformer language models"};
  app.set_version_flag("--version", std::string("gradguard ") + GRADGUARD_VERSION);
  app.require_subcommand(1);
  gradguard::cli::Action action;
  gradguard::cli::add_train_command(app, action);
  gradguard::cli::add_prepare_command(app, action);
  gradguard::cli::add_config_command(app, action);
  gradguard::cli::add_export_command(app, action);
  gradguard::cli::add_replay_command(app, action);
  gradguard::cli::add_bench_command(app, action);
  gradguard::cli::add_launch_command(app, action);
  gradguard::cli::add_report_command(app, action);
  gradguard::cli::add_doctor_command(app, action);
  gradguard::cli::add_tune_command(app, action);
  gradguard::cli::add_plan_command(app, action);
  gradguard::cli::add_tokenize_command(app, action);
  gradguard::cli::add_generate_command(app, action);
  // A misspelled command gets its nearest name, not CLI11's "a subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      const std::string near = gradguard::config::nearest_key(argv[1], names);
      std::fprintf(stderr, "error: '%s' is not a gradguard command%s\ncommands: %s\nRun with --help for more information.\n",
                   argv[1], near.empty() ? "" : ("; did you mean '" + near + "'?").c_str(), list.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    // An option the command does not have: its nearest name and the command's usage line,
    // rather than CLI11's bare "argument was not expected".
    CLI::App* sub = nullptr;
    for (auto* s : app.get_subcommands()) sub = s;
    std::vector<std::string> names;
    if (sub != nullptr)
      for (const auto* opt : sub->get_options())
        for (const auto& l : opt->get_lnames()) names.push_back("--" + l);
    std::string unknown;
    for (int i = 2; sub != nullptr && i < argc && unknown.empty(); ++i) {
      const std::string arg = argv[i];
      if (arg == "--") break;
      const std::string name = arg.substr(0, arg.find('='));
      if (name.rfind("--", 0) == 0 && std::find(names.begin(), names.end(), name) == names.end()) unknown = name;
    }
    if (unknown.empty()) return app.exit(e) == 0 ? 0 : 2;
    const std::string near = gradguard::config::nearest_key(unknown, names);
    std::string usage;
    std::istringstream help(sub->help());
    for (std::string line; std::getline(help, line);)
      if (line.rfind("Usage:", 0) == 0) usage = line;
    std::fprintf(stderr, "error: gradguard %s has no option %s%s\n%s\nRun `gradguard %s --help` for its options.\n",
                 sub->get_name().c_str(), unknown.c_str(), near.empty() ? "" : ("; did you mean " + near + "?").c_str(),
                 usage.c_str(), sub->get_name().c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  // In a data-parallel run every rank may print an error: say whose it is.
  std::string who = "error";
  try {
    const auto env = gradguard::dist::detect_env();
    if (env.distributed()) who += " [rank " + std::to_string(env.rank) + "]";
  } catch (const gradguard::Error&) {
    // a bad launcher environment is reported by the command that needs it
  }
  try {
    return action();
  } catch (const gradguard::Error& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return e.exit_code();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s (torch): %s\n", who.c_str(), e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}
