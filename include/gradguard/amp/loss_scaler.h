// Loss scaling for fp16 training. fp16 gradients underflow to zero below ~6e-8 and
// overflow above 65504, so the loss is multiplied by a scale S before backward and the
// gradients by 1/S afterwards (folded into the fused gradient statistics, which also
// report whether any gradient is non-finite). A dynamic scaler searches for the largest
// S that does not overflow, with PyTorch GradScaler semantics (`_amp_update_scale_`):
//   overflow: S *= backoff_factor, growth_tracker = 0, the optimizer step is skipped
//   finite:   growth_tracker += 1; after growth_interval in a row S *= growth_factor
// plus what PyTorch lacks: a cap (max_scale) and a floor (min_scale), hysteresis
// (tolerate H consecutive overflows before backing off, DeepSpeed's
// "consecutive_hysteresis"; H = 1 is PyTorch), and a `stuck` report when the scale keeps
// overflowing at its floor, which the guard turns into an anomaly instead of looping
// forever on skipped steps. With the defaults the trajectory equals PyTorch's
// (tests/golden/scaler.json).
//
// The scaler is host-side arithmetic: found_inf reaches the host in the step's single
// device->host copy, so update() launches nothing and never syncs. The scale is kept in
// double; the factors are powers of two in practice, so it is exact (PyTorch keeps a
// float32 tensor, which gives the same values while they stay in float32's range).
// Overflow is a result (ScalerUpdate), not an exception. The whole state (scale and all
// counters) round-trips through state_dict(), so a resumed run continues exactly.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "gradguard/core/choice.h"

namespace gradguard::amp {

// auto is resolved before a scaler is made (amp/precision.h: resolve_scaler_mode).
enum class ScalerMode { kAuto, kDynamic, kStatic, kOff };
constexpr std::array<Choice<ScalerMode>, 4> choices(ScalerMode) {
  return {{{ScalerMode::kAuto, "auto"},
           {ScalerMode::kDynamic, "dynamic"},
           {ScalerMode::kStatic, "static"},
           {ScalerMode::kOff, "off"}}};
}

// Every field's key is amp.scaler.<field>. Scales are plain multipliers of the loss.
struct LossScalerOptions {
  ScalerMode mode = ScalerMode::kAuto;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double max_scale = 16777216.0;
  double min_scale = 1.0;
  int64_t hysteresis = 1;
  int64_t min_scale_patience = 3;
  void validate() const;  // throws gradguard::Error (bad input) naming amp.scaler.<field>

  template <class Field>
  void fields(Field&& field) {
    field("mode", mode,
          "auto (dynamic for fp16, else off) | dynamic (search the largest scale that does not overflow) | static "
          "(a fixed init_scale) | off");
    field("init_scale", init_scale, "initial scale (dynamic) or the fixed scale (static); 65536 = 2^16; > 0");
    field("growth_factor", growth_factor, "scale multiplier after growth_interval finite steps in a row; > 1");
    field("backoff_factor", backoff_factor, "scale multiplier on an overflow; in (0, 1)");
    field("growth_interval", growth_interval, "finite optimizer steps in a row before the scale grows; >= 1");
    field("max_scale", max_scale, "cap on growth, >= init_scale; 16777216 = 2^24; 0 disables the cap");
    field("min_scale", min_scale, "floor for backoff; in (0, init_scale]");
    field("hysteresis", hysteresis, "overflows in a row tolerated before backing off; >= 1; 1 is PyTorch's rule");
    field("min_scale_patience", min_scale_patience,
          "overflows in a row already at min_scale before the scaler reports itself stuck; >= 1");
  }
};

// What update() did to one optimizer step.
struct ScalerUpdate {
  // The optimizer step must be skipped: true exactly when found_inf, in every mode (off
  // included: non-finite gradients are never applied).
  bool skipped = false;
  bool backed_off = false;  // the scale was reduced by this update
  bool grew = false;        // the scale was increased (false when already at max_scale)
  // Dynamic mode only: this overflow is the min_scale_patience-th or later in a row while
  // the scale was already at min_scale. The guard turns it into an anomaly.
  bool stuck = false;
  double scale_used = 1;  // scale in effect for this step's backward
  double next_scale = 1;  // scale for the next step's backward
};

class LossScaler {
 public:
  // `mode` is the resolved mode (resolve_scaler_mode): dynamic | static | off. Validates
  // `options`; throws gradguard::Error (bad input) for bad options or kAuto.
  LossScaler(const LossScalerOptions& options, ScalerMode mode);

  double scale() const;      // current scale: the loss multiplier before backward (1 when off)
  double inv_scale() const;  // 1 / scale(): what the gradient statistics multiply by
  bool enabled() const;      // mode != off
  ScalerMode mode() const { return mode_; }

  // Call once per optimizer step with the non-finite flag from the fused gradient
  // statistics (already on the host). Pure arithmetic: no tensors, no device syncs.
  ScalerUpdate update(bool found_inf);

  // Optimizer steps skipped so far; consecutive finite steps since the last growth/overflow.
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t growth_tracker() const { return growth_tracker_; }

  // {"mode", "scale", "growth_tracker", "hysteresis_left", "overflows_at_min",
  //  "skipped_steps"}; scale is written as a double and round-trips exactly.
  nlohmann::json state_dict() const;
  // Restores a state_dict(). Throws gradguard::Error (bad input, "loss scaler state")
  // on a missing or mistyped field, a negative counter, a non-positive scale, or a mode
  // that differs from this scaler's. Options that changed since the state was saved win:
  // a dynamic scale is clamped to [min_scale, max_scale], the counters to the current
  // growth_interval / hysteresis; static and off keep the scale from the options.
  void load_state_dict(const nlohmann::json& state, const std::string& where = "loss scaler state");

 private:
  LossScalerOptions options_;
  ScalerMode mode_;              // dynamic | static | off
  double scale_ = 1;             // current scale
  int64_t growth_tracker_ = 0;   // consecutive finite steps, in [0, growth_interval)
  int64_t hysteresis_left_ = 1;  // overflows still tolerated before backing off, in [1, hysteresis]
  int64_t overflows_at_min_ = 0;  // consecutive overflows with scale_used at min_scale
  int64_t skipped_steps_ = 0;
};

}  // namespace gradguard::amp
