// GuardCore: what the Python module's Guard (python/gradguard/guard.py) holds on the C++
// side -- one guard::GuardedStep built from a validated config::Config, with the hooks a
// PyTorch loop can give it (Python callables wrapped here), a forensics::SnapshotWriter
// and a train::MetricsWriter on the run directory. It is the same assembly as the
// trainer's (src/train/trainer_setup.cpp) minus what only the trainer has: the model,
// the data, the optimizer step (a Python loop applies `outcome.applied` itself) and the
// checkpoints (the loop keeps its own; `rollback_available` asks it).
//
// Host reads: step() makes the GuardedStep's one read and nothing else; metrics and
// snapshots work on the host values it returned (a snapshot, written only on a critical
// step, may read the device freely).
//
// Every Python callable runs on the calling thread with the GIL held: step() is called
// from Python and does not release it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <pybind11/pybind11.h>

#include "gradguard/config/config.h"
#include "gradguard/forensics/snapshot.h"
#include "gradguard/guard/guarded_step.h"
#include "gradguard/train/metrics.h"

namespace gradguard::python {

// The Python Guard's constructor arguments that are not tensors or callables.
struct GuardCoreOptions {
  std::vector<std::string> overrides;  // "section.key=value" (value as YAML), like --set
  std::string run_dir;                 // "" = write nothing (metrics, snapshots, config.yaml)
  bool main_rank = true;               // only the main rank (0) writes files
  int64_t world_size = 1;              // ranks of torch.distributed (1 without it)
  int64_t warmup_steps = -1;           // the loop's warmup; -1 = schedule.warmup_steps
  double peak_lr = -1;                 // the loop's peak lr; < 0 = optim.lr
  int64_t global_batch = 0;            // sequences per step (events, noise scale); 0 = batch.global_batch
  int64_t tokens_per_step = 0;         // metrics "tokens" when step() gets none; 0 = global_batch x data.seq_len
  bool resume = false;                 // append to the run directory's metrics instead of starting it
};

// The loop's Python callables; each may be None.
struct GuardCoreCallbacks {
  pybind11::object moments;             // (i) -> (exp_avg, exp_avg_sq, momentum_buffer, step) of params[i]
  pybind11::object reset_moments;       // (i) -> bool: forget params[i]'s optimizer state
  pybind11::object rollback_available;  // () -> bool: a checkpoint to roll back to exists (same on every rank)
  pybind11::object write_model;         // (dir) -> None: writes a snapshot's model/ directory
};

// The step's side values and evidence as the Python Guard hands them over.
struct CoreStepInputs {
  guard::StepInputs inputs;           // loss, micro losses, noise sample, lr, injected
  at::Tensor batch_inputs, batch_targets, batch_sample_index;  // for a snapshot; may be undefined
  int64_t tokens = 0;                 // target tokens of the global batch; 0 = the default
};

// One step's outcome with what its Python view needs to name things.
struct CoreOutcome {
  guard::StepOutcome outcome;
  std::shared_ptr<const std::vector<std::string>> param_names;  // [tensor]
  std::shared_ptr<const std::vector<std::string>> layer_names;  // [layer group]
  std::vector<int64_t> reset_tensors;  // [k] tensors a reset_moments decision names
  int64_t host_reads = -1;             // filled in by the Python side when it counts them
};

class GuardCore {
 public:
  // Throws gradguard::Error (bad input) naming the key for a bad override, and for a
  // run directory that already holds a run (unless resume or run.overwrite).
  GuardCore(std::vector<at::Tensor> params, std::vector<std::string> names, GuardCoreOptions options,
            GuardCoreCallbacks callbacks);
  ~GuardCore();
  GuardCore(const GuardCore&) = delete;
  GuardCore& operator=(const GuardCore&) = delete;

  double loss_scale() const { return guarded_->loss_scale(); }
  double lr_factor(int64_t step) const { return guarded_->lr_factor(step); }
  // amp.dtype, made wider while the recovery ladder's precision fallback lasts.
  std::string compute_dtype(int64_t step) const {
    return name_of(guarded_->compute_dtype(step, config().amp.dtype));
  }
  // Whether `step` is one whose noise-scale sample the guard uses.
  bool noise_due(int64_t step) const;

  // The guarded step on the gradients in .grad, then (main rank) its metrics lines.
  // One device->host read.
  CoreOutcome step(int64_t step, const CoreStepInputs& in);

  void write_validation(int64_t step, double val_loss);
  void write_event(const std::string& json_object);  // one metrics.jsonl line (a JSON object)

  // The guard's state (GuardedStep::state_dict plus the snapshot budget) as JSON text,
  // and back; `rollback`: restore only what describes the weights (RestoreScope).
  std::string state_dict() const;
  void load_state_dict(const std::string& json, bool rollback);

  const config::Config& config() const { return cfg_; }
  const std::vector<std::string>& layer_names() const { return guarded_->groups().names; }
  const std::vector<std::string>& param_names() const { return *param_names_; }
  const std::string& run_dir() const { return options_.run_dir; }
  std::string metrics_path() const;
  int64_t global_batch() const { return global_batch_; }
  int64_t tokens_per_step() const { return tokens_per_step_; }

 private:
  forensics::SnapshotEvidence evidence(const guard::StepOutcome& out) const;

  GuardCoreOptions options_;
  GuardCoreCallbacks callbacks_;
  config::Config cfg_;
  std::shared_ptr<const std::vector<std::string>> param_names_;
  int64_t global_batch_ = 0, tokens_per_step_ = 0;
  std::unique_ptr<train::MetricsWriter> metrics_;
  std::unique_ptr<forensics::SnapshotWriter> snapshots_;  // main rank with a run directory
  std::unique_ptr<guard::GuardedStep> guarded_;
  const CoreStepInputs* current_ = nullptr;  // the step being guarded (for its snapshot)
  std::vector<int64_t> reset_tensors_;       // filled by the reset_moments hook during step()
  std::chrono::steady_clock::time_point start_, last_end_;
};

}  // namespace gradguard::python
