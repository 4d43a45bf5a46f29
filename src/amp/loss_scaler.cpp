// The update reads top to bottom in the order PyTorch's `_amp_update_scale_` does it
// (overflow branch, then growth branch), with the extensions (hysteresis, floor, cap,
// stuck) inserted where they act. Everything is host arithmetic on doubles and int64.
#include "gradguard/amp/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"

namespace gradguard::amp {
namespace {

std::string num(double v) {
  nlohmann::json j = v;  // shortest round-trip text, unlike std::to_string's %f
  return j.dump();
}

bool finite_positive(double v) {
  return std::isfinite(v) && v > 0;
}


}  // namespace

void LossScalerOptions::validate() const {
  if (!finite_positive(init_scale))
    throw bad_input("amp.scaler.init_scale", "must be a finite number > 0, got " + num(init_scale));
  if (!std::isfinite(growth_factor) || !(growth_factor > 1))
    throw bad_input("amp.scaler.growth_factor",
                    "must be a finite number > 1, got " + num(growth_factor));
  if (!(backoff_factor > 0 && backoff_factor < 1))
    throw bad_input("amp.scaler.backoff_factor", "must be in (0, 1), got " + num(backoff_factor));
  if (growth_interval < 1)
    throw bad_input("amp.scaler.growth_interval",
                    "must be >= 1 optimizer step, got " + std::to_string(growth_interval));
  if (!std::isfinite(max_scale) || max_scale < 0 || (max_scale > 0 && max_scale < init_scale))
    throw bad_input("amp.scaler.max_scale",
                    "must be 0 (no cap) or a finite number >= amp.scaler.init_scale = " +
                        num(init_scale) + ", got " + num(max_scale));
  if (!finite_positive(min_scale) || min_scale > init_scale)
    throw bad_input("amp.scaler.min_scale", "must be > 0 and <= amp.scaler.init_scale = " +
                                                num(init_scale) + ", got " + num(min_scale));
  if (hysteresis < 1)
    throw bad_input("amp.scaler.hysteresis", "must be >= 1 (1 backs off on every overflow), got " +
                                                 std::to_string(hysteresis));
  if (min_scale_patience < 1)
    throw bad_input("amp.scaler.min_scale_patience",
                    "must be >= 1, got " + std::to_string(min_scale_patience));
}

LossScaler::LossScaler(const LossScalerOptions& options, ScalerMode mode)
    : options_(options), mode_(mode) {
  options_.validate();
  if (mode_ == ScalerMode::kAuto)
    throw bad_input("amp.scaler.mode",
                    "the scaler needs a resolved mode (dynamic, static or off), got 'auto'; resolve it with "
                    "resolve_scaler_mode");
  scale_ = mode_ == ScalerMode::kOff ? 1.0 : options_.init_scale;
  hysteresis_left_ = options_.hysteresis;
}

double LossScaler::scale() const {
  return scale_;
}
double LossScaler::inv_scale() const {
  return 1.0 / scale_;
}
bool LossScaler::enabled() const {
  return mode_ != ScalerMode::kOff;
}

ScalerUpdate LossScaler::update(bool found_inf) {
  ScalerUpdate r;
  r.scale_used = scale_;
  r.skipped = found_inf;  // non-finite gradients are never applied, whatever the mode
  if (found_inf) ++skipped_steps_;

  if (mode_ == ScalerMode::kDynamic) {
    if (found_inf) {
      growth_tracker_ = 0;
      // Already at the floor: backing off cannot help; after `patience` such overflows in
      // a row the run is stuck (every step skipped) and the caller should know.
      overflows_at_min_ = scale_ <= options_.min_scale ? overflows_at_min_ + 1 : 0;
      r.stuck = overflows_at_min_ >= options_.min_scale_patience;
      if (--hysteresis_left_ <= 0) {
        hysteresis_left_ = options_.hysteresis;
        const double next = std::max(scale_ * options_.backoff_factor, options_.min_scale);
        r.backed_off = next < scale_;
        scale_ = next;
      }
    } else {
      hysteresis_left_ = options_.hysteresis;  // hysteresis counts consecutive overflows only
      overflows_at_min_ = 0;
      if (++growth_tracker_ == options_.growth_interval) {
        growth_tracker_ = 0;
        double next = scale_ * options_.growth_factor;
        if (options_.max_scale > 0) next = std::min(next, options_.max_scale);
        // As PyTorch's kernel: never grow into inf (only reachable with max_scale = 0).
        if (std::isfinite(next) && next > scale_) {
          r.grew = true;
          scale_ = next;
        }
      }
    }
  }
  r.next_scale = scale_;
  return r;
}

nlohmann::json LossScaler::state_dict() const {
  return {{"mode", name_of(mode_)},
          {"scale", scale_},
          {"growth_tracker", growth_tracker_},
          {"hysteresis_left", hysteresis_left_},
          {"overflows_at_min", overflows_at_min_},
          {"skipped_steps", skipped_steps_}};
}

void LossScaler::load_state_dict(const nlohmann::json& state, const std::string& where) {
  if (!state.is_object())
    throw bad_input(where, "must be a JSON object, got " + std::string(state.type_name()));
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = state.find(key);
    if (it == state.end()) throw bad_input(where, std::string("missing field '") + key + "'");
    return *it;
  };
  auto count = [&](const char* key) -> int64_t {
    const auto& v = field(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw bad_input(where,
                      std::string("field '") + key + "' must be an integer >= 0, got " + describe(v));
    return v.get<int64_t>();
  };

  const auto& mode = field("mode");
  if (!mode.is_string())
    throw bad_input(where, "field 'mode' must be a string, got " + describe(mode));
  if (mode.get<std::string>() != name_of(mode_))
    throw bad_input(where, "saved with loss scaler mode '" + mode.get<std::string>() +
                                     "' but this run's mode is '" + name_of(mode_) +
                                     "' (check amp.dtype and amp.scaler.mode)");
  const auto& scale = field("scale");
  if (!scale.is_number() || !finite_positive(scale.get<double>()))
    throw bad_input(where, "field 'scale' must be a finite number > 0, got " + describe(scale));
  const int64_t tracker = count("growth_tracker");
  const int64_t hysteresis_left = count("hysteresis_left");
  const int64_t overflows_at_min = count("overflows_at_min");
  const int64_t skipped = count("skipped_steps");

  // All fields are valid: commit. Options changed since the save are respected.
  if (mode_ == ScalerMode::kDynamic) {
    double s = std::max(scale.get<double>(), options_.min_scale);
    if (options_.max_scale > 0) s = std::min(s, options_.max_scale);
    scale_ = s;
  }
  growth_tracker_ = std::min(tracker, options_.growth_interval - 1);
  hysteresis_left_ = std::clamp<int64_t>(hysteresis_left, 1, options_.hysteresis);
  overflows_at_min_ = overflows_at_min;
  skipped_steps_ = skipped;
}

}  // namespace gradguard::amp
