// The run-level sections of a configuration, the options of the training loop itself:
// the run (where, seed, device, threads), the batch geometry, the loss, validation,
// checkpoint cadence and logging. The model, data, optimizer, schedule, clipping and
// precision options live with their components; config/ holds these because no
// component owns them and every layer above reads them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gradguard/core/choice.h"
#include "gradguard/core/threads.h"

namespace gradguard::config {

struct RunOptions {
  std::string name;
  std::string dir = "runs";
  uint64_t seed = 1234;
  std::string device = "cpu";
  int64_t threads = 0;
  ThreadPool thread_pool = ThreadPool::kAuto;
  bool overwrite = false;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("name", name, "run directory name under run.dir; a plain name, no '/'; \"\" = <model>-<date>-<time>");
    field("dir", dir, "parent directory of run directories");
    field("seed", seed, "seeds weight initialisation, data shuffling and injected faults");
    field("device", device, "cpu | auto (a GPU when there is one) | cuda | cuda:N");
    field("threads", threads,
          "CPU threads; 0 = the CPUs this process may use (affinity, cgroup quota), split between the ranks of a "
          "node; in [0, 1024]");
    field("thread_pool", thread_pool,
          "which pool gets run.threads (the other runs on 1): blas = the BLAS library's (matmuls) | aten = ATen's "
          "intra-op (elementwise ops) | auto = blas with OpenBLAS, else aten");
    field("overwrite", overwrite, "true: reuse a run directory that already holds a run (its outputs are removed)");
  }
};

struct BatchOptions {
  int64_t micro_batch = 32;
  int64_t accum_steps = 4;
  int64_t global_batch = 0;
  bool require_pow2 = false;
  // Set by Config::finalize when global_batch was 0: it is then micro_batch x
  // accum_steps x ranks whenever the rank count becomes known. Not a config key.
  bool global_from_accum = false;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("micro_batch", micro_batch, "sequences per forward/backward on each rank; >= 1");
    field("accum_steps", accum_steps, "micro-batches accumulated per optimizer step on each rank; >= 1");
    field("global_batch", global_batch,
          "sequences per optimizer step over all ranks; 0 = micro_batch x accum_steps x ranks; > 0 sets "
          "accum_steps = global_batch / (micro_batch x ranks), which must divide");
    field("require_pow2", require_pow2, "reject micro_batch, accum_steps or global_batch that are not powers of 2");
  }
};

// The training objective beyond the token cross-entropy.
struct LossOptions {
  double z_loss = 0;
  int64_t chunk_tokens = 0;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("z_loss", z_loss,
          "coefficient c of PaLM's z-loss: c x logsumexp(logits)^2 averaged over the trained tokens, added to the "
          "objective and logged apart from the loss (PaLM uses 1e-4); keeps the softmax normaliser near 1, "
          "against output-logit divergence; 0 = off; in [0, 1)");
    field("chunk_tokens", chunk_tokens,
          "> 0: compute the output projection and the cross-entropy this many tokens at a time, recomputing each "
          "chunk's logits in backward, so the [tokens, vocabulary] logits never exist whole (large vocabularies); "
          "0 = whole logits; >= 0");
  }
};

struct EvalOptions {
  int64_t every = 50;
  int64_t batches = 8;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("every", every, "validate every N optimizer steps (and after the last); 0 = only at the start and end");
    field("batches", batches, "validation micro-batches per evaluation; >= 1");
  }
};

struct CheckpointOptions {
  int64_t every = 0;
  int64_t keep_last = 3;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("every", every, "save every N optimizer steps; 0 = only the final checkpoint");
    field("keep_last", keep_last, "periodic checkpoints kept (the final one always is); 0 keeps all");
  }
};

// log.progress: how progress is shown (train/progress.h).
enum class ProgressMode { kAuto, kBar, kLines, kJsonl, kQuiet };
constexpr std::array<Choice<ProgressMode>, 6> choices(ProgressMode) {
  return {{{ProgressMode::kAuto, "auto"},
           {ProgressMode::kBar, "bar"},
           {ProgressMode::kLines, "lines"},
           {ProgressMode::kJsonl, "jsonl"},
           {ProgressMode::kQuiet, "quiet"},
           {ProgressMode::kQuiet, "none"}}};
}

struct LogOptions {
  int64_t every = 10;
  ProgressMode progress = ProgressMode::kAuto;
  bool report = true;
  bool tensorboard = true;
  void validate() const;

  template <class Field>
  void fields(Field&& field) {
    field("every", every, "a plain progress line every N steps (the bar redraws every step); >= 1");
    field("progress", progress,
          "auto (a bar on a terminal, else lines) | bar | lines | jsonl (one JSON object per step on stdout) | "
          "quiet (the summary only; none is the same)");
    field("report", report, "write report.html into the run directory when the run ends or halts");
    field("tensorboard", tensorboard, "write TensorBoard event files into the run directory as it runs");
  }
};

}  // namespace gradguard::config
