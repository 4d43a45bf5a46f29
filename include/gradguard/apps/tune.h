// `gradguard tune`: the progressive tuning procedure for large-batch stability, automated.
// Short probe runs (each a child `gradguard train`, bench/child_process.h) at a small
// batch sweep, one knob at a time and in this order:
//   1. clip.max_norm        (from 0.3 up)
//   2. warmup fraction      (schedule.warmup_steps as a share of the probe's steps)
//   3. learning-rate scale  (multiples of optim.lr)
// then the batch grows by a factor per round (the LR following sqrt of the growth, as
// for Adam-type optimizers), while its gradients behave: a round is accepted only while
// the probe stays stable and the batch has not outgrown the measured gradient noise
// scale by more than noise_ratio.
//
// Choosing: a probe is unstable when its child halted or failed, when a step was skipped
// or rolled back, when the guard reported a critical anomaly, or when its loss ends
// non-finite. Candidates are listed from the safest to the boldest (lowest clip, longest
// warmup, lowest LR); among the stable ones the safest whose final smoothed loss is
// within `tolerance` of the best is chosen, so safety is bought for at most that much
// loss at equal steps. Every probe, its numbers and the reason for each choice go into
// tune.md / tune.json; the recommendation into tune.yaml (a complete config).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::config {
struct Config;
}

namespace gradguard::tune {

struct TuneOptions {
  std::string config_path;                        // base config ("" = built-in default)
  std::vector<std::string> overrides;             // key=value applied to the base config
  std::string out_dir = "runs/tune";              // probes/, tune.md, tune.json, tune.yaml
  int64_t probe_steps = 60;                       // optimizer steps per probe (>= 4)
  int64_t start_batch = 0;                        // sequences per step of the sweeps; 0 = global_batch / 4
  int64_t max_batch = 0;                          // largest batch tried when growing; 0 = 2 x global_batch
  double growth = 2;                              // batch factor per growth round (>= 2, integer)
  std::vector<double> clip_values = {0.3, 0.5, 0.8, 1.0};   // ascending: safest first
  std::vector<double> warmup_fractions = {0.1, 0.05, 0.02};  // descending: safest first
  std::vector<double> lr_scales = {0.5, 1.0, 2.0};           // ascending: safest first
  double tolerance = 0.01;                        // relative loss a safer choice may cost
  double noise_ratio = 10;                        // stop growing past this x B_simple; 0 disables
  std::string executable;                         // the gradguard binary; "" = this process's
  bool overwrite = false;                         // reuse an out_dir that holds results
  // The device the recommended run is for (`gradguard plan`'s names; "" = none) or its
  // memory in GB, and how many of them: the recommendation then carries the micro-batch
  // (and activation checkpointing) that fits there by plan's estimate.
  std::string device;
  double memory_gb = 0;
  int64_t gpus = 1;
  void validate() const;
};

struct Probe {
  std::string phase;          // clip | warmup | lr | batch
  std::string name;           // probes/<name>
  std::vector<std::string> settings;  // the overrides that distinguish it
  int exit_code = 0;
  int64_t steps = 0, skipped = 0, rollbacks = 0, critical = 0, spikes = 0;
  int64_t global_batch = 0;
  double final_loss = 0;      // EMA(0.9) of the loss over the run (NaN if it diverged)
  double fluctuation = 0;     // as in bench seed
  double clip_fraction = 0;   // share of steps whose clip coefficient was < 1
  double noise_scale = 0;     // median B_simple (sequences); NaN when not measured
  double samples_per_s = 0;
  double wall_s = 0;
  bool stable = false;
  std::string verdict;        // why it is unstable, or "stable"
};

struct TuneResult {
  std::vector<Probe> probes;
  std::vector<std::string> decisions;       // one sentence per phase
  std::vector<std::string> recommendation;  // the chosen overrides (key=value)
  std::string yaml;                         // the complete recommended config
  std::string markdown() const;
  nlohmann::ordered_json to_json() const;
};

// Reads one probe's metrics.jsonl into the Probe's measured fields. Throws
// gradguard::Error (bad input) naming the file when it holds no step lines.
void analyse_probe(const std::string& metrics_path, Probe* probe);

// The recommended run against memory, by the estimate `gradguard plan` and doctor's
// "memory.plan" use (apps/plan.h): with o.device or o.memory_gb, the micro-batch x
// accumulation that fits o.gpus of that device for the recommended global batch is
// appended to `recommendation` (batch.micro_batch=, and model.activation_checkpointing=true
// when it needs it); without either, the run is measured against nothing and only its
// estimate on this CPU is reported. Returns the decision sentence for tune.md.
std::string memory_decision(const config::Config& recommended, const TuneOptions& o,
                            std::vector<std::string>* recommendation);

// Runs the procedure (progress lines to `progress`), writes tune.md, tune.json and
// tune.yaml into out_dir and returns the result. Throws gradguard::Error (bad input) for
// bad options or a base config the trainer rejects (before any probe runs), and when the
// sweeps find no stable probe at all (the evidence is written first).
TuneResult run_tune(const TuneOptions& options, std::FILE* progress);

}  // namespace gradguard::tune
