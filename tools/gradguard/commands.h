// Subcommands of the `gradguard` CLI. Each registers its options on the app and returns
// the function that runs it; main() turns exceptions into exit codes.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace gradguard::cli {

using Action = std::function<int()>;

void add_train_command(CLI::App& app, Action& action);
void add_prepare_command(CLI::App& app, Action& action);
void add_config_command(CLI::App& app, Action& action);
void add_export_command(CLI::App& app, Action& action);
void add_replay_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);
void add_launch_command(CLI::App& app, Action& action);
void add_report_command(CLI::App& app, Action& action);
void add_doctor_command(CLI::App& app, Action& action);
void add_tune_command(CLI::App& app, Action& action);
void add_tokenize_command(CLI::App& app, Action& action);
void add_plan_command(CLI::App& app, Action& action);
void add_generate_command(CLI::App& app, Action& action);

}  // namespace gradguard::cli
