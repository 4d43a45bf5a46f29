// Options of the training loop itself: the run (where, seed, device, threads), the
// batch geometry, validation, checkpoint cadence and logging. The model, data,
// optimizer, schedule, clipping and precision options live with their components.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradguard::train {

struct RunOptions {
  std::string name;            // run directory name under `dir`; "" = <model>-<date>-<time>
  std::string dir = "runs";    // parent of run directories
  uint64_t seed = 1234;        // seeds weight init, data shuffling and dropout-free sampling
  std::string device = "cpu";  // cpu | cuda | cuda:N (auto = cuda when available)
  int64_t threads = 0;         // CPU threads; 0 = all cores (this rank's share of them)
  std::string thread_pool = "auto";  // who gets them: aten | blas | auto (core/threads.h);
                                     // the other pool runs on one thread
  bool overwrite = false;      // false: refuse a run directory that already has a run in it
  void validate() const;
};

struct BatchOptions {
  int64_t micro_batch = 32;    // sequences per forward/backward (per rank), >= 1
  int64_t accum_steps = 4;     // micro-batches accumulated per optimizer step, >= 1
  int64_t global_batch = 0;    // sequences per optimizer step; 0 = micro_batch*accum_steps*ranks,
                               // > 0 sets accum_steps = global_batch / (micro_batch*ranks)
  bool require_pow2 = false;   // reject micro_batch / accum_steps / global_batch not a power of 2
  void validate() const;
};

struct EvalOptions {
  int64_t every = 50;          // validate every N optimizer steps (and after the last); 0 = only at the end
  int64_t batches = 8;         // validation micro-batches per evaluation, >= 1
  void validate() const;
};

struct CheckpointOptions {
  int64_t every = 0;           // save every N optimizer steps; 0 = only the final checkpoint
  int64_t keep_last = 3;       // periodic checkpoints kept; 0 keeps all (the final one is always kept)
  void validate() const;
};

struct LogOptions {
  int64_t every = 10;          // plain progress line every N steps (bar mode redraws every step)
  std::string progress = "auto";  // auto (bar on a terminal, lines otherwise) | bar | lines | jsonl | quiet
  bool report = true;             // write report.html into the run directory when the run ends (or halts)
  bool tensorboard = true;        // write TensorBoard events.out.tfevents.* into the run directory, live
  void validate() const;
};

}  // namespace gradguard::train
