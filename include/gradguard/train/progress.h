// The human progress display: on a terminal a bar redrawn in place with step, loss, lr,
// gradient norm, tokens/s and ETA; elsewhere (a log file, CI) a plain line every
// log.every steps. Validation results and messages always get their own line.
#pragma once

#include <cstdio>
#include <string>

#include "gradguard/train/metrics.h"

namespace gradguard::train {

class Progress {
 public:
  // mode: auto | bar | lines | none (see LogOptions). Writes to `out`.
  Progress(const std::string& mode, int64_t total_steps, int64_t every, std::FILE* out = stdout);
  void step(const StepMetrics& m);
  void line(const std::string& text);  // a message on its own line
  void finish();                       // ends the bar line

 private:
  bool bar_ = false;
  bool quiet_ = false;
  bool bar_open_ = false;
  int64_t total_, every_;
  std::FILE* out_;
};

// "1:02:03" / "4:05" for a duration in seconds.
std::string format_duration(double seconds);

}  // namespace gradguard::train
