// Progress rendering. The ETA multiplies the remaining steps by an exponential moving
// average (weight 0.1) of the seconds per step measured in this process (after a resume
// the earlier wall time is not in elapsed_s's origin, and a run that slows down shows it
// within a few dozen steps), plus the time spent between steps (validation, checkpoints)
// averaged over the steps seen so far.
#include "gradguard/train/progress.h"

#include <unistd.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "gradguard/core/json_number.h"

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

Progress::Progress(ProgressMode mode, int64_t total_steps, int64_t every, std::FILE* out)
    : total_(total_steps), every_(every), out_(out) {
  quiet_ = mode == ProgressMode::kQuiet;
  json_ = mode == ProgressMode::kJsonl;
  bar_ = mode == ProgressMode::kBar || (mode == ProgressMode::kAuto && isatty(fileno(out)));
}

double Progress::eta_seconds(const StepMetrics& m) {
  const double remaining = static_cast<double>(total_ - (m.step + 1));
  // The step's own time when known (tokens / tokens_per_s), else the elapsed difference.
  const double own = m.tokens > 0 && m.tokens_per_s > 0 ? static_cast<double>(m.tokens) / m.tokens_per_s : std::nan("");
  if (last_step_ >= 0 && m.step > last_step_) {
    const double span = m.elapsed_s - last_elapsed_;
    const double per_step = std::isfinite(own) ? own : span / static_cast<double>(m.step - last_step_);
    step_s_ = step_s_ < 0 ? per_step : 0.9 * step_s_ + 0.1 * per_step;
    // Time between steps that is not step time (validation, checkpoints) is amortised over
    // the steps seen, instead of entering the average as one very slow step.
    overhead_s_ += std::max(0.0, span - (std::isfinite(own) ? own : span));
    steps_seen_ += m.step - last_step_;
  } else if (last_step_ < 0) {
    step_s_ = std::isfinite(own) ? own : m.elapsed_s;  // the first step: its own time is the only estimate
  }
  last_step_ = m.step;
  last_elapsed_ = m.elapsed_s;
  if (step_s_ < 0) return std::nan("");
  return (step_s_ + (steps_seen_ > 0 ? overhead_s_ / static_cast<double>(steps_seen_) : 0.0)) * remaining;
}

void Progress::step(const StepMetrics& m, int64_t anomalies) {
  if (quiet_) return;
  const int64_t done = m.step + 1;
  const double eta = eta_seconds(m);
  if (json_) {
    nlohmann::ordered_json j = {{"step", m.step},           {"total_steps", total_},
                                {"loss", json_number(m.loss)}, {"lr", json_number(m.lr)},
                                {"grad_norm", json_number(m.grad_norm)}, {"loss_scale", json_number(m.loss_scale)},
                                {"skipped", m.skipped},     {"tokens_per_s", json_number(m.tokens_per_s)},
                                {"anomalies", anomalies},   {"eta_s", json_number(eta)}};
    std::fprintf(out_, "%s\n", j.dump().c_str());
    std::fflush(out_);
    return;
  }
  char scale[48] = "", anomaly[40] = "";
  if (m.loss_scale != 1) std::snprintf(scale, sizeof scale, " | scale %.6g", m.loss_scale);
  if (anomalies > 0) std::snprintf(anomaly, sizeof anomaly, " | %lld anomal%s", (long long)anomalies,
                                   anomalies == 1 ? "y" : "ies");
  char stats[320];
  std::snprintf(stats, sizeof stats, "step %lld/%lld | loss %.4f | lr %.3e | grad_norm %.3f%s%s | %.0f tok/s%s | ETA %s",
                (long long)done, (long long)total_, m.loss, m.lr, m.grad_norm, m.skipped ? " (skipped)" : "", scale,
                m.tokens_per_s, anomaly, format_duration(eta).c_str());
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
  if (json_) {
    std::fprintf(out_, "%s\n", nlohmann::ordered_json{{"message", text}}.dump().c_str());
    std::fflush(out_);
    return;
  }
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
