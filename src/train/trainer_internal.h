// Trainer::State, shared by the files of the trainer: trainer.cpp (the step loop),
// trainer_setup.cpp (building the run, resume and rollback state) and trainer_steps.cpp
// (the pieces of one step the loop calls: its batches, the accumulation, logging).
// Private to src/train.
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
#include "gradguard/data/prefetcher.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/dist/communicator.h"
#include "gradguard/dist/grad_shard_sync.h"
#include "gradguard/dist/grad_sync.h"
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

namespace gradguard::train {

// One step's batches and the fault injected into it (if any).
struct StepData {
  data::StepBatches batches;  // this rank's micro-batches
  std::string injected;       // "spike_batch" | "nonfinite_gradients" | ""
  bool spike = false;         // the batch was replaced by random tokens
  bool corrupt = false;       // this rank puts an inf into its gradients
};

struct Trainer::State {
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
  int64_t start_step = 0;          // first step to run (> 0 after a resume)
  bool complete = false;           // a resumed run whose checkpoint is at schedule.total_steps
  std::vector<std::string> resume_notes;  // what the resume did, for the progress display
  std::string length_note;                // how schedule.epochs became total_steps, for the header
  // The newest checkpoint this run saved or resumed from (step, directory); step -1 =
  // none yet, which a resumed run never is. A reference snapshot names it
  // (forensics/snapshot.h).
  std::pair<int64_t, std::string> last_checkpoint{-1, ""};
  // Trainer::run_until: the last step to run (-1 = all) and what sees the model before it.
  int64_t last_step = -1;
  std::function<void(model::LlamaForCausalLMImpl&)> before_last;

  // Data parallelism (world_size > 1): rank 0 writes the run directory (metrics,
  // checkpoints, snapshots); every rank trains on its shard and sums gradients.
  dist::DistEnv env;
  std::unique_ptr<dist::Communicator> comm;  // null for a single process
  std::unique_ptr<dist::GradSync> sync;      // null for a single process and with ZeRO-2
  std::unique_ptr<dist::GradShardSync> shard_sync;  // ZeRO-2 on several ranks (memory.zero_stage 2), else null
  bool distributed() const { return sync || shard_sync; }
  bool main_rank() const { return env.rank == 0; }
  // Slots of the side vector summed over the ranks (with the gradients' last bucket; with
  // ZeRO-2 in the guard's statistics all-reduce): [loss | micro losses by global
  // micro-batch g = m * world + rank (world x accum) | first-micro-batch squared norm by
  // rank (world) | stop requests (each rank adds 1 when it received SIGTERM/SIGINT) | z-loss].
  int64_t side_slots() const { return 1 + env.world_size * cfg.batch.accum_steps + env.world_size + 2; }

  // The guard, and what it writes.
  std::unique_ptr<guard::GuardedStep> guarded;
  std::unique_ptr<forensics::SnapshotWriter> snapshots;  // rank 0 only
  std::unique_ptr<telemetry::Sampler> sampler;           // null when telemetry is off
  int64_t data_offset = 0;    // steps of data skipped by rollbacks: step s reads the data of s + data_offset
  int64_t furthest_step = -1; // furthest step run so far: an injected fault happens once, not again after a rollback
  const StepData* current = nullptr;  // the step being guarded (for its snapshot)
  // Whether the loop must stop after step `step` because a process of the run received
  // SIGTERM/SIGINT: all ranks learn it from the step's one read (the side vector).
  bool stop_after(const guard::StepOutcome& outcome) const;
  MetricsWriter* metrics = nullptr;   // set while run() is running
  Progress* progress = nullptr;       // set while run() is running
  int64_t anomalies_seen = 0;         // anomaly events of this process's steps (the progress line)

  // ---- setup (trainer_setup.cpp) ----
  // The model, data, optimizer and guard (every rank); the fresh run directory with
  // config.yaml (rank 0).
  void build();
  void create_run_dir();
  optim::LrSchedule schedule() const;
  // trainer_state.json of a checkpoint taken after `steps_done` steps.
  nlohmann::ordered_json trainer_state(int64_t steps_done) const;
  // Restores model, optimizer, RNG and the guard from checkpoint `dir`; `scope` says how
  // much of the guard. Returns the step.
  int64_t restore(const std::string& dir, guard::RestoreScope scope);
  // After a checkpoint's tensors are in: throws gradguard::Error (bad input) naming the
  // file when a weight or an optimizer moment is not finite, or a second moment negative.
  void check_loaded_values(const std::string& dir) const;
  // Every rank reports how `phase` went (its exception, or none) and learns whether the
  // others failed; rethrows this rank's own error. No-op for a single process.
  void agree(const std::string& phase, const std::exception_ptr& error);
  // Rolls back to the newest good checkpoint after an anomaly at `step` and skips the
  // data window that led to it. Returns the step training continues from.
  int64_t rollback(int64_t step, std::string* checkpoint_dir);
  // The checkpoint after `steps_done` steps (rank 0; "" elsewhere). A periodic one that
  // cannot be written (a full disk) is a warning and training goes on; the final one, or
  // a preemption's, is an error.
  std::string save(int64_t steps_done, bool periodic = false);

  // ---- one step (trainer_steps.cpp) ----
  // The micro-batches of `step` reading the data of step `step + data_offset`
  // (data::step_batches) for `rank`, with an injected spike applied where
  // guard.inject.rank says. rank -1: every rank's, in global order g = m * world + rank
  // (what a snapshot records). Reads only what is fixed after build() (config, rank
  // layout, the dataset), so the prefetcher may call it on its thread.
  data::StepBatches micro_batches(int64_t step, int64_t data_offset, bool inject_spike, int64_t rank) const;
  // The prefetcher's key for `step`: everything micro_batches() reads that changes.
  static data::BatchPrefetcher::Key batch_key(int64_t step, int64_t data_offset, bool inject_spike) {
    return {step, data_offset, inject_spike ? 1 : 0};
  }
  // This step's batches (prefetched during the previous step) and faults; starts
  // building the next step's.
  StepData next_step_data(int64_t step);
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
  // The opening lines of the progress display: the run, warnings, resume notes.
  std::vector<std::string> header(int64_t parameters) const;
  // The result before the first step of this process: counts from the run's own history
  // when it resumed (its first loss, first validation, ...), the final ones too when it
  // was complete already.
  TrainResult result_so_far();

  // Builds this rank's micro-batches of step N+1 while step N computes (micro_batches()
  // on a background thread, keyed by batch_key()). Declared last so it is destroyed
  // first: its thread calls micro_batches(), which reads the members above.
  std::unique_ptr<data::BatchPrefetcher> prefetcher;
};

}  // namespace gradguard::train
