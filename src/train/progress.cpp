// Progress rendering. The ETA multiplies the remaining steps by an exponential moving
// average (weight 0.1) of the seconds per step measured in this process (after a resume
// the earlier wall time is not in elapsed_s's origin, and a run that slows down shows it
// within a few dozen steps), plus the time spent between steps (validation, checkpoints)
// averaged over the steps seen so far.
#include "gradguard/train/progress.h"

#include <unistd.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "gradguard/config/config.h"
#include "gradguard/core/json_number.h"
#include "gradguard/core/threads.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/optim/sharded_optimizer.h"

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

Progress::Progress(config::ProgressMode mode, int64_t total_steps, int64_t every, std::FILE* out)
    : total_(total_steps), every_(every), out_(out) {
  quiet_ = mode == config::ProgressMode::kQuiet;
  json_ = mode == config::ProgressMode::kJsonl;
  bar_ = mode == config::ProgressMode::kBar || (mode == config::ProgressMode::kAuto && isatty(fileno(out)));
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

std::vector<std::string> header_lines(const RunHeader& h) {
  const auto& c = *h.cfg;
  const auto& threads = *h.threads;
  const int64_t parameters = h.parameters;
  char text[512];
  std::snprintf(text, sizeof text,
                "gradguard %s | model %lld params (%lld layers x %lld wide) | %lld seq x %lld tokens = %lld tokens/step "
                "(micro %lld x accum %lld) | threads: %lld ATen, %lld %s | run %s",
                GRADGUARD_VERSION, (long long)parameters, (long long)c.model.num_layers, (long long)c.model.hidden_size,
                (long long)c.batch.global_batch, (long long)c.data.seq_len,
                (long long)(c.batch.global_batch * c.data.seq_len), (long long)c.batch.micro_batch,
                (long long)c.batch.accum_steps, (long long)threads.intra_op, (long long)threads.blas_threads,
                threads.blas.c_str(), h.run_dir.c_str());
  std::vector<std::string> out = {text};
  if (!h.length_note.empty()) out.push_back(h.length_note);
  for (const auto& w : c.warnings) out.push_back("warning: " + w);
  for (const auto& n : h.resume_notes) out.push_back(n);
  if (!h.telemetry_note.empty()) out.push_back("telemetry: " + h.telemetry_note);
  for (const auto* d : {h.train, h.val}) {
    if (d == nullptr || !d->has_samples()) continue;
    const auto& st = d->sample_stats();
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "data %s: %lld samples -> %lld rows of %lld tokens (%s), %lld trained targets; %lld truncated to "
                  "seq_len + 1, %lld dropped as longer (data.overlong), %lld dropped with no trained target",
                  d->file().path().c_str(), (long long)st.samples, (long long)st.rows, (long long)c.data.seq_len,
                  c.data.packing ? "packed" : "one per row", (long long)st.trained_targets, (long long)st.truncated,
                  (long long)st.dropped_long, (long long)st.dropped_untrainable);
    out.push_back(msg);
  }
  if (c.lora.enabled()) {
    std::string targets;
    for (auto t : c.lora.targets) targets += (targets.empty() ? "" : ",") + std::string(name_of(t));
    char msg[256];
    std::snprintf(msg, sizeof msg, "lora: rank %lld, alpha %s on %s: %lld of %lld parameters train",
                  (long long)c.lora.rank, format_number(c.lora.alpha).c_str(), targets.c_str(),
                  (long long)h.trainable, (long long)parameters);
    out.push_back(msg);
  }
  if (auto* sharded = h.sharded) {
    // What this rank holds of the optimizer state, next to what a replicated AdamW holds.
    const auto& l = sharded->layout();
    const int64_t elem = sharded->exp_avg().element_size();
    const int64_t replicated = l.total * (2 * elem + (sharded->has_masters() ? 4 : 0));
    auto size = [](int64_t bytes) {
      char b[32];
      if (bytes < (int64_t{1} << 20)) std::snprintf(b, sizeof b, "%.1f KiB", bytes / 1024.0);
      else if (bytes < (int64_t{1} << 30)) std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
      else std::snprintf(b, sizeof b, "%.2f GiB", bytes / 1073741824.0);
      return std::string(b);
    };
    char msg[320];
    const std::string where =
        h.memory.shard_world == 1 ? std::string("whole on each rank")
        : h.memory.shards_gradients ? "and gradients sharded (ZeRO-2) over " + std::to_string(l.world_size) + " ranks"
                                 : "sharded (ZeRO-1) over " + std::to_string(l.world_size) + " ranks";
    std::snprintf(msg, sizeof msg, "memory: %s weights%s, optimizer state %s%s: %s on this rank (%s whole)",
                  name_of(c.memory.weights_dtype), sharded->has_masters() ? " with fp32 masters" : "", where.c_str(),
                  c.memory.offload_optimizer ? " in host memory" : "", size(sharded->state_bytes()).c_str(),
                  size(replicated).c_str());
    out.push_back(msg);
  }
  if (h.peak_lr != c.optim.lr) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "optim.lr_scaling %s: peak lr %.3e (optim.lr %.3e at base_batch %lld)",
                  name_of(c.optim.lr_scaling), h.peak_lr, c.optim.lr, (long long)c.optim.base_batch);
    out.push_back(msg);
  }
  return out;
}

}  // namespace gradguard::train
