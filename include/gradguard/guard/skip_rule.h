// The skip rule of OLMo-core's SkipStepOptimizer (OLMo 2, arXiv 2501.00656): a step whose
// loss or global gradient norm lies more than `sigma` standard deviations above the mean
// of the previous `window` steps' values is not applied. It needs nothing but the two
// numbers the guarded step already reads in its one host copy, so it costs no sync.
//
// Exactly: with the last n <= window recorded values x_1..x_n (before this step) and
// their mean m and sample standard deviation s (n - 1 in the denominator, torch.std's
// default), the step is skipped when x - m > sigma * s for its loss or its gradient norm.
// The rule is armed once n >= max(2, window / 2). Every step with a finite loss and norm
// is recorded afterwards, skipped or not, as OLMo-core records every step's values (so a
// lasting shift of the loss becomes the new normal within the window instead of
// skipping forever); non-finite ones are left out, which the loss scaler deals with.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace gradguard::guard {

struct SkipDecision {
  bool armed = false;   // enough history to judge
  bool skip = false;    // the rule fired
  double loss_limit = 0, grad_norm_limit = 0;  // m + sigma s of each, when armed
};

class SkipRule {
 public:
  SkipRule(double sigma, int64_t window);  // sigma 0 = off

  bool enabled() const { return sigma_ > 0; }
  // Judges a step against the history, then records its values (when finite).
  SkipDecision observe(double loss, double grad_norm);
  size_t size() const { return losses_.size(); }

  nlohmann::json state_dict() const;
  // Checks every field before it changes anything; throws gradguard::Error (bad input)
  // naming `where` and the field.
  void load_state_dict(const nlohmann::json& state, const std::string& where);

 private:
  double sigma_;
  size_t window_;
  std::deque<double> losses_, norms_;
};

}  // namespace gradguard::guard
