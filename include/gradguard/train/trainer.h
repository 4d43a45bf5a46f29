// The trainer: builds the model, data, optimizer, schedule and guard from a validated
// Config, creates (or resumes) the run directory, and runs the loop of docs/design.md
// with one guard::GuardedStep per optimizer step: accumulate over micro-batches, the
// guarded step, log, validate, checkpoint.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "gradguard/config/config.h"

namespace gradguard::train {

struct TrainResult {
  std::string run_dir;
  std::string checkpoint_dir;   // the final checkpoint
  int64_t steps = 0;            // optimizer steps completed (including those before a resume)
  int64_t resumed_from = -1;    // step the run resumed from; -1 for a fresh run
  bool complete = false;        // a resumed run that had already finished: nothing ran, nothing changed
  bool preempted = false;       // stopped by SIGTERM/SIGINT after a complete step and its checkpoint
  std::string stop_signal;      // "SIGTERM" | "SIGINT" (preempted only)
  int64_t skipped_steps = 0;    // optimizer updates not applied (overflows and anomalies)
  int64_t anomalies = 0;        // anomaly events (warnings included)
  int64_t recovery_actions = 0; // actions the recovery ladder took
  int64_t rollbacks = 0;
  int64_t snapshots = 0;        // snapshots written
  std::string last_snapshot;    // directory of the newest snapshot ("" = none)
  int64_t parameters = 0;
  double first_loss = 0;        // training loss of step 0
  double final_loss = 0;        // training loss of the last step
  double initial_val_loss = 0;  // before the first step (NaN without validation data)
  double final_val_loss = 0;    // after the last step (NaN without validation data)
  double elapsed_s = 0;
  double tokens_per_s = 0;      // over the whole run
  int64_t rank = 0;             // this process's rank of a data-parallel run (rank 0 writes and reports)
  int64_t world_size = 1;
};

class Trainer {
 public:
  // Validates the data files against the model (vocabulary, sequence length), resolves
  // model.init_from, and creates the run directory with config.yaml. Throws
  // gradguard::Error (bad input) for a run directory that already holds a run unless
  // run.overwrite is set.
  //
  // With `resume_run_dir` set, the run continues in that directory from its newest
  // checkpoint that verifies (falling back past corrupt ones, each reported), and
  // metrics.jsonl is cut back to that step; on CPU in fp32 the continuation is
  // bit-identical to an uninterrupted run. A run whose checkpoint is at
  // schedule.total_steps is complete: run() then changes nothing and reports it.
  explicit Trainer(config::Config config, std::FILE* out = stdout, const std::string& resume_run_dir = "");
  ~Trainer();

  TrainResult run();
  // Replay (apps/replay.h): runs the steps up to and including `last_step` and returns,
  // with no final validation, checkpoint or report. `before_last` is called with the
  // model just before that step runs (its weights are the step's inputs); it must leave
  // the model's parameters and gradients as it found them.
  TrainResult run_until(int64_t last_step,
                        const std::function<void(model::LlamaForCausalLMImpl&)>& before_last = {});
  const config::Config& config() const;
  const std::string& run_dir() const;
  int64_t rank() const;  // this process's data-parallel rank (0 for a single process)

 private:
  TrainResult run_steps();
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace gradguard::train
