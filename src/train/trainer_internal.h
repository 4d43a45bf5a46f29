// Trainer::State, shared by the two files of the trainer: trainer.cpp (setup and the
// step loop) and guard_actions.cpp (what happens on an anomaly: the snapshot with its
// diagnosis, the recovery actions, rollback). Private to src/train.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/amp/loss_scaler.h"
#include "gradguard/config/config.h"
#include "gradguard/core/threads.h"
#include "gradguard/data/prefetcher.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/dist/communicator.h"
#include "gradguard/dist/grad_sync.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/guard/detector.h"
#include "gradguard/guard/noise_scale.h"
#include "gradguard/guard/recovery.h"
#include "gradguard/guard/snapshot.h"
#include "gradguard/model/llama.h"
#include "gradguard/telemetry/telemetry.h"
#include "gradguard/train/metrics.h"
#include "gradguard/train/step.h"
#include "gradguard/train/trainer.h"

namespace gradguard::train {

// What the anomaly handling needs to know about the step being judged.
struct StepRecord {
  int64_t step = 0;
  double lr = 0;
  double loss_scale = 1;
  std::string injected;              // fault injected at this step ("" = none)
  std::vector<data::Batch> micro;    // [micro-batch] the exact tokens
  at::Tensor sample_index;           // [accum, micro] global sample numbers
  std::vector<double> micro_losses;  // [micro-batch]
  const grad::GradStats* stats = nullptr;
  grad::ClipResult clip;
};

struct Trainer::State {
  config::Config cfg;
  std::FILE* out = stdout;
  torch::Device device = torch::kCPU;
  std::string run_dir;
  ThreadReport threads;
  model::LlamaForCausalLM model{nullptr};
  std::shared_ptr<data::TokenDataset> train, val;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;  // [tensor] HF parameter names, parallel to params
  std::unique_ptr<amp::LossScaler> scaler;
  std::unique_ptr<grad::GradStatsComputer> stats;
  std::unique_ptr<grad::Clipper> clipper;
  double peak_lr = 0;                     // optim.lr after the batch-size scaling rule
  int64_t start_step = 0;                 // first step to run (> 0 after a resume)
  std::vector<std::string> resume_notes;  // what the resume did, for the progress display

  // Data parallelism (world_size > 1): rank 0 writes the run directory (metrics,
  // checkpoints, snapshots); every rank trains on its shard and sums gradients.
  dist::DistEnv env;
  std::unique_ptr<dist::Communicator> comm;  // null for a single process
  std::unique_ptr<dist::GradSync> sync;      // null for a single process
  bool main_rank() const { return env.rank == 0; }
  // Slots of the side vector summed with the gradients: [loss | micro losses by global
  // micro-batch g = m * world + rank | first-micro-batch squared norm by rank].
  int64_t side_slots() const { return 1 + env.world_size * cfg.batch.accum_steps + env.world_size; }
  // This rank's side vector [side_slots()] from its accumulation (zeros in the other
  // ranks' slots, so the sum over ranks gathers them). Stays on the device.
  at::Tensor side_values(const Accumulation& partial) const;

  // The guard.
  std::unique_ptr<guard::AnomalyDetector> detector;
  std::unique_ptr<guard::RecoveryLadder> ladder;
  std::unique_ptr<guard::SnapshotBudget> snapshots;
  std::unique_ptr<guard::NoiseScaleEstimator> noise;
  std::unique_ptr<telemetry::Sampler> sampler;  // null when telemetry is off
  int64_t data_offset = 0;        // steps of data skipped by rollbacks: step s reads the data of s + data_offset
  int64_t last_scale_growth = -1; // step the loss scale last grew
  int64_t furthest_step = -1;     // furthest step run so far: an injected fault happens once, not again after a rollback
  std::deque<double> recent_norms, recent_seconds;  // [last 50 steps] for the diagnosis
  MetricsWriter* metrics = nullptr;  // set while run() is running

  // The micro-batches of `step` reading the data of step `step + data_offset`
  // (DESIGN.md order, data::step_batches) for `rank`, with an injected spike applied
  // where guard.inject.rank says. rank -1: every rank's, in global order
  // g = m * world + rank ([accum * world] micro-batches: what a snapshot records).
  // Reads only what is fixed after build() (config, rank layout, the dataset), never
  // data_offset itself, so the prefetcher may call it on its thread.
  data::StepBatches micro_batches(int64_t step, int64_t data_offset, bool inject_spike, int64_t rank) const;
  // The prefetcher's key for `step`: everything micro_batches() reads that changes
  // during a run.
  static data::BatchPrefetcher::Key batch_key(int64_t step, int64_t data_offset, bool inject_spike) {
    return {step, data_offset, inject_spike ? 1 : 0};
  }

  // Setup steps of the constructor: the model, data, optimizer and guard (every rank);
  // the fresh run directory with config.yaml (rank 0).
  void build();
  void create_run_dir();

  // trainer_state.json of a checkpoint taken after `steps_done` steps.
  nlohmann::ordered_json trainer_state(int64_t steps_done) const;
  // Restores model, optimizer, scaler, clipper, RNG and the detector's windows from
  // checkpoint `dir`; with `with_guard` (a resume) also the recovery budgets, snapshot
  // count, noise-scale state and the data offset. Returns the step.
  int64_t restore(const std::string& dir, bool with_guard);

  // Writes the snapshot of an anomalous step if the budget allows; returns its directory
  // or "" with the reason in *why.
  std::string take_snapshot(const StepRecord& rec, const guard::Verdict& verdict, bool force, std::string* why);
  // Zeroes the optimizer moments of the tensors of `layers` (all tensors when empty);
  // returns how many tensors had state.
  int64_t reset_moments(const std::vector<std::string>& layers);
  // Every rank reports how `phase` went (its exception, or none) and learns whether the
  // others failed; rethrows this rank's own error. No-op for a single process.
  void agree(const std::string& phase, const std::exception_ptr& error);
  // Rolls back to the newest good checkpoint after an anomaly at `step` and skips the
  // data window that led to it. Returns the step training continues from.
  int64_t rollback(int64_t step, std::string* checkpoint_dir);

  // Builds this rank's micro-batches of step N+1 while step N computes (micro_batches()
  // on a background thread, keyed by batch_key()). Declared last so it is destroyed
  // first: its thread calls micro_batches(), which reads the members above.
  std::unique_ptr<data::BatchPrefetcher> prefetcher;
};

}  // namespace gradguard::train
