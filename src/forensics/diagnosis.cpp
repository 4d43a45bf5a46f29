// Each cause is a small rule over the evidence gathered at the anomalous step: one
// function of one signature (CauseRule), listed in kCauseRules. The rules only read
// numbers, so the diagnosis of a snapshot can be re-derived and tested from plain inputs.
#include "gradguard/forensics/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <numeric>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/core/json_number.h"
#include "gradguard/core/stats.h"
#include "gradguard/optim/optimizer.h"

namespace gradguard::forensics {
namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// "2026-12-03 14:05:09 UTC"; "time unknown" for a non-finite time.
std::string utc_timestamp(double unix_time) {
  if (!std::isfinite(unix_time)) return "time unknown";
  const std::time_t t = static_cast<std::time_t>(unix_time);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

LayerEvidence layer_evidence(const std::function<optim::ParamMoments(size_t)>& moments, const std::string& layer,
                             const std::vector<at::Tensor>& params, const std::vector<size_t>& tensors,
                             double beta1, double beta2, double eps, double norm, double typical) {
  torch::NoGradGuard no_grad;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LayerEvidence e{layer, norm, typical, nan, nan, nan, nan};
  double v_sq = 0, upd_sq = 0, prev_sq = 0, tiny = 0, count = 0;
  bool any = false;
  for (size_t i : tensors) {
    const auto& p = params[i];
    const auto st = moments ? moments(i) : optim::ParamMoments{};
    if (!st.exp_avg_sq.defined() || st.step == 0 || !p.grad().defined()) continue;
    any = true;
    const double t = static_cast<double>(st.step);
    const double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
    const double bc1n = 1 - std::pow(beta1, t + 1), bc2n = 1 - std::pow(beta2, t + 1);
    auto g = p.grad().to(torch::kDouble);
    auto m = st.exp_avg.to(torch::kDouble), v = st.exp_avg_sq.to(torch::kDouble);
    auto sqrt_v = (v / bc2).sqrt();
    v_sq += sqrt_v.pow(2).sum().item<double>();
    tiny += (sqrt_v < 10 * eps).sum().item<double>();
    prev_sq += ((m / bc1) / (sqrt_v + eps)).pow(2).sum().item<double>();
    auto m2 = beta1 * m + (1 - beta1) * g;
    auto v2 = beta2 * v + (1 - beta2) * g * g;
    upd_sq += ((m2 / bc1n) / ((v2 / bc2n).sqrt() + eps)).pow(2).sum().item<double>();
    count += static_cast<double>(p.numel());
  }
  if (any && count > 0) {
    e.sqrt_v_rms = std::sqrt(v_sq / count);
    e.tiny_v_fraction = tiny / count;
    e.update_rms = std::sqrt(upd_sq / count);
    e.previous_update_rms = std::sqrt(prev_sq / count);
  }
  return e;
}

namespace {

bool has_kind(const DiagnosisInput& in, guard::AnomalyKind k) {
  return std::any_of(in.anomalies.begin(), in.anomalies.end(), [&](const guard::Anomaly& a) { return a.kind == k; });
}

// A cause with evidence, or none when its score stayed 0.
std::optional<Cause> if_scored(Cause c) {
  if (c.score > 0) return c;
  return std::nullopt;
}

// injected: a fault put there on purpose (guard.inject).
std::optional<Cause> injected(const DiagnosisInput& in) {
  if (in.injected.empty()) return std::nullopt;
  return Cause{"injected", "a fault was injected at this step on purpose", 1.0,
               {"guard.inject injected '" + in.injected + "' at step " + std::to_string(in.step)},
               "expected when guard.inject is set; remove it for a real run"};
}

// data: one micro-batch stands out, or the loss spiked without a gradient explosion.
std::optional<Cause> unusual_batch(const DiagnosisInput& in) {
  Cause c{"data", "the batch itself is unusual", 0, {}, "replay the snapshot to name the samples; "
          "inspect or drop them (gradguard replay SNAPSHOT)"};
  if (in.micro_losses.size() >= 2) {
    const auto top = std::max_element(in.micro_losses.begin(), in.micro_losses.end()) - in.micro_losses.begin();
    std::vector<double> rest;
    for (size_t i = 0; i < in.micro_losses.size(); ++i)
      if (static_cast<int64_t>(i) != top) rest.push_back(in.micro_losses[i]);
    const double m = std::accumulate(rest.begin(), rest.end(), 0.0) / rest.size();
    double ss = 0;
    for (double x : rest) ss += (x - m) * (x - m);
    const double sd = rest.size() > 1 ? std::sqrt(ss / (rest.size() - 1)) : 0;
    const double z = (in.micro_losses[top] - m) / std::max(sd, 0.01 * std::abs(m));
    if (z > 3) {
      c.score = std::min(0.9, 0.5 + 0.05 * z);
      c.evidence.push_back("micro-batch " + std::to_string(top) + " has loss " + fmt(in.micro_losses[top]) +
                           " against " + fmt(m) + " for the others (z-score " + fmt(z) + ")");
    }
  }
  if (has_kind(in, guard::AnomalyKind::kLossSpike) && std::isfinite(in.grad_norm) && std::isfinite(in.clip_threshold) &&
      in.grad_norm < in.grad_norm_factor * in.clip_threshold) {
    c.score = std::max(c.score, 0.4);
    c.evidence.push_back("the loss spiked (" + fmt(in.loss) + " against a mean of " + fmt(in.loss_mean) +
                         ") while the gradient norm " + fmt(in.grad_norm) + " stayed below the explosion limit");
  }
  return if_scored(std::move(c));
}

// adam_epsilon: tiny second moments amplify this gradient into a huge update.
std::optional<Cause> adam_epsilon(const DiagnosisInput& in) {
  Cause c{"adam_epsilon", "tiny Adam second moments amplify this gradient into a huge update", 0, {},
          "raise optim.eps (e.g. 1e-6), lower the learning rate of the layers named, or keep clipping on"};
  for (const auto& l : in.layers) {
    if (!std::isfinite(l.update_rms)) continue;
    const double amplification = l.previous_update_rms > 0 ? l.update_rms / l.previous_update_rms : 0;
    if (l.tiny_v_fraction > 0.2 || amplification > 3) {
      c.score = std::max(c.score, std::min(0.85, 0.4 + 0.5 * l.tiny_v_fraction + 0.05 * amplification));
      c.evidence.push_back(l.layer + ": " + fmt(100 * l.tiny_v_fraction) + "% of elements have sqrt(v_hat) < 10 eps; "
                           "this step's update RMS would be " + fmt(l.update_rms) + " (x lr) against " +
                           fmt(l.previous_update_rms) + " before (" + fmt(amplification) + "x)");
    }
  }
  return if_scored(std::move(c));
}

// loss_scale: the dynamic fp16 scale is stuck, or grew just before the overflows.
std::optional<Cause> loss_scale(const DiagnosisInput& in) {
  if (in.scaler_mode != amp::ScalerMode::kDynamic) return std::nullopt;
  Cause c{"loss_scale", "the fp16 loss scale is at odds with the gradients' range", 0, {},
          "lower amp.scaler.max_scale or raise amp.scaler.growth_interval; if overflows persist at the floor, "
          "train in bf16"};
  if (has_kind(in, guard::AnomalyKind::kLossScaleStuck)) {
    c.score = 0.9;
    c.evidence.push_back("gradients overflow even at the minimum loss scale " + fmt(in.loss_scale));
  }
  if ((has_kind(in, guard::AnomalyKind::kBackoffStorm) || has_kind(in, guard::AnomalyKind::kSkipStreak) ||
       has_kind(in, guard::AnomalyKind::kNonfinite)) &&
      in.last_scale_growth >= 0 && in.step - in.last_scale_growth <= 20) {
    c.score = std::max(c.score, 0.6);
    c.evidence.push_back("the loss scale grew at step " + std::to_string(in.last_scale_growth) + ", " +
                         std::to_string(in.step - in.last_scale_growth) + " steps before the overflows");
  }
  return if_scored(std::move(c));
}

// numerics: non-finite values that the detector located in a layer (not injected ones).
std::optional<Cause> numerics(const DiagnosisInput& in) {
  if (!in.injected.empty()) return std::nullopt;
  for (const auto& a : in.anomalies) {
    if (a.kind != guard::AnomalyKind::kNonfinite || a.layers.empty()) continue;
    return Cause{"numerics", "non-finite values inside " + a.layers.front(), 0.6,
                 {"first non-finite layer: " + a.layers.front() + " (" + std::to_string(a.layers.size()) +
                  " layer(s) affected); " + a.message},
                 "check that layer's activations (attention logits, norms) in a replay; consider bf16 or "
                 "a smaller learning rate"};
  }
  return std::nullopt;
}

// learning_rate: at the peak right after warmup, or the gradient norm climbing.
std::optional<Cause> learning_rate(const DiagnosisInput& in) {
  Cause c{"learning_rate", "the learning rate is too high for this point of training", 0, {},
          "lower optim.lr, lengthen schedule.warmup_steps, or tighten clip.max_norm"};
  if (in.peak_lr > 0 && in.lr >= 0.9 * in.peak_lr && in.step >= in.warmup_steps &&
      in.step <= 2 * std::max<int64_t>(in.warmup_steps, 1) + 20) {
    c.score = 0.3;
    c.evidence.push_back("lr " + fmt(in.lr) + " is at its peak and warmup ended at step " +
                         std::to_string(in.warmup_steps));
  }
  const auto& g = in.recent_grad_norms;
  if (g.size() >= 10) {
    const size_t h = g.size() / 2;
    const double early = median(std::vector<double>(g.begin(), g.begin() + h));
    const double late = median(std::vector<double>(g.begin() + h, g.end()));
    if (early > 0 && late / early > 2) {
      c.score = std::max(c.score, 0.3) + 0.2;
      c.evidence.push_back("the gradient norm climbed from a median of " + fmt(early) + " to " + fmt(late) +
                           " over the last " + std::to_string(g.size()) + " steps");
    }
  }
  return if_scored(std::move(c));
}

// hardware: a hot or throttled GPU in the telemetry, or a step far slower than usual.
std::optional<Cause> hardware(const DiagnosisInput& in) {
  Cause c{"hardware", "the hardware was under stress", 0, {},
          "check cooling and power limits (gradguard doctor); replay the snapshot on another device"};
  for (const auto& s : in.telemetry) {
    for (const auto& gpu : s.gpus) {
      if (std::isfinite(gpu.temperature_c) && gpu.temperature_c >= 85) {
        c.score = std::max(c.score, 0.5);
        c.evidence.push_back("GPU " + std::to_string(gpu.index) + " at " + fmt(gpu.temperature_c) + " C");
        break;
      }
      if (gpu.throttle_reasons != 0) {
        c.score = std::max(c.score, 0.4);
        std::ostringstream reasons;
        reasons << std::hex << gpu.throttle_reasons;
        c.evidence.push_back("GPU " + std::to_string(gpu.index) + " clocks throttled (reasons 0x" + reasons.str() + ")");
        break;
      }
    }
    if (c.evidence.size() >= 3) break;
  }
  if (in.recent_step_seconds.size() >= 5) {
    std::vector<double> before(in.recent_step_seconds.begin(), in.recent_step_seconds.end() - 1);
    const double med = median(before), now = in.recent_step_seconds.back();
    if (med > 0 && now > 3 * med) {
      c.score = std::max(c.score, 0.3);
      c.evidence.push_back("this step took " + fmt(now) + " s against a median of " + fmt(med) + " s");
    }
  }
  return if_scored(std::move(c));
}

// The rules; their causes are ranked by score (ties keep this order). A new cause is one
// more function and one more entry here.
using CauseRule = std::optional<Cause> (*)(const DiagnosisInput&);
constexpr CauseRule kCauseRules[] = {injected,     unusual_batch, adam_epsilon, loss_scale,
                                     numerics,     learning_rate, hardware};

}  // namespace

Diagnosis diagnose(const DiagnosisInput& in) {
  std::vector<Cause> causes;
  for (const CauseRule rule : kCauseRules)
    if (auto c = rule(in)) causes.push_back(std::move(*c));
  if (causes.empty())
    causes.push_back({"unknown", "no rule matched", 0.1, {"none of the rules found supporting evidence"},
                      "replay the snapshot: if it does not reproduce, suspect non-determinism or a hardware fault"});
  std::stable_sort(causes.begin(), causes.end(), [](const Cause& a, const Cause& b) { return a.score > b.score; });
  return Diagnosis{causes};
}

nlohmann::ordered_json Diagnosis::to_json(const DiagnosisInput& in) const {
  nlohmann::ordered_json anomalies = nlohmann::ordered_json::array();
  for (const auto& a : in.anomalies) anomalies.push_back(to_event(in.step, a));
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : in.layers)
    layers.push_back({{"layer", l.layer},
                      {"grad_norm", json_number(l.norm)},
                      {"typical", json_number(l.typical)},
                      {"ratio", json_number(l.typical > 0 ? l.norm / l.typical : NAN)},
                      {"sqrt_v_hat_rms", json_number(l.sqrt_v_rms)},
                      {"tiny_v_fraction", json_number(l.tiny_v_fraction)},
                      {"update_rms", json_number(l.update_rms)},
                      {"previous_update_rms", json_number(l.previous_update_rms)}});
  nlohmann::ordered_json ranked = nlohmann::ordered_json::array();
  for (const auto& c : causes)
    ranked.push_back({{"cause", c.id}, {"title", c.title}, {"score", c.score}, {"evidence", c.evidence},
                      {"suggestion", c.suggestion}});
  nlohmann::ordered_json hw = nlohmann::ordered_json::array();
  for (const auto& s : in.telemetry) hw.push_back(telemetry::to_json(s));
  return {{"step", in.step},
          {"time", utc_timestamp(in.unix_time)},
          {"unix_time", json_number(in.unix_time)},
          {"anomalies", anomalies},
          {"injected", in.injected},
          {"loss", json_number(in.loss)},
          {"loss_mean", json_number(in.loss_mean)},
          {"loss_std", json_number(in.loss_std)},
          {"grad_norm", json_number(in.grad_norm)},
          {"clip_threshold", json_number(in.clip_threshold)},
          {"lr", in.lr},
          {"peak_lr", in.peak_lr},
          {"loss_scale", in.loss_scale},
          {"scaler_mode", name_of(in.scaler_mode)},
          {"last_scale_growth", in.last_scale_growth},
          {"micro_losses", in.micro_losses},
          {"layers", layers},
          {"causes", ranked},
          {"telemetry_samples", hw.size()}};
}

std::string Diagnosis::to_markdown(const DiagnosisInput& in, const std::string& title) const {
  std::ostringstream md;
  md << "# " << title << "\n\n" << utc_timestamp(in.unix_time) << "\n\n";
  for (const auto& a : in.anomalies) md << "- **" << name_of(a.kind) << "** (" << name_of(a.severity) << "): " << a.message << "\n";
  md << "\nloss " << fmt(in.loss) << " (recent mean " << fmt(in.loss_mean) << ", std " << fmt(in.loss_std)
     << "), gradient norm " << fmt(in.grad_norm) << " (clip threshold " << fmt(in.clip_threshold) << "), lr "
     << fmt(in.lr) << " (peak " << fmt(in.peak_lr) << "), loss scale " << fmt(in.loss_scale) << " (" << name_of(in.scaler_mode)
     << ")\n";
  if (!in.layers.empty()) {
    md << "\n## Layers involved\n\n| layer | grad norm | typical | ratio | sqrt(v_hat) RMS | tiny v | update RMS | before |\n"
          "|---|---|---|---|---|---|---|---|\n";
    for (const auto& l : in.layers)
      md << "| " << l.layer << " | " << fmt(l.norm) << " | " << fmt(l.typical) << " | "
         << fmt(l.typical > 0 ? l.norm / l.typical : NAN) << " | " << fmt(l.sqrt_v_rms) << " | "
         << fmt(100 * l.tiny_v_fraction) << "% | " << fmt(l.update_rms) << " | " << fmt(l.previous_update_rms)
         << " |\n";
  }
  md << "\n## Likely causes, most likely first\n\n";
  int rank = 1;
  for (const auto& c : causes) {
    md << rank++ << ". **" << c.id << "** — " << c.title << " (score " << fmt(c.score) << ")\n";
    for (const auto& e : c.evidence) md << "   - " << e << "\n";
    md << "   - what to try: " << c.suggestion << "\n";
  }
  return md.str();
}

}  // namespace gradguard::forensics
