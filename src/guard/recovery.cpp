// Escalation and budgets of the recovery ladder.
#include "gradguard/guard/recovery.h"

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

nlohmann::json RecoveryLadder::state_dict() const {
  return {{"skips", skips_},         {"cooldowns", cooldowns_},           {"resets", resets_},
          {"rollbacks", rollbacks_}, {"last_step", last_step_},           {"last_rung", last_rung_},
          {"last_kind", last_step_ >= 0 ? name_of(last_kind_) : ""},
          {"cooldown_from", cooldown_from_}, {"cooldown_until", cooldown_until_}};
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
  skips_ = skips, cooldowns_ = cooldowns, resets_ = resets, rollbacks_ = rollbacks;
  last_step_ = last_step, last_rung_ = last_rung, last_kind_ = last_kind;
  cooldown_from_ = cooldown_from, cooldown_until_ = cooldown_until;
}

}  // namespace gradguard::guard
