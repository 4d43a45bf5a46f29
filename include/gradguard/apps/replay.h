// Replay: re-execute the step recorded in a snapshot from its weights and its exact
// batch, and say whether the anomaly reproduces. If it does, the anomaly is a
// deterministic consequence of those weights and that data (a bad batch or a numerical
// weakness: fix the data or the numerics). If it does not, the recorded step differed
// from what the same inputs give now: non-determinism or a hardware fault (or a fault
// injected on purpose, which replay does not re-inject and says so).
//
// A reference snapshot (forensics/snapshot.h: a model too large for the snapshot budget)
// holds no weights: replay resumes the run from the checkpoint it names in a scratch
// directory, re-executes the steps up to the recorded one and compares that step as the
// trainer ran it (bit for bit on the CPU in fp32); the breakdown below runs on the
// re-executed weights just before it. It needs the run directory's checkpoint and data
// where the run had them, and one process.
//
// Each micro-batch is re-run on its own, so the report gives per-micro-batch losses and
// gradient norms; the micro-batch with the largest gradient is then taken apart sample
// by sample (one backward per sample) to name the samples that drive the spike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::replay {

struct ReplayOptions {
  double rtol = 1e-3;         // relative tolerance for "the same" loss and gradient norm; > 0
  std::string device = "cpu"; // where to replay: cpu | cuda | cuda:N
  int64_t top_samples = 5;    // samples named in the report; 0 skips the per-sample pass
};

struct MicroReplay {
  int64_t index = 0;
  double loss = 0;           // mean token loss of the micro-batch
  double recorded_loss = 0;  // as recorded (NaN if unknown)
  double grad_norm = 0;      // L2 norm of the micro-batch's mean gradient
  double loss_zscore = 0;    // against the other micro-batches
};

struct SampleReplay {
  int64_t micro = 0, row = 0;
  int64_t sample_index = 0;  // global sample number (data order of docs/design.md)
  double loss = 0;           // mean token loss of the sample
  double grad_norm = 0;      // L2 norm of the sample's mean gradient
};

struct ReplayReport {
  std::string snapshot;
  int64_t step = 0;
  std::string kind;               // the recorded anomaly
  bool reproduced = false;
  std::string verdict;            // reproduced | not_reproduced
  std::string explanation;
  double loss = 0, recorded_loss = 0;
  double grad_norm = 0, recorded_grad_norm = 0;
  bool nonfinite = false, recorded_nonfinite = false;
  std::string injected;           // the recorded injected fault ("" = none)
  // What was re-executed: "the snapshot's weights", or for a reference snapshot the
  // checkpoint and the steps run again from it.
  std::string replayed_from;
  bool exact = false;             // loss and gradient norm equal the recorded ones bit for bit
  std::vector<MicroReplay> micro;
  int64_t driving_micro = 0;      // micro-batch with the largest gradient norm
  std::vector<SampleReplay> samples;  // top samples of driving_micro by gradient norm

  nlohmann::ordered_json to_json() const;
  std::string to_text() const;
};

// Replays snapshot directory `dir`. Throws gradguard::Error (bad input) naming the file
// when the snapshot is incomplete or malformed. Writes nothing; the caller decides.
ReplayReport replay_snapshot(const std::string& dir, const ReplayOptions& options = {});

}  // namespace gradguard::replay
