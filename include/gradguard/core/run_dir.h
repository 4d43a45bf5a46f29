// The layout of a run directory, in one place. Every file a run writes or a tool reads
// is named here, so the trainer, the library loops, report, export, replay and resume
// agree on it:
//
//   runs/<name>/
//     config.yaml                      the effective configuration
//     metrics.jsonl                    one JSON line per step and per event
//     events.out.tfevents.*            TensorBoard event files
//     report.html, steps.csv, telemetry.csv   written by `gradguard report` / at the end
//     checkpoints/step-NNNNNNN/        checkpoints; checkpoints/latest names the newest
//     snapshots/step-NNNNNNN-<kind>/   evidence of anomalous steps
//     .lock                            held (flock) by the process training the run
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradguard {

class RunDir {
 public:
  explicit RunDir(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string config() const { return root_ + "/config.yaml"; }
  std::string metrics() const { return root_ + "/metrics.jsonl"; }
  std::string report() const { return root_ + "/report.html"; }
  std::string steps_csv() const { return root_ + "/steps.csv"; }
  std::string telemetry_csv() const { return root_ + "/telemetry.csv"; }
  std::string checkpoints() const { return root_ + "/checkpoints"; }
  std::string latest_checkpoint_link() const { return checkpoints() + "/latest"; }
  std::string checkpoint(int64_t step) const;  // checkpoints/step-NNNNNNN
  std::string snapshots() const { return root_ + "/snapshots"; }
  std::string lock() const { return root_ + "/.lock"; }

  // TensorBoard event files are named events.out.tfevents.<time>.<host>.<pid>.
  static constexpr const char* kEventsPrefix = "events.out.tfevents.";
  std::vector<std::string> event_files() const;  // those in the run directory, sorted

  // A run lives here: metrics.jsonl or config.yaml exists.
  bool holds_run() const;
  // Removes everything a run writes (not the lock), so a new run starts clean.
  void clear_outputs() const;

 private:
  std::string root_;
};

}  // namespace gradguard
