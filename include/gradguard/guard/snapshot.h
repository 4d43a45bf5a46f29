// Snapshots: the evidence of an anomalous step, kept so it can be studied and replayed.
// A snapshot is a directory snapshots/step-NNNNNNN-<kind>/ in the run directory:
//   model/                 the weights before the step (an HF directory: config.json +
//                          model.safetensors), i.e. the weights that produced the gradients
//   optimizer.safetensors  the optimizer state ("exp_avg/<param>", "exp_avg_sq/<param>",
//                          "momentum_buffer/<param>"; step counts in the metadata)
//   gradients.safetensors  the unscaled gradients of the step (after clipping)
//   batch.safetensors      the exact token ids: inputs and targets [accum, micro, T] and
//                          sample_index [accum, micro] (global sample numbers)
//   state.json             the step's numbers (loss, per-micro-batch losses, norms, lr,
//                          loss scale, the injected fault if any)
//   metrics.jsonl          the last `history` steps of metrics
//   telemetry.jsonl        the telemetry window
//   config.yaml            the effective configuration
//   diagnosis.json / .md   the diagnosis (diagnosis.h)
// It is written into a temporary directory and renamed, so a snapshot is complete or
// absent. SnapshotBudget rate-limits them: a count, a minimum interval and a disk budget
// checked against the size before anything is written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/guard/guard_options.h"
#include "gradguard/model/llama.h"

namespace gradguard::guard {

struct SnapshotData {
  int64_t step = 0;
  std::string kind;                          // the primary anomaly's kind
  model::LlamaForCausalLMImpl* model = nullptr;
  checkpoint::NamedTensors optimizer_state;  // "exp_avg/<param>", ...
  std::map<std::string, std::string> optimizer_metadata;  // "step/<param>" -> count
  checkpoint::NamedTensors gradients;        // "<param>" -> gradient
  at::Tensor inputs, targets;                // [accum, micro, T] int64
  at::Tensor sample_index;                   // [accum, micro] int64
  std::string state_json;                    // state.json contents
  std::vector<std::string> metrics_lines;    // oldest first, one JSON object each
  std::vector<std::string> telemetry_lines;  // oldest first
  std::string config_yaml, diagnosis_json, diagnosis_md;

  int64_t estimated_bytes() const;           // tensor bytes about to be written
};

// Writes the snapshot under `run_dir`/snapshots and returns its directory. Throws
// gradguard::Error (runtime) naming the path when writing fails; nothing partial is left.
std::string write_snapshot(const std::string& run_dir, const SnapshotData& data);

class SnapshotBudget {
 public:
  explicit SnapshotBudget(const SnapshotOptions& options);
  // Whether a snapshot of `bytes` may be written at `step`; `force` (a halt) ignores the
  // interval. Sets *reason when not.
  bool allow(int64_t step, bool force, int64_t bytes, std::string* reason) const;
  void record(int64_t step, int64_t bytes);
  int64_t count() const { return count_; }

  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);  // throws gradguard::Error (bad input)

 private:
  SnapshotOptions options_;
  int64_t count_ = 0, bytes_ = 0, last_step_ = -1;
};

}  // namespace gradguard::guard
