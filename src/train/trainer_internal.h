// Trainer::State: what a run holds, grouped by the file that writes it. Private to
// src/train. Each group below names its owner; a field is written only there (the loop
// and the others read it).
//   trainer_setup.cpp        the run as configured: device, threads, model, data, optimizer,
//                            guard, communicator and the data-parallel mode (build(), the
//                            constructor), the fresh run directory
//   trainer_checkpoints.cpp  checkpoints: which one a resume continues from, restoring,
//                            saving, rolling back (start_step, complete, resume_notes,
//                            last_checkpoint)
//   trainer.cpp              the loop (run_until's last_step, the loggers while it runs)
//   trainer_steps.cpp        the pieces of one step: accumulation, snapshot evidence,
//                            logging, validation, the header's facts
// Objects with a room of their own: StepSource (step_source.h: batches, data offset,
// injected faults, prefetch) and GradReduction (grad_reduction.h: the data-parallel mode).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/config/config.h"
#include "gradguard/core/run_dir.h"
#include "gradguard/core/run_lock.h"
#include "gradguard/core/threads.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/dist/communicator.h"
#include "gradguard/forensics/snapshot.h"
#include "gradguard/guard/guarded_step.h"
#include "gradguard/model/llama.h"
#include "gradguard/optim/schedule.h"
#include "gradguard/optim/sharded_optimizer.h"
#include "gradguard/telemetry/telemetry.h"
#include "gradguard/train/metrics.h"
#include "gradguard/train/progress.h"
#include "gradguard/train/step.h"
#include "gradguard/train/trainer.h"
#include "grad_reduction.h"
#include "step_source.h"

namespace gradguard::train {

struct Trainer::State {
  // ---- the run as configured (trainer_setup.cpp) ----
  config::Config cfg;
  std::FILE* out = stdout;
  torch::Device device = torch::kCPU;
  RunDir run{""};
  RunLock lock;  // rank 0 holds its run directory's lock for the whole run
  ThreadReport threads;
  model::LlamaForCausalLM model{nullptr};
  std::shared_ptr<data::TokenDataset> train, val;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  optim::ShardedOptimizer* sharded = nullptr;  // `optimizer` when memory.* asks for it (optim/sharded_optimizer.h)
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;  // [tensor] HF parameter names, parallel to params
  double peak_lr = 0;              // optim.lr after the batch-size scaling rule
  std::string length_note;         // how schedule.epochs became total_steps, for the header

  // ---- checkpoints (trainer_checkpoints.cpp) ----
  int64_t start_step = 0;          // first step to run (> 0 after a resume)
  bool complete = false;           // a resumed run whose checkpoint is at schedule.total_steps
  std::vector<std::string> resume_notes;  // what the resume did, for the progress display
  // The newest checkpoint this run saved or resumed from (step, directory); step -1 =
  // none yet, which a resumed run never is. A reference snapshot names it
  // (forensics/snapshot.h).
  std::pair<int64_t, std::string> last_checkpoint{-1, ""};

  // ---- the loop (trainer.cpp) ----
  // Trainer::run_until: the last step to run (-1 = all) and what sees the model before it.
  int64_t last_step = -1;
  std::function<void(model::LlamaForCausalLMImpl&)> before_last;
  const StepData* current = nullptr;  // the step being guarded (for its snapshot)
  MetricsWriter* metrics = nullptr;   // set while run() is running
  Progress* progress = nullptr;       // set while run() is running

  // ---- data parallelism (trainer_setup.cpp) ----
  // Data parallelism (world_size > 1): rank 0 writes the run directory (metrics,
  // checkpoints, snapshots); every rank trains on its shard and sums gradients.
  dist::DistEnv env;
  std::unique_ptr<dist::Communicator> comm;  // null for a single process
  std::unique_ptr<GradReduction> reduction;  // the data-parallel mode (grad_reduction.h), made once the replicas agree
  bool main_rank() const { return env.rank == 0; }

  // ---- the guard, and what it writes (trainer_setup.cpp) ----
  std::unique_ptr<guard::GuardedStep> guarded;
  std::unique_ptr<forensics::SnapshotWriter> snapshots;  // rank 0 only
  std::unique_ptr<telemetry::Sampler> sampler;           // null when telemetry is off
  // Whether the loop must stop after step `step` because a process of the run received
  // SIGTERM/SIGINT: all ranks learn it from the step's one read (the side vector).
  bool stop_after(const guard::StepOutcome& outcome) const;
  int64_t anomalies_seen = 0;         // anomaly events of this process's steps (log_step, trainer_steps.cpp)

  // ---- setup (trainer_setup.cpp) ----
  // The model, data, optimizer, guard and step source (every rank); the fresh run
  // directory with config.yaml (rank 0).
  void build();
  void create_run_dir();
  optim::LrSchedule schedule() const;
  // Every rank reports how `phase` went (its exception, or none) and learns whether the
  // others failed; rethrows this rank's own error. No-op for a single process.
  void agree(const std::string& phase, const std::exception_ptr& error);

  // ---- checkpoints (trainer_checkpoints.cpp) ----
  // The run's checkpoints whose files verify, newest first, on rank 0 (which holds the
  // run's lock); none on the others. Before the ranks agree on setup.
  std::vector<std::string> resume_candidates();
  // Rank 0 restores the newest of `candidates` whose state checks out, every rank agrees
  // and loads the same one; sets start_step, complete, last_checkpoint. Collective.
  void resume(const std::string& run_dir, const std::vector<std::string>& candidates);
  // trainer_state.json of a checkpoint taken after `steps_done` steps.
  nlohmann::ordered_json trainer_state(int64_t steps_done) const;
  // Restores model, optimizer, RNG and the guard from checkpoint `dir`; `scope` says how
  // much of the guard. Returns the step.
  int64_t restore(const std::string& dir, guard::RestoreScope scope);
  // After a checkpoint's tensors are in: throws gradguard::Error (bad input) naming the
  // file when a weight or an optimizer moment is not finite, or a second moment negative.
  void check_loaded_values(const std::string& dir) const;
  // Rolls back to the newest good checkpoint after an anomaly at `step` and skips the
  // data window that led to it. Returns the step training continues from.
  int64_t rollback(int64_t step, std::string* checkpoint_dir);
  // The checkpoint after `steps_done` steps (rank 0; "" elsewhere). A periodic one that
  // cannot be written (a full disk) is a warning and training goes on; the final one, or
  // a preemption's, is an error.
  std::string save(int64_t steps_done, bool periodic = false);
  // The result before the first step of this process: counts from the run's own history
  // when it resumed (its first loss, first validation, ...), the final ones too when it
  // was complete already.
  TrainResult result_so_far();

  // ---- one step (trainer_steps.cpp) ----
  // Forward and backward over the step's micro-batches (with the gradient all-reduce of
  // data parallelism): the side values the guard reads, still on the device.
  guard::StepInputs accumulate_step(int64_t step, const StepData& data, double lr);
  // What a snapshot of the current step records besides the guard's own evidence.
  forensics::SnapshotEvidence snapshot_evidence(const guard::StepOutcome& outcome) const;
  // The step's lines: metrics events, progress messages, telemetry. Returns the number
  // of anomaly events.
  int64_t log_step(const guard::StepOutcome& outcome, const StepMetrics& m);
  // Validation loss after `step` steps (rank 0 with validation data; NaN elsewhere).
  double validate(int64_t step);
  // Every rank's telemetry samples into rank 0's metrics.
  void drain_telemetry(int64_t step);
  // What the opening lines of the progress display describe (progress.h's header_lines).
  RunHeader header(int64_t parameters) const;

  // The step's batches and faults (step_source.h), made at the end of build(). Declared
  // last so it is destroyed first: its prefetcher thread reads `cfg`.
  std::unique_ptr<StepSource> source;
};

}  // namespace gradguard::train
