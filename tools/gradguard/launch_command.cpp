// `gradguard launch --nproc N [--master-addr A] [--master-port P] [--grace-s S] -- ARGS...`
// starts N local ranks of ARGS (dist/launch.h). Everything after `--` is passed through
// untouched; ARGS[0] naming one of this CLI's subcommands runs this executable, anything
// else is a program on PATH. The list of subcommands is read from the app, so a new
// subcommand is launchable without touching this file.
#include <filesystem>
#include <memory>

#include "commands.h"
#include "gradguard/core/error.h"
#include "gradguard/dist/launch.h"

namespace gradguard::cli {

void add_launch_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("launch", "Start N local ranks of a command (RANK, WORLD_SIZE, MASTER_* set)");
  auto o = std::make_shared<dist::LaunchOptions>();
  auto args = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--nproc", o->nproc, "Ranks to start on this machine (1..1024)")->capture_default_str();
  cmd->add_option("--master-addr", o->master_addr, "MASTER_ADDR for every rank (an address of this machine)")
      ->capture_default_str();
  auto* port = cmd->add_option("--master-port", o->master_port, "MASTER_PORT (1..65535; default: a free port)");
  cmd->add_option("--grace-s", o->grace_s, "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  cmd->add_option("args", *args,
                  "After `--`: a gradguard subcommand (train, ...) or a program on PATH, and its arguments");
  cmd->callback([&app, &action, o, args, port] {
    std::vector<std::string> self_commands;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; }))
      if (sub->get_name() != "launch") self_commands.push_back(sub->get_name());  // launch.h rejects recursion
    const bool port_given = port->count() > 0;
    action = [o, args, self_commands, port_given] {
      if (port_given && o->master_port == 0)
        throw bad_input("--master-port", "must be 1..65535, got 0 (leave it out to pick a free port)");
      const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
      return dist::launch(*o, *args, self, self_commands);
    };
  });
}

}  // namespace gradguard::cli
