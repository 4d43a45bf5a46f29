// gradguard CLI entry point: parses the command line and maps failures to the exit codes
// of DESIGN.md: 0 success, 2 bad input (with a message naming the file or key), 3 halted
// by the guard, 1 anything else.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/error.h"

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    return action();
  } catch (const gradguard::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_code();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error (torch): %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
