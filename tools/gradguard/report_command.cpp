// `gradguard report RUN_DIR`: (re)writes the run's report.html from its metrics.jsonl,
// config.yaml and snapshots — for a run still going, one that crashed before its end, or
// one written by an older gradguard. Training writes the same report when it ends.
// --csv adds steps.csv and telemetry.csv; --tensorboard converts metrics.jsonl into an
// event file for runs that were trained without log.tensorboard.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "gradguard/apps/csv_export.h"
#include "gradguard/apps/html_report.h"
#include "gradguard/core/error.h"
#include "gradguard/core/run_dir.h"
#include "gradguard/telemetry/tensorboard.h"

namespace gradguard::cli {

void add_report_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("report", "Write a run's self-contained HTML report (report.html), CSV, TensorBoard");
  auto run_dir = std::make_shared<std::string>();
  auto o = std::make_shared<report::HtmlReportOptions>();
  auto csv = std::make_shared<bool>(false);
  auto tensorboard = std::make_shared<bool>(false);
  auto no_html = std::make_shared<bool>(false);
  cmd->add_option("run_dir", *run_dir, "Run directory (holds metrics.jsonl)")->required();
  cmd->add_option("-o,--out", o->out_path, "Output file (default: RUN_DIR/report.html)");
  cmd->add_option("--heatmap-columns", o->max_heatmap_columns, "Most columns of the per-layer heatmap")
      ->capture_default_str();
  cmd->add_flag("--csv", *csv, "Also write RUN_DIR/steps.csv and RUN_DIR/telemetry.csv");
  cmd->add_flag("--tensorboard", *tensorboard,
                "Also write a TensorBoard event file into RUN_DIR (skipped when it already has one)");
  cmd->add_flag("--no-html", *no_html, "Do not write report.html");
  cmd->callback([&action, run_dir, o, csv, tensorboard, no_html] {
    action = [run_dir, o, csv, tensorboard, no_html] {
      if (!std::filesystem::is_directory(*run_dir))
        throw bad_input(*run_dir, "is not a run directory (no such directory)");
      const RunDir run(*run_dir);
      const std::string metrics = run.metrics();
      if (!*no_html) std::printf("report: %s\n", report::write_html_report(*run_dir, *o).c_str());
      if (*csv) {
        const auto r = report::write_csv(metrics, *run_dir);
        for (const auto& s : r.skipped) std::fprintf(stderr, "warning: left out %s\n", s.c_str());
        std::printf("csv: %s (%lld rows), %s (%lld rows)\n", r.steps_path.c_str(), (long long)r.step_rows,
                    r.telemetry_path.c_str(), (long long)r.telemetry_rows);
      }
      if (*tensorboard) {
        // An event file already in the run directory (the trainer's live one): converting
        // again would show every point twice, as TensorBoard merges a directory's files.
        const auto existing = run.event_files();
        if (!existing.empty()) {
          std::printf("tensorboard: %s already holds this run's scalars; nothing written\n", existing.front().c_str());
        } else {
          std::vector<std::string> skipped;
          const int64_t n = telemetry::write_tensorboard(metrics, *run_dir, &skipped);
          for (const auto& s : skipped) std::fprintf(stderr, "warning: left out %s\n", s.c_str());
          std::printf("tensorboard: %lld scalars written into %s (tensorboard --logdir %s)\n", (long long)n,
                      run_dir->c_str(), run_dir->c_str());
        }
      }
      return 0;
    };
  });
}

}  // namespace gradguard::cli
