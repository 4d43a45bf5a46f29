// Range checks of the loop options; each error names its config key.
#include "gradguard/config/run_options.h"

#include <regex>

#include "gradguard/core/error.h"
#include "gradguard/core/threads.h"

namespace gradguard::config {
namespace {
void at_least(int64_t value, int64_t lo, const char* key) {
  if (value < lo)
    throw bad_input(key, "must be >= " + std::to_string(lo) + ", got " + std::to_string(value));
}
}  // namespace

void RunOptions::validate() const {
  if (name.find('/') != std::string::npos || name == "." || name == "..")
    throw bad_input("run.name", "'" + name + "' must be a plain directory name (no '/')");
  if (dir.empty()) throw bad_input("run.dir", "must not be empty");
  static const std::regex device_re("cpu|auto|cuda(:[0-9]+)?");
  if (!std::regex_match(device, device_re))
    throw bad_input("run.device", "'" + device + "' is not valid (valid: cpu, auto, cuda, cuda:N)");
  if (threads < 0 || threads > 1024)
    throw bad_input("run.threads", "must be in [0, 1024] (0 = all cores), got " + std::to_string(threads));
}

void BatchOptions::validate() const {
  at_least(micro_batch, 1, "batch.micro_batch");
  at_least(accum_steps, 1, "batch.accum_steps");
  at_least(global_batch, 0, "batch.global_batch");
}

void LossOptions::validate() const {
  if (!(z_loss >= 0 && z_loss < 1))
    throw bad_input("loss.z_loss", "must be in [0, 1) (PaLM uses 1e-4), got " + format_number(z_loss));
  if (chunk_tokens < 0)
    throw bad_input("loss.chunk_tokens", "must be >= 0 (0 = whole logits), got " + std::to_string(chunk_tokens));
}

void EvalOptions::validate() const {
  at_least(every, 0, "eval.every");
  at_least(batches, 1, "eval.batches");
}

void CheckpointOptions::validate() const {
  at_least(every, 0, "checkpoint.every");
  at_least(keep_last, 0, "checkpoint.keep_last");
}

void LogOptions::validate() const {
  at_least(every, 1, "log.every");
}

}  // namespace gradguard::config
