// `gradguard bench seed`: the classic comparison of large-batch stabilisation setups,
// run side by side on the same model, data and seed, each as its own `gradguard train`
// child process (so peak memory and CPU time come from the kernel's accounting of that
// process alone), then analysed from the runs' metrics.jsonl into one table.
//
// The setups are the presets in configs/seed/: base.yaml (the shared unstable setting;
// see its header for why it is unstable) plus one file per setup holding only what
// distinguishes it. Every number in the table is measured:
//   fluctuation  max - min of (loss - its centred 11-step rolling median) after warmup,
//                injected steps left out (their batch is noise in every setup)
//   samples/s    sequences trained per second of training wall time
//   peak MiB     the child's peak resident set size (getrusage)
//   spikes       steps after warmup whose loss exceeds 1.05x the median of the previous
//                ten (injected steps left out)
//   skipped / rollbacks   from the run's step lines and events
//   to target    first step whose EMA(0.9)-smoothed loss reaches the target: 1.1x the
//                best final smoothed loss among the setups ("-" if never)
//   CPU util     (user + system CPU time) / (wall time x threads)
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::seed {

struct SeedOptions {
  std::string mode = "full";                  // full | tiny (a seconds-long version for tests)
  std::string presets_dir = "configs/seed";   // base.yaml + one YAML per setup
  std::string out_dir = "runs/seed-bench";    // run directories, logs, seed.md, seed.json
  std::vector<std::string> overrides;         // key=value applied to every setup last
  std::string executable;                     // the gradguard binary; "" = this process's
  bool overwrite = false;                     // reuse an out_dir that holds results
};

struct SetupResult {
  std::string name;              // preset file stem
  std::string title;             // the preset's first comment line
  int exit_code = 0;             // of the child (3 = halted by its guard)
  int64_t steps = 0;             // optimizer steps executed (a rollback repeats some)
  double fluctuation = 0;
  double samples_per_s = 0;
  double peak_rss_mb = 0;
  double cpu_util = 0;
  int64_t spikes = 0, skipped = 0, rollbacks = 0;
  int64_t steps_to_target = -1;
  double final_loss = 0;         // smoothed training loss at the end
  double final_val_loss = 0;     // NaN without validation
  double wall_s = 0;
  std::vector<std::pair<int64_t, double>> curve;  // [step] final-trajectory losses (smoothed), for the target
};

struct SeedReport {
  std::string mode;
  std::string command;
  double target_loss = 0;
  std::vector<SetupResult> setups;
  std::string markdown() const;
  nlohmann::ordered_json to_json() const;
};

// The analysis of one run's metrics.jsonl: every field but the process measurements and
// steps_to_target. `injected` are the steps with injected batches; `warmup` in steps.
// Throws gradguard::Error (bad input) naming the file when it holds no step lines.
SetupResult analyse_run(const std::string& metrics_path, const std::vector<int64_t>& injected, int64_t warmup,
                        int64_t global_batch);

// Runs every setup in turn (progress lines to `progress`), analyses them and writes
// seed.md and seed.json into out_dir. Throws gradguard::Error (bad input) for a missing
// preset folder, an out_dir with results (without overwrite), or a setup whose config is
// rejected (with its log's last lines).
SeedReport run_seed_bench(const SeedOptions& options, std::FILE* progress);

}  // namespace gradguard::seed
