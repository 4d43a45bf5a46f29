// Escalation and budgets of the recovery ladder.
#include "gradguard/guard/recovery.h"

#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"

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

void RecoveryLadder::load_state_dict(const nlohmann::json& s) {
  try {
    skips_ = s.at("skips").get<int64_t>();
    cooldowns_ = s.at("cooldowns").get<int64_t>();
    resets_ = s.at("resets").get<int64_t>();
    rollbacks_ = s.at("rollbacks").get<int64_t>();
    last_step_ = s.at("last_step").get<int64_t>();
    last_rung_ = s.at("last_rung").get<int64_t>();
    const auto kind = s.at("last_kind").get<std::string>();
    if (last_step_ >= 0) last_kind_ = parse_choice<AnomalyKind>(kind, "trainer_state.json: guard.recovery.last_kind");
    cooldown_from_ = s.at("cooldown_from").get<int64_t>();
    cooldown_until_ = s.at("cooldown_until").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw bad_input("trainer_state.json: guard.recovery", std::string("malformed: ") + e.what());
  }
}

}  // namespace gradguard::guard
