// The progress display, in one of four modes:
//   bar    a line redrawn in place (a terminal): step, loss, lr, grad norm, loss scale
//          (when scaling is on), tokens/s, anomaly count, ETA
//   lines  the same fields as a plain line every log.every steps (a log file, CI)
//   jsonl  one JSON object per step and per message on `out`, for scripts
//   quiet  nothing (the caller still prints its summary); "none" is the same
// "auto" picks bar on a terminal and lines elsewhere. Validation results and messages
// get their own line (or object). The ETA comes from the steps this process ran (a
// resumed run does not count the time before it) and follows the recent pace.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "gradguard/optim/memory_options.h"
#include "gradguard/train/metrics.h"
#include "gradguard/config/run_options.h"

namespace gradguard::config {
struct Config;
}
namespace gradguard::data {
class TokenDataset;
}
namespace gradguard::optim {
class ShardedOptimizer;
}
namespace gradguard {
struct ThreadReport;
}

namespace gradguard::train {

class Progress {
 public:
  // `mode`: log.progress (see LogOptions). Writes to `out`.
  Progress(config::ProgressMode mode, int64_t total_steps, int64_t every, std::FILE* out = stdout);
  // `anomalies`: anomaly events so far in this run (shown when > 0).
  void step(const StepMetrics& m, int64_t anomalies = 0);
  void line(const std::string& text);  // a message on its own line
  void finish();                       // ends the bar line
  bool json() const { return json_; }

 private:
  double eta_seconds(const StepMetrics& m);

  bool bar_ = false;
  bool quiet_ = false;
  bool json_ = false;
  bool bar_open_ = false;
  int64_t total_, every_;
  std::FILE* out_;
  int64_t last_step_ = -1;      // previous step seen (-1: none yet)
  double last_elapsed_ = 0;     // its elapsed_s
  double step_s_ = -1;          // EMA of seconds per step (-1: no estimate yet)
  double overhead_s_ = 0;       // seconds between steps that were not step time (eval, checkpoints)
  int64_t steps_seen_ = 0;      // steps over which overhead_s_ accrued
};

// What the opening lines of a run's progress display describe (the trainer fills it).
struct RunHeader {
  const config::Config* cfg = nullptr;           // the run's final configuration
  int64_t parameters = 0;                        // of the whole model
  int64_t trainable = 0;                         // of those, the ones that train (LoRA)
  const ThreadReport* threads = nullptr;         // the thread pools in effect
  std::string run_dir;
  std::string length_note;                       // how schedule.epochs became total_steps ("" = not used)
  std::vector<std::string> resume_notes;         // what the resume and the data-parallel setup did
  std::string telemetry_note;                    // why GPU telemetry is missing ("" = nothing to say)
  const data::TokenDataset* train = nullptr;     // sample statistics (chat/SFT data)
  const data::TokenDataset* val = nullptr;
  optim::ShardedOptimizer* sharded = nullptr;        // the sharded optimizer's state, when memory.* asks for one
  optim::MemoryLayout memory;                    // how this rank holds the optimizer state and gradients
  double peak_lr = 0;                            // optim.lr after the batch-size scaling rule
};
// The header's lines: the run, its length, warnings, resume notes, data, LoRA, memory, lr.
std::vector<std::string> header_lines(const RunHeader& h);

// "1:02:03" / "4:05" for a duration in seconds.
std::string format_duration(double seconds);

}  // namespace gradguard::train
