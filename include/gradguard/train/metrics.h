// metrics.jsonl: one JSON object per line, appended and flushed as each step finishes so
// a crash loses at most the line being written and `tail -f` shows progress live.
#pragma once

#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gradguard/guard/guarded_step.h"
#include "gradguard/telemetry/telemetry.h"

namespace gradguard::telemetry {
class EventWriter;
}

namespace gradguard::train {

// The fields docs/design.md promises for every optimizer step.
struct StepMetrics {
  int64_t step = 0;          // 0-based optimizer step
  double loss = 0;           // mean target-token loss of the global batch (nats/token)
  double lr = 0;             // learning rate used at this step
  double grad_norm = 0;      // global L2 norm of the unscaled gradients before clipping
  double clip_coef = 1;      // global norm after clipping / before
  double clip_threshold = 0; // threshold the clipping strategy used (inf: none)
  double loss_scale = 1;     // loss scale in effect (1 without dynamic scaling)
  bool skipped = false;      // the optimizer step was not applied
  int64_t tokens = 0;        // target tokens in this step's global batch
  double tokens_per_s = 0;   // tokens / wall time of this step
  double elapsed_s = 0;      // wall time since training started
  double noise_scale = std::numeric_limits<double>::quiet_NaN();  // B_simple estimate (sequences); NaN = not measured
  double z_loss = std::numeric_limits<double>::quiet_NaN();  // the z-loss term (loss.z_loss); NaN = off
  std::string compute_dtype;  // set while a precision fallback computes wider than amp.dtype
  std::vector<std::pair<std::string, double>> layer_grad_norms;  // [layer group] unscaled L2 norm
  guard::Forecast forecast;                   // grad_norm against its forecast (guard/forecast.h)
  std::vector<std::string> forecast_layers;   // layer groups above their own forecast band
};

// The step fields of a guarded step's outcome (tokens, tokens_per_s and elapsed_s are
// the loop's to fill in); `layer_names` label the per-layer norms ([layer group]).
StepMetrics step_metrics(const guard::StepOutcome& outcome, const std::vector<std::string>& layer_names);

class MetricsWriter {
 public:
  // Opens `path` for appending ("" = write nothing, keep only recent()). Throws
  // gradguard::Error naming the path on failure.
  // `keep_recent`: how many of the last lines recent() returns (for snapshots).
  // `tensorboard`: also write every line's scalars into a new TensorBoard event file
  // beside `path` (report/tensorboard.h has the tag mapping), flushed per line so
  // `tensorboard --logdir runs` follows the run live.
  explicit MetricsWriter(const std::string& path, size_t keep_recent = 0, bool tensorboard = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write_step(const StepMetrics& m);
  void write_validation(int64_t step, double val_loss);
  // {"step": step, "event": "telemetry", ...the sample's fields} (telemetry::to_json);
  // with rank >= 0 (a data-parallel run) also "rank" after "event".
  void write_telemetry(int64_t step, const telemetry::Sample& sample, int64_t rank = -1);
  // The same line from a sample already in JSON form (another rank's, sent as text).
  void write_telemetry(int64_t step, const nlohmann::ordered_json& fields, int64_t rank = -1);
  void write(const nlohmann::ordered_json& line);  // any other event line
  // The event lines of a guarded step, in the order they happened: the skip of a step
  // with non-finite gradients, every anomaly, the recovery decision (with its snapshot),
  // the noise-scale warning. Returns the number of anomaly lines.
  int64_t write_events(const guard::StepOutcome& outcome, int64_t global_batch);
  std::vector<std::string> recent() const { return {recent_.begin(), recent_.end()}; }  // oldest first
  std::string events_path() const;  // the TensorBoard event file ("" = none)

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  size_t keep_recent_ = 0;
  std::deque<std::string> recent_;  // [last keep_recent_ lines] without the newline
  std::unique_ptr<telemetry::EventWriter> events_;  // null without tensorboard
};

}  // namespace gradguard::train
