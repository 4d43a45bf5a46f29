// Escalation and budgets of the recovery ladder.
#include "gradguard/guard/recovery.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"

namespace gradguard::guard {

RecoveryLadder::RecoveryLadder(const RecoveryOptions& options) : options_(options) { options_.validate(); }

int64_t RecoveryLadder::budget_left(RecoveryAction action) const {
  switch (action) {
    case RecoveryAction::kSkip: return options_.skip_budget - skips_;
    case RecoveryAction::kCooldown: return options_.cooldown_budget - cooldowns_;
    case RecoveryAction::kResetMoments: return options_.reset_budget - resets_;
    case RecoveryAction::kRollback: return options_.rollback_budget - rollbacks_;
    case RecoveryAction::kPrecision: return options_.precision_budget - precisions_;
    case RecoveryAction::kHalt: return -1;
  }
  return -1;
}

RecoveryDecision RecoveryLadder::decide(int64_t step, AnomalyKind kind, bool rollback_possible) {
  const auto& ladder = options_.ladder;
  const bool escalate = last_step_ >= 0 && step - last_step_ <= options_.calm_steps && kind == last_kind_;
  size_t rung = escalate ? static_cast<size_t>(last_rung_ + 1) : 0;
  RecoveryDecision out;
  for (; rung < ladder.size(); ++rung) {
    const RecoveryAction a = ladder[rung];
    if (a == RecoveryAction::kHalt) break;
    // A wider dtype is the remedy for the loss scale's troubles only: silently not a rung
    // for any other anomaly, as if it were not in the ladder.
    if (a == RecoveryAction::kPrecision && kind != AnomalyKind::kBackoffStorm && kind != AnomalyKind::kLossScaleStuck)
      continue;
    if (a == RecoveryAction::kRollback && !rollback_possible) {
      out.note += "rollback passed over: no checkpoint to roll back to (set checkpoint.every); ";
      continue;
    }
    if (budget_left(a) <= 0) {
      out.note += std::string(name_of(a)) + " passed over: budget spent; ";
      continue;
    }
    break;
  }
  if (rung >= ladder.size() || ladder[rung] == RecoveryAction::kHalt) {
    out.action = RecoveryAction::kHalt;
    out.rung = static_cast<int64_t>(std::min(rung, ladder.size() - 1));
    out.budget_left = -1;
    if (rung >= ladder.size()) out.note += "every rung of guard.recovery.ladder is spent; ";
  } else {
    out.action = ladder[rung];
    out.rung = static_cast<int64_t>(rung);
    if (out.action == RecoveryAction::kSkip) ++skips_;
    if (out.action == RecoveryAction::kCooldown) ++cooldowns_;
    if (out.action == RecoveryAction::kResetMoments) ++resets_;
    if (out.action == RecoveryAction::kRollback) ++rollbacks_;
    if (out.action == RecoveryAction::kPrecision) {
      ++precisions_;
      precision_level_ = std::min<int64_t>(2, precision_level(step) + 1);  // inside a window: one wider still
      precision_from_ = step;
      precision_until_ = step + 1 + options_.precision_steps;
    }
    out.budget_left = budget_left(out.action);
    if (out.action == RecoveryAction::kCooldown || out.action == RecoveryAction::kResetMoments) {
      cooldown_from_ = step;
      cooldown_until_ = step + 1 + options_.cooldown_steps;
    }
  }
  if (!out.note.empty()) out.note.resize(out.note.size() - 2);
  last_step_ = step;
  last_rung_ = out.rung;
  last_kind_ = kind;
  return out;
}

double RecoveryLadder::lr_factor(int64_t step) const {
  return step > cooldown_from_ && step < cooldown_until_ ? options_.cooldown_factor : 1.0;
}

int64_t RecoveryLadder::precision_level(int64_t step) const {
  return step > precision_from_ && step < precision_until_ ? precision_level_ : 0;
}

nlohmann::json RecoveryLadder::state_dict() const {
  return {{"skips", skips_},         {"cooldowns", cooldowns_},           {"resets", resets_},
          {"rollbacks", rollbacks_}, {"last_step", last_step_},           {"last_rung", last_rung_},
          {"last_kind", last_step_ >= 0 ? name_of(last_kind_) : ""},
          {"cooldown_from", cooldown_from_}, {"cooldown_until", cooldown_until_},
          {"precisions", precisions_},   {"precision_from", precision_from_},
          {"precision_until", precision_until_}, {"precision_level", precision_level_}};
}

void RecoveryLadder::load_state_dict(const nlohmann::json& s, const std::string& where) {
  const JsonReader r(s, where, "guard.recovery");
  const int64_t skips = r.integer("skips", 0), cooldowns = r.integer("cooldowns", 0);
  const int64_t resets = r.integer("resets", 0), rollbacks = r.integer("rollbacks", 0);
  const int64_t last_step = r.integer("last_step", -1);
  const int64_t last_rung = r.integer("last_rung", -1, static_cast<int64_t>(options_.ladder.size()) - 1);
  const std::string kind = r.string("last_kind");
  const int64_t cooldown_from = r.integer("cooldown_from", -1), cooldown_until = r.integer("cooldown_until", -1);
  AnomalyKind last_kind = last_kind_;
  if (last_step >= 0) {
    bool known = false;
    for (const auto& c : choices(AnomalyKind{}))
      if (kind == c.name) last_kind = c.value, known = true;
    if (!known) r.fail("last_kind", "must name an anomaly kind (" + choice_list<AnomalyKind>() + "), got \"" + excerpt(kind) + "\"");
  }
  // The precision fallback's fields, absent from a state written before it existed.
  const bool p = r.has("precisions");
  const int64_t precisions = p ? r.integer("precisions", 0) : 0;
  const int64_t precision_from = p ? r.integer("precision_from", -1) : -1;
  const int64_t precision_until = p ? r.integer("precision_until", -1) : -1;
  const int64_t precision_level = p ? r.integer("precision_level", 0, 2) : 0;
  skips_ = skips, cooldowns_ = cooldowns, resets_ = resets, rollbacks_ = rollbacks;
  precisions_ = precisions, precision_from_ = precision_from, precision_until_ = precision_until;
  precision_level_ = precision_level;
  last_step_ = last_step, last_rung_ = last_rung, last_kind_ = last_kind;
  cooldown_from_ = cooldown_from, cooldown_until_ = cooldown_until;
}

}  // namespace gradguard::guard
