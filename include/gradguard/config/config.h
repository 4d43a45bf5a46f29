// The effective configuration of a run: every component's options struct, filled from
// the built-in defaults, then a YAML file, then `--set key.path=value` overrides, and
// validated as a whole. This is the only place that looks options up by string; every
// component below receives its typed struct.
#pragma once

#include <string>
#include <vector>

#include "gradguard/amp/precision.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/dist/dist_options.h"
#include "gradguard/grad/clip.h"
#include "gradguard/guard/guard_options.h"
#include "gradguard/model/llama.h"
#include "gradguard/optim/memory_options.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/optim/schedule.h"
#include "gradguard/telemetry/telemetry.h"
#include "gradguard/config/run_options.h"

namespace gradguard::config {

struct Config {
  RunOptions run;
  model::LlamaOptions model;
  model::LoraOptions lora;
  data::DataOptions data;
  BatchOptions batch;
  LossOptions loss;
  optim::OptimOptions optim;
  optim::ScheduleOptions schedule;
  grad::ClipOptions clip;
  amp::AmpOptions amp;
  optim::MemoryOptions memory;
  EvalOptions eval;
  CheckpointOptions checkpoint;
  LogOptions log;
  guard::GuardOptions guard;
  telemetry::TelemetryOptions telemetry;
  dist::DistOptions dist;

  // Advice produced by finalize() that is not an error (e.g. a global batch that is not
  // a power of two). Not part of the YAML.
  std::vector<std::string> warnings;
  // schedule.total_steps has been derived from schedule.epochs and the data (the Trainer
  // sets it); until then a warmup_ratio's step count is provisional. Not part of the YAML.
  bool length_from_data = false;

  // Reads model.init_from's config.json into `model` when it is set (the architecture
  // of the model being fine-tuned wins over the file and --set; a directory without one
  // is an error naming model.init_from). Then validates every section, then the rules
  // that span sections (schedule.min_lr <= optim.lr, batch.global_batch divisible,
  // power-of-two sizes, data.seq_len <= model.max_seq_len). Resolves
  // batch.global_batch / batch.accum_steps for `world_size` ranks. Throws
  // gradguard::Error (bad input) naming the key.
  void finalize(int64_t world_size = 1);

 private:
  // The memory section against the optimizer, amp.dtype and the rank count.
  void validate_memory(int64_t world_size) const;
};

// The warmup (optimizer steps) below which a fine-tune (model.init_from) gets a warning
// in the run header and `tune` raises its recommendation: bench natural measured the
// loss jump of a fine-tune's first full-size Adam updates (docs/natural.md).
constexpr int64_t kFinetuneWarmupSteps = 10;

// The built-in default: a 4-layer, 128-wide Llama on the Brown corpus, 8192 tokens per
// optimizer step, 200 steps.
Config default_config();

// Defaults, then `path` (if not empty), then each "key.path=value" override (the value
// is parsed as YAML, so lists work: optim.betas=[0.9,0.95]); then finalize(). Unknown
// keys get the nearest valid key suggested; wrong types and out-of-range values name
// the key, the value and what is valid. Errors are gradguard::Error (bad input) whose
// `where` is "<file>: <key>" or "--set <key>".
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

// The configuration as YAML, every key with a comment (what `config show` prints and
// what a run directory's config.yaml holds). Loading it back yields the same Config.
std::string to_yaml(const Config& config);

// docs/config.md: every key with its type, default and description.
std::string reference_markdown();

// A key whose value is one of a fixed set of names, with every name it accepts (aliases
// included) and its documentation text: the test that each accepted name is documented
// reads these.
struct ChoiceKey {
  std::string key;                 // e.g. "clip.strategy"
  std::vector<std::string> names;  // accepted values
  std::string doc;                 // the meaning written beside the field
};
std::vector<ChoiceKey> choice_keys();

// Nearest key by edit distance, or "" if none is close; exposed for tests.
std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace gradguard::config
