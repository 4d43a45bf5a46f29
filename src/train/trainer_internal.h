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
#include "gradguard/data/token_dataset.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/guard/detector.h"
#include "gradguard/guard/noise_scale.h"
#include "gradguard/guard/recovery.h"
#include "gradguard/guard/snapshot.h"
#include "gradguard/model/llama.h"
#include "gradguard/telemetry/telemetry.h"
#include "gradguard/train/metrics.h"
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

  // The micro-batches of `step` (DESIGN.md order, shifted by data_offset), with an
  // injected spike applied; fills `sample_index` [accum, micro].
  std::vector<data::Batch> micro_batches(int64_t step, bool inject_spike, at::Tensor* sample_index) const;

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
  // Rolls back to the newest good checkpoint after an anomaly at `step` and skips the
  // data window that led to it. Returns the step training continues from.
  int64_t rollback(int64_t step, std::string* checkpoint_dir);
};

}  // namespace gradguard::train
