// What `train --resume` continues: the run directory, and the configuration the run is
// loaded with. The rule of --resume auto lives here, in the library, so that every front
// end resolves it the same way (the CLI only parses and prints).
#pragma once

#include <string>
#include <vector>

namespace gradguard::train {

struct ResumeTarget {
  std::string run_dir;                 // the run to continue; "" = start a run
  std::string config_path;             // the configuration to load ("" = the built-in default)
  std::vector<std::string> overrides;  // the caller's, with run.dir/run.name (and run.overwrite) added
  std::string note;                    // what was decided when it is worth saying ("" = nothing)
};

// `resume`: "" (no resume), "auto", or a run directory. `config_path` and `overrides`
// (key=value) are what the user gave.
//   a directory   that run, with its own config.yaml unless a file was given
//   auto          the run named by run.name (from the overrides, else the file, else the
//                 default): resumed when it has a checkpoint, else started (over what is
//                 there: a run without a checkpoint has nothing to keep); without a run.name,
//                 the most recently checkpointed run under run.dir
// Throws gradguard::Error (bad input) naming --resume when the directory is none, or when
// auto finds no run with a checkpoint.
ResumeTarget resolve_resume(const std::string& resume, const std::string& config_path,
                            std::vector<std::string> overrides);

// The most recently checkpointed run under `runs_dir` (by its checkpoints/latest link's
// time). Throws gradguard::Error (bad input, naming --resume auto) when none has one.
std::string newest_checkpointed_run(const std::string& runs_dir);

}  // namespace gradguard::train
