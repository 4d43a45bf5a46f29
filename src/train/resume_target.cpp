// --resume resolution (train/resume_target.h): plain file-system questions, no training
// state, so the CLI, the Python module or a test can ask them alike.
#include "gradguard/train/resume_target.h"

#include <filesystem>

#include "gradguard/config/config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/run_dir.h"

namespace gradguard::train {
namespace stdfs = std::filesystem;

std::string newest_checkpointed_run(const std::string& runs_dir) {
  std::string best;
  stdfs::file_time_type best_time;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(runs_dir, ec)) {
    const RunDir run(e.path().string());
    if (!stdfs::exists(run.latest_checkpoint_link(), ec)) continue;
    const auto t = stdfs::last_write_time(run.latest_checkpoint_link(), ec);
    if (best.empty() || t > best_time) best = e.path().string(), best_time = t;
  }
  if (best.empty()) throw bad_input("--resume auto", "no run under '" + runs_dir + "' has a checkpoint");
  return best;
}

ResumeTarget resolve_resume(const std::string& resume, const std::string& config_path,
                            std::vector<std::string> overrides) {
  ResumeTarget t;
  t.config_path = config_path;
  if (resume == "auto") {
    // Where runs live and which one is meant: the overrides, else the file, else the
    // default (only the run.* keys: the rest belongs to the run's own config.yaml).
    std::vector<std::string> run_keys;
    for (const auto& o : overrides)
      if (o.rfind("run.", 0) == 0) run_keys.push_back(o);
    const auto base = config::load_config(config_path, run_keys);
    if (base.run.name.empty()) {
      t.run_dir = newest_checkpointed_run(base.run.dir);
    } else {
      // An explicit run.name means that run: resumed when it has a checkpoint, else
      // started (again: a start without a checkpoint has nothing to keep).
      const RunDir named((stdfs::path(base.run.dir) / base.run.name).string());
      if (stdfs::exists(named.latest_checkpoint_link())) {
        t.run_dir = named.root();
      } else {
        t.note = "--resume auto: run " + named.root() + " has no checkpoint; starting it";
        if (named.holds_run()) overrides.push_back("run.overwrite=true");
      }
    }
  } else if (!resume.empty()) {
    t.run_dir = resume;
  }
  if (!t.run_dir.empty()) {
    if (!stdfs::is_directory(t.run_dir)) throw bad_input("--resume " + t.run_dir, "is not a run directory");
    if (t.config_path.empty()) t.config_path = RunDir(t.run_dir).config();
    const stdfs::path p = stdfs::path(t.run_dir).lexically_normal();
    overrides.push_back("run.dir=" + (p.has_parent_path() ? p.parent_path().string() : std::string(".")));
    overrides.push_back("run.name=" + p.filename().string());
  }
  t.overrides = std::move(overrides);
  return t;
}

}  // namespace gradguard::train
