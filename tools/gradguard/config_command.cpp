// `gradguard config show [--config FILE] [--set k=v ...]` prints the effective
// configuration; `gradguard config docs` prints the reference (docs/config.md).
#include <iostream>

#include "commands.h"
#include "gradguard/config/config.h"

namespace gradguard::cli {

void add_config_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("config", "Show the effective configuration or its reference");
  cmd->require_subcommand(1);
  auto* show = cmd->add_subcommand("show", "Print the effective configuration as YAML");
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  show->add_option("-c,--config", *path, "YAML configuration file (default: built-in)");
  show->add_option("-s,--set", *sets, "Override: key.path=value (value read as YAML); repeatable");
  show->callback([&action, path, sets] {
    action = [path, sets] {
      std::cout << config::to_yaml(config::load_config(*path, *sets));
      return 0;
    };
  });
  auto* docs = cmd->add_subcommand("docs", "Print the configuration reference (Markdown)");
  docs->callback([&action] {
    action = [] {
      std::cout << config::reference_markdown();
      return 0;
    };
  });
}

}  // namespace gradguard::cli
