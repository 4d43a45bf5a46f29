// `gradguard replay SNAPSHOT`: re-executes the step a snapshot recorded and reports
// whether the anomaly reproduces, per micro-batch, naming the samples with the largest
// gradients. The report is printed and saved as SNAPSHOT/replay.json.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "gradguard/core/fs.h"
#include "gradguard/apps/replay.h"

namespace gradguard::cli {

void add_replay_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("replay", "Re-execute a snapshot's step and say whether the anomaly reproduces");
  auto dir = std::make_shared<std::string>();
  auto options = std::make_shared<replay::ReplayOptions>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("snapshot", *dir, "Snapshot directory (RUN/snapshots/step-NNNNNNN-<kind>)")->required();
  cmd->add_option("--rtol", options->rtol, "Relative tolerance for the same loss and gradient norm")
      ->capture_default_str();
  cmd->add_option("--device", options->device, "Device to replay on (cpu, cuda, cuda:N)")->capture_default_str();
  cmd->add_option("--top", options->top_samples, "Samples to name (0 skips the per-sample pass)")
      ->capture_default_str();
  cmd->add_flag("--json", *json, "Print the report as JSON");
  cmd->callback([&action, dir, options, json] {
    action = [dir, options, json] {
      const auto report = replay::replay_snapshot(*dir, *options);
      const std::string text = report.to_json().dump(2) + "\n";
      fs::write_file_atomic(*dir + "/replay.json", text);
      std::fputs(*json ? text.c_str() : report.to_text().c_str(), stdout);
      return 0;
    };
  });
}

}  // namespace gradguard::cli
