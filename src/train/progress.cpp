// Progress rendering. ETA is remaining steps x the mean step time so far.
#include "gradguard/train/progress.h"

#include <unistd.h>

#include <cmath>

namespace gradguard::train {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60),
                  (long long)(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  return buf;
}

Progress::Progress(const std::string& mode, int64_t total_steps, int64_t every, std::FILE* out)
    : total_(total_steps), every_(every), out_(out) {
  quiet_ = mode == "none";
  bar_ = mode == "bar" || (mode == "auto" && isatty(fileno(out)));
}

void Progress::step(const StepMetrics& m) {
  if (quiet_) return;
  const int64_t done = m.step + 1;
  const double eta = m.elapsed_s / done * (total_ - done);
  char stats[256];
  std::snprintf(stats, sizeof stats, "step %lld/%lld | loss %.4f | lr %.3e | grad_norm %.3f%s | %.0f tok/s | ETA %s",
                (long long)done, (long long)total_, m.loss, m.lr, m.grad_norm, m.skipped ? " (skipped)" : "",
                m.tokens_per_s, format_duration(eta).c_str());
  if (bar_) {
    const int width = 24;
    int filled = static_cast<int>(width * done / std::max<int64_t>(total_, 1));
    std::string bar(filled, '#');
    bar.append(width - filled, '.');
    std::fprintf(out_, "\r\033[K[%s] %s", bar.c_str(), stats);
    bar_open_ = true;
  } else if (done % every_ == 0 || done == total_ || m.step == 0) {
    std::fprintf(out_, "%s\n", stats);
  }
  std::fflush(out_);
}

void Progress::line(const std::string& text) {
  if (quiet_) return;
  if (bar_open_) std::fprintf(out_, "\r\033[K");
  std::fprintf(out_, "%s\n", text.c_str());
  bar_open_ = false;
  std::fflush(out_);
}

void Progress::finish() {
  if (bar_open_) std::fprintf(out_, "\n");
  bar_open_ = false;
  std::fflush(out_);
}

}  // namespace gradguard::train
