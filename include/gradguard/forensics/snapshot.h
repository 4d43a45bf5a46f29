// Snapshots: the evidence of an anomalous step, kept so it can be studied and replayed.
// A snapshot is a directory snapshots/step-NNNNNNN-<kind>/ in the run directory:
//   model/                 the weights before the step, i.e. the weights that produced the
//                          gradients: model.safetensors, plus config.json when the loop
//                          knows its model's HF config (gradguard's trainer does)
//   optimizer.safetensors  the optimizer state ("exp_avg/<param>", "exp_avg_sq/<param>",
//                          "momentum_buffer/<param>"; step counts in the metadata)
//   gradients.safetensors  the unscaled gradients of the step (after clipping)
//   batch.safetensors      the exact batch when the loop hands it over: inputs and
//                          targets [micro-batches, micro, T] and sample_index
//                          [micro-batches, micro] (global sample numbers)
//   state.json             the step's numbers (time, loss, per-micro-batch losses, norms,
//                          lr, loss scale, the injected fault if any)
//   metrics.jsonl          the last `history` steps of metrics
//   telemetry.jsonl        the telemetry window
//   config.yaml            the effective configuration
//   diagnosis.json / .md   the diagnosis (diagnosis.h)
// When the model's tensors do not fit guard.snapshot.max_mb (at 7B they are over 100 GB)
// and the loop can say where its state came from, the snapshot is a reference snapshot:
// no model/, optimizer or gradients, but reference.json naming the checkpoint the run
// last saved before the step ("checkpoint": "checkpoints/step-N", relative to the run
// directory; "" = the run's start), "from_step", "world_size" and "full_bytes" (what the
// full snapshot would have taken). That checkpoint is kept while a snapshot refers to it
// (pinned_checkpoints), and `replay` re-executes the run from it to the step. The batch,
// state.json, metrics, config and diagnosis are written as always.
//
// It is written into a temporary directory and renamed, so a snapshot is complete or
// absent. SnapshotBudget rate-limits them: a count, a minimum interval and a disk budget
// checked against the size before anything is written.
//
// SnapshotWriter is what a GuardedStep calls on a critical step (its snapshot hook): it
// checks the budget, gathers the guard's own evidence (weights, gradients, optimizer
// state, norms, the detector's view), asks the loop for the rest (the batch, recent
// metrics, telemetry, config), computes the diagnosis and writes the directory. It runs
// only on anomalous steps, so it may read from the device freely.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <nlohmann/json.hpp>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/guard/guard_options.h"
#include "gradguard/guard/guarded_step.h"
#include "gradguard/telemetry/telemetry.h"

namespace gradguard::forensics {

struct SnapshotData {
  int64_t step = 0;
  std::string kind;                          // the primary anomaly's kind
  checkpoint::NamedTensors weights;          // "<param>" -> weights before the step
  // Writes model/ itself (e.g. an HF directory with config.json); empty: weights go to
  // model/model.safetensors.
  std::function<void(const std::string& dir)> write_model;
  checkpoint::NamedTensors optimizer_state;  // "exp_avg/<param>", ...
  std::map<std::string, std::string> optimizer_metadata;  // "step/<param>" -> count
  checkpoint::NamedTensors gradients;        // "<param>" -> gradient
  at::Tensor inputs, targets;                // [micro-batches, micro, T] int64; undefined = no batch
  at::Tensor sample_index;                   // [micro-batches, micro] int64; may be undefined
  at::Tensor positions, segments;            // packed rows (data/token_dataset.h): as inputs; else undefined
  std::string state_json;                    // state.json contents
  std::vector<std::string> metrics_lines;    // oldest first, one JSON object each
  std::vector<std::string> telemetry_lines;  // oldest first
  std::string config_yaml, diagnosis_json, diagnosis_md;
  nlohmann::json reference;                  // null, or reference.json (a reference snapshot)

  int64_t estimated_bytes() const;           // tensor bytes about to be written
};

// Writes the snapshot under `run_dir`/snapshots and returns its directory. Throws
// gradguard::Error (runtime) naming the path when writing fails; nothing partial is left.
std::string write_snapshot(const std::string& run_dir, const SnapshotData& data);

class SnapshotBudget {
 public:
  explicit SnapshotBudget(const guard::SnapshotOptions& options);
  // Whether a snapshot of `bytes` may be written at `step`; `force` (a halt) ignores the
  // interval. Sets *reason when not.
  bool allow(int64_t step, bool force, int64_t bytes, std::string* reason) const;
  void record(int64_t step, int64_t bytes);
  int64_t count() const { return count_; }

  nlohmann::json state_dict() const;
  // Checks every field before it changes anything; throws gradguard::Error (bad input)
  // naming `where` and the field.
  void load_state_dict(const nlohmann::json& state, const std::string& where = "snapshot budget state");

 private:
  guard::SnapshotOptions options_;
  int64_t count_ = 0, bytes_ = 0, last_step_ = -1;
};

// What only the loop knows about a step, asked for when its snapshot is written.
struct SnapshotEvidence {
  at::Tensor inputs, targets, sample_index;        // the batch (see SnapshotData); may be undefined
  at::Tensor positions, segments;                  // packed rows only
  std::vector<std::string> metrics_lines;          // recent metrics.jsonl lines, oldest first
  std::vector<telemetry::Sample> telemetry;        // the sampler's window
  std::string config_yaml;                         // the effective configuration ("" = none)
  nlohmann::ordered_json state = nlohmann::ordered_json::object();  // extra fields for state.json
};

class SnapshotWriter {
 public:
  // `evidence` is called with the outcome of the step being written (may be empty);
  // `write_model` see SnapshotData.
  // `reference`: reference.json's checkpoint, from_step and world_size for a step, or
  // null when there is none (then a snapshot over budget is skipped).
  SnapshotWriter(std::string run_dir, const guard::SnapshotOptions& options,
                 std::function<SnapshotEvidence(const guard::StepOutcome&)> evidence = {},
                 std::function<void(const std::string& dir)> write_model = {},
                 std::function<nlohmann::json(int64_t step)> reference = {});

  // The GuardedStep snapshot hook (guard::StepHooks::snapshot). A write that fails is
  // reported in the result (skipped = the reason), not thrown: the step goes on.
  guard::SnapshotResult operator()(const guard::GuardedStep& step, const guard::StepOutcome& outcome, bool force);

  const SnapshotBudget& budget() const { return budget_; }
  SnapshotBudget& budget() { return budget_; }

 private:
  std::string run_dir_;
  SnapshotBudget budget_;
  std::function<SnapshotEvidence(const guard::StepOutcome&)> evidence_;
  std::function<void(const std::string&)> write_model_;
  std::function<nlohmann::json(int64_t)> reference_;
};

// Names of the checkpoint directories (step-N) that reference snapshots of the run refer
// to: checkpoint pruning keeps them.
std::set<std::string> pinned_checkpoints(const std::string& run_dir);

}  // namespace gradguard::forensics
