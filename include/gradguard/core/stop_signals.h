// Preemption: cluster schedulers (Slurm, Kubernetes) stop a job with SIGTERM and kill it
// with SIGKILL after a grace period; a user stops one with Ctrl-C (SIGINT). While a
// StopSignals lives, the first SIGTERM or SIGINT only sets a flag, which the training
// loop reads between steps to finish the step, write a checkpoint and the report, and
// exit with kExitPreempted. A second signal ends the process at once, by the signal's
// default action (the usual exit status of a killed process). The handler does nothing
// but store to an atomic flag, so it is async-signal-safe.
#pragma once

namespace gradguard {

// The process exit code of a run stopped by SIGTERM/SIGINT after its checkpoint was
// written (docs/design.md, "Exit codes"): resume it with `train --resume RUN_DIR`.
inline constexpr int kExitPreempted = 4;

class StopSignals {
 public:
  StopSignals();   // installs the handlers for SIGTERM and SIGINT
  ~StopSignals();  // restores the handlers found at construction
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received since construction (0 = none); never blocks.
  static int requested();
  // "SIGTERM", "SIGINT", or "" when none.
  static const char* name(int signal);
};

}  // namespace gradguard
