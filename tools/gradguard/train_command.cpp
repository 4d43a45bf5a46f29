// `gradguard train [--config FILE] [--set key=value ...] [key=value ...] [--name NAME]`
// (a bare key=value is an override as with --set, the habit of torchtune and Hydra): trains on the
// built-in default when no file is given, writes report.html (also when the run halts or
// fails: that run is the one most worth looking at), then prints a summary.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "gradguard/apps/html_report.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/run_dir.h"
#include "gradguard/core/stop_signals.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_number.h"
#include "gradguard/train/progress.h"
#include "gradguard/train/resume_target.h"
#include "gradguard/train/trainer.h"

namespace gradguard::cli {

namespace {
namespace stdfs = std::filesystem;

// report.html of the run so far on rank 0 when log.report is on. A report that cannot
// be written is a warning: the run itself is what it is, and `gradguard report RUN_DIR`
// can retry. Returns its path ("" when none).
std::string write_report(const config::Config& cfg, const std::string& run_dir, int64_t rank) {
  if (!cfg.log.report || rank != 0 || run_dir.empty() || !stdfs::is_directory(run_dir)) return "";
  try {
    return report::write_html_report(run_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: report.html not written: %s\n", e.what());  // stdout may be JSON lines
    return "";
  }
}

// The summary as one JSON object for scripts (--json): {"summary": {...}}.
nlohmann::ordered_json summary_json(const train::TrainResult& r, const std::string& report) {
  return {{"summary",
           {{"steps", r.steps},
            {"complete", r.complete},
            {"preempted", r.preempted},
            {"elapsed_s", json_number(r.elapsed_s)},
            {"tokens_per_s", json_number(r.tokens_per_s)},
            {"world_size", r.world_size},
            {"resumed_from", r.resumed_from >= 0 ? nlohmann::ordered_json(r.resumed_from) : nlohmann::ordered_json()},
            {"skipped_steps", r.skipped_steps},
            {"first_loss", json_number(r.first_loss)},
            {"final_loss", json_number(r.final_loss)},
            {"initial_val_loss", json_number(r.initial_val_loss)},
            {"final_val_loss", json_number(r.final_val_loss)},
            {"anomalies", r.anomalies},
            {"recovery_actions", r.recovery_actions},
            {"rollbacks", r.rollbacks},
            {"snapshots", r.snapshots},
            {"run_dir", r.run_dir},
            {"checkpoint", r.checkpoint_dir},
            {"report", report}}}};
}
}  // namespace

void add_train_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("train", "Train a model (the built-in default: a tiny Llama on the Brown corpus)");
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto name = std::make_shared<std::string>();
  auto resume = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("-c,--config", *path, "YAML configuration file (default: built-in)");
  cmd->add_option("-s,--set", *sets, "Override: key.path=value (value read as YAML); repeatable");
  auto bare = std::make_shared<std::vector<std::string>>();
  cmd->add_option("overrides", *bare, "key.path=value overrides without --set (applied before the --set ones)");
  cmd->add_option("-n,--name", *name, "Run name (same as --set run.name=NAME)");
  cmd->add_option("-r,--resume", *resume,
                  "Continue RUN_DIR from its newest good checkpoint ('auto': the run named by run.name if it has a "
                  "checkpoint, else a fresh start of it; without run.name the newest run under run.dir with a "
                  "checkpoint); its config.yaml is the base configuration unless --config is given");
  cmd->add_flag("-q,--quiet", *quiet, "No progress; only the summary and errors (log.progress=quiet)");
  cmd->add_flag("--json", *json,
                "One JSON object per step, per message and for the summary on stdout (log.progress=jsonl)");
  cmd->callback([&action, path, sets, bare, name, resume, quiet, json] {
    action = [path, sets, bare, name, resume, quiet, json] {
      if (*quiet && *json) throw bad_input("--quiet/--json", "choose one of the two");
      for (const auto& b : *bare)
        if (b.find('=') == std::string::npos || b.front() == '=')
          throw bad_input("train " + b, "an argument without a dash is an override key.path=value (e.g. "
                                        "optim.lr=2e-5); a configuration file is given with --config " + b);
      auto overrides = *bare;
      overrides.insert(overrides.end(), sets->begin(), sets->end());
      if (!name->empty()) overrides.push_back("run.name=" + *name);
      if (*quiet) overrides.push_back("log.progress=quiet");
      if (*json) overrides.push_back("log.progress=jsonl");
      const auto target = train::resolve_resume(*resume, *path, overrides);
      if (!target.note.empty()) std::printf("%s\n", target.note.c_str());
      const std::string& run_dir = target.run_dir;
      auto cfg = config::load_config(target.config_path, target.overrides);
      const bool json_summary = cfg.log.progress == config::ProgressMode::kJsonl;
      train::Trainer trainer(cfg, stdout, run_dir);
      train::TrainResult r;
      try {
        r = trainer.run();
      } catch (...) {
        write_report(trainer.config(), trainer.run_dir(), trainer.rank());  // a halted or failed run is the one most worth a look
        throw;
      }
      // A complete run is left as it was, its report included.
      const std::string report = r.complete ? "" : write_report(trainer.config(), r.run_dir, r.rank);
      // Preempted: the exit code says so to the scheduler's wrapper, on every rank.
      const int code = r.preempted ? kExitPreempted : 0;
      if (r.rank != 0) return code;  // rank 0 reports for the run
      if (json_summary) {
        std::printf("%s\n", summary_json(r, report).dump().c_str());
        return code;
      }
      if (r.complete)
        std::printf("\nrun %s is complete (step %lld of %lld); nothing to do\n", r.run_dir.c_str(),
                    (long long)r.steps, (long long)trainer.config().schedule.total_steps);
      else if (r.preempted)
        std::printf("\nstopped by %s after %lld of %lld steps (exit %d); resume with: gradguard train --resume %s\n",
                    r.stop_signal.c_str(), (long long)r.steps, (long long)trainer.config().schedule.total_steps, kExitPreempted,
                    r.run_dir.c_str());
      else
        std::printf("\nsummary: %lld steps in %s (%.0f tokens/s%s), %lld skipped%s\n", (long long)r.steps,
                  train::format_duration(r.elapsed_s).c_str(), r.tokens_per_s,
                  r.world_size > 1 ? (" over " + std::to_string(r.world_size) + " ranks").c_str() : "",
                  (long long)r.skipped_steps,
                  r.resumed_from >= 0 ? (", resumed at step " + std::to_string(r.resumed_from)).c_str() : "");
      std::printf("  train loss  %.4f -> %.4f\n", r.first_loss, r.final_loss);
      if (std::isfinite(r.final_val_loss))
        std::printf("  val loss    %.4f -> %.4f nats/token\n", r.initial_val_loss, r.final_val_loss);
      std::printf("  guard       %lld anomalies, %lld recovery actions (%lld rollbacks), %lld snapshots%s%s\n",
                  (long long)r.anomalies, (long long)r.recovery_actions, (long long)r.rollbacks,
                  (long long)r.snapshots, r.last_snapshot.empty() ? "" : ", newest ", r.last_snapshot.c_str());
      std::printf("  run dir     %s\n  checkpoint  %s\n", r.run_dir.c_str(), r.checkpoint_dir.c_str());
      if (!report.empty()) std::printf("  report      %s\n", report.c_str());
      return code;
    };
  });
}

}  // namespace gradguard::cli
