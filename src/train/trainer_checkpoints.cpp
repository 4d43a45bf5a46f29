// Checkpoints of a run: which one a resume continues from (rank 0 chooses, every rank
// agrees and loads it), what trainer_state.json carries and how it is restored, saving
// (with the optimizer shards of every rank), rolling back to the newest good one, and the
// result a resumed run starts from. Owns, in Trainer::State, start_step, complete,
// resume_notes and last_checkpoint; the constructor (trainer_setup.cpp) calls
// resume_candidates() and resume(), the loop (trainer.cpp) save() and rollback().
#include <filesystem>
#include <limits>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/checkpoint/optimizer_shards.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/dist/grad_sync.h"
#include "trainer_internal.h"

namespace gradguard::train {
namespace stdfs = std::filesystem;

namespace {

// The integer "step" of a metrics line, or -1 for a line that is not JSON, not an object
// or has no integer step (a line cut short by a crash, a hand-edited one).
int64_t step_of(const std::optional<nlohmann::json>& j) {
  if (!j || !j->is_object()) return -1;
  const auto it = j->find("step");
  return it != j->end() && it->is_number_integer() && it->get<int64_t>() >= 0 ? it->get<int64_t>() : -1;
}

// metrics.jsonl cut back to what was true at `step` (lines of later steps were written
// after the checkpoint a resume continues from). Lines without a valid step belong to no
// step and are dropped.
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::istringstream in(fs::read_file(path));
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const auto j = try_parse_json(line);
    const int64_t s = step_of(j);
    if (s < 0) continue;
    if (j->contains("val_loss") ? s <= step : s < step) kept += line + "\n";
  }
  fs::write_file_atomic(path, kept);
}

// What a run's metrics.jsonl says about it, for the summary of a resumed run.
// Carries an error out of the per-checkpoint try of resume without it being taken for a
// broken checkpoint (which would be skipped).
struct ConfigChanged {
  Error error;
};

struct History {
  double first_loss = std::numeric_limits<double>::quiet_NaN(), final_loss = first_loss;
  double initial_val_loss = first_loss, final_val_loss = first_loss;
  int64_t skipped_steps = 0, anomalies = 0, recovery_actions = 0, rollbacks = 0, snapshots = 0;
};

History read_history(const std::string& path) {
  History h;
  if (!fs::exists(path)) return h;
  std::istringstream in(fs::read_file(path));
  int64_t first_step = -1, last_step = -1, first_val = -1, last_val = -1;
  for (std::string line; std::getline(in, line);) {
    const auto parsed = try_parse_json(line);
    const int64_t step = step_of(parsed);
    if (step < 0) continue;
    const auto& j = *parsed;
    auto number = [&](const char* key) {
      const auto it = j.find(key);
      return it != j.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
    };
    const std::string event = j.contains("event") && j["event"].is_string() ? j["event"].get<std::string>() : "";
    if (j.contains("val_loss")) {
      if (first_val < 0 || step < first_val) first_val = step, h.initial_val_loss = number("val_loss");
      if (step >= last_val) last_val = step, h.final_val_loss = number("val_loss");
    } else if (event.empty() && j.contains("loss")) {
      if (first_step < 0 || step < first_step) first_step = step, h.first_loss = number("loss");
      if (step >= last_step) last_step = step, h.final_loss = number("loss");
      if (j.contains("skipped") && j["skipped"].is_boolean() && j["skipped"].get<bool>()) ++h.skipped_steps;
    } else if (event == "anomaly") {
      ++h.anomalies;
    } else if (event == "recovery") {
      ++h.recovery_actions;
      if (j.contains("snapshot") && j["snapshot"].is_string()) ++h.snapshots;
    } else if (event == "rollback") {
      ++h.rollbacks;
    }
  }
  return h;
}

std::string to_hex(const torch::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  auto b = bytes.contiguous();
  const auto* p = b.data_ptr<uint8_t>();
  std::string out;
  for (int64_t i = 0; i < b.numel(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

torch::Tensor from_hex(const std::string& hex, const std::string& where) {
  if (hex.size() % 2 != 0) throw bad_input(where, "rng state is not valid hex");
  auto t = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  auto* p = t.data_ptr<uint8_t>();
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw bad_input(where, "rng state is not valid hex");
  };
  for (size_t i = 0; i < hex.size() / 2; ++i) p[i] = static_cast<uint8_t>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return t;
}

}  // namespace

std::vector<std::string> Trainer::State::resume_candidates() {
  if (!main_rank()) return {};
  std::vector<std::string> rejected;
  auto candidates = checkpoint::resumable_checkpoints(run.root(), &rejected);
  for (const auto& r : rejected) resume_notes.push_back("skipped checkpoint: " + r);
  return candidates;
}

void Trainer::State::resume(const std::string& run_dir, const std::vector<std::string>& candidates) {
  const auto& c = cfg;
  std::string resume_dir;
  std::exception_ptr failure;
  // Rank 0 takes the newest checkpoint whose state checks out too: one that fails is
  // passed over and reported like a corrupt one. Nothing is truncated before one has
  // loaded.
  try {
    if (main_rank()) {
      std::string last_reason;
      for (const auto& dir : candidates) {
        try {
          // A model configured differently is the configuration's fault, not the
          // checkpoint's: every older one would fail the same way.
          const std::string difference = checkpoint::architecture_difference(dir, c.model, c.lora);
          if (!difference.empty())
            throw ConfigChanged{bad_input(dir + "/config.json", "the checkpoint has " + difference +
                                                                    ": the model changed between save and resume")};
          start_step = restore(dir, guard::RestoreScope::kResume);
          resume_dir = dir;
          break;
        } catch (const ConfigChanged& changed) {
          throw changed.error;
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::kBadInput) throw;
          last_reason = e.what();
          resume_notes.push_back("skipped checkpoint: " + last_reason);
        }
      }
      if (resume_dir.empty())
        throw bad_input(run_dir, "no checkpoint can be resumed: every one was rejected (the newest: " +
                                            last_reason + ")");
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree("checkpoint choice", failure);
  if (comm) resume_dir = comm->broadcast_string(resume_dir, "checkpoint choice broadcast");
  try {
    if (!main_rank()) start_step = restore(resume_dir, guard::RestoreScope::kResume);
    if (start_step > c.schedule.total_steps)
      throw bad_input("schedule.total_steps", "the checkpoint is at step " + std::to_string(start_step) +
                                                  ", past schedule.total_steps = " +
                                                  std::to_string(c.schedule.total_steps));
    complete = start_step == c.schedule.total_steps;
    resume_notes.push_back("resumed from " + resume_dir + " (step " + std::to_string(start_step) + ")");
    last_checkpoint = {start_step, resume_dir};
    // A complete run is left exactly as it is.
    if (main_rank() && !complete) {
      truncate_metrics(run.metrics(), start_step);
      fs::write_file_atomic(run.config(), config::to_yaml(c));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree("resume", failure);
}

std::string Trainer::State::save(int64_t steps_done, bool periodic) {
  std::vector<std::string> shard_files;
  stdfs::path staging;
  try {
    // A checkpoint is something to resume from: one whose weights are not finite would
    // only carry the damage forward (every rank holds the same weights, so all agree).
    // One flag for all tensors: a single device-to-host copy per checkpoint (none on the
    // CPU), next to the checkpoint's own copies of every weight.
    std::vector<torch::Tensor> finite;
    for (const auto& p : params) finite.push_back(torch::isfinite(p.detach()).all());
    const auto all_finite = torch::stack(finite).all().to(torch::kCPU);
    if (!*all_finite.data_ptr<bool>()) {
      size_t i = 0;
      while (i + 1 < params.size() && finite[i].to(torch::kCPU).data_ptr<bool>()[0]) ++i;
      throw runtime_error(RunDir(run.root()).checkpoint(steps_done),
                          "checkpoint not written: the weights of '" + names[i] +
                              "' hold non-finite values; earlier checkpoints are intact");
    }
    if (sharded) {
      // Every rank writes its shard next to the checkpoints; rank 0 moves them into the
      // checkpoint it commits. The ranks agree first: no checkpoint without every shard.
      char name[48];
      std::snprintf(name, sizeof name, ".shards-step-%07lld", static_cast<long long>(steps_done));
      staging = stdfs::path(run.checkpoints()) / name;
      std::exception_ptr failure;
      const auto& sh = sharded->sharding();
      try {
        stdfs::create_directories(staging);
        // Whole state on every rank (zero_stage 0): rank 0's copy is the checkpoint's.
        if (sh.world_size > 1 || main_rank())
          checkpoint::save_optimizer_shard((staging / checkpoint::optimizer_shard_file(sh.rank, sh.world_size)).string(),
                                           *sharded);
        if (main_rank())
          fs::write_file_atomic((staging / checkpoint::kOptimizerShardsLayout).string(),
                                checkpoint::optimizer_shards_layout(*sharded).dump(1) + "\n");
      } catch (const stdfs::filesystem_error& e) {
        failure = std::make_exception_ptr(
            runtime_error(staging.string(), std::string("checkpoint not written (") + e.what() + ")"));
      } catch (...) {
        failure = std::current_exception();
      }
      agree("checkpoint shards", failure);
      if (!main_rank()) return "";
      shard_files.push_back((staging / checkpoint::kOptimizerShardsLayout).string());
      for (int64_t r = 0; r < sh.world_size; ++r)
        shard_files.push_back((staging / checkpoint::optimizer_shard_file(r, sh.world_size)).string());
    }
    if (!main_rank()) return "";
    auto dir = checkpoint::save_checkpoint(run.checkpoints(), steps_done, *model, *optimizer,
                                           trainer_state(steps_done), config::to_yaml(cfg), cfg.checkpoint.keep_last,
                                           shard_files, forensics::pinned_checkpoints(run.root()));
    last_checkpoint = {steps_done, dir};
    if (!staging.empty()) stdfs::remove_all(staging);
    return dir;
  } catch (const Error& e) {
    std::error_code ec;
    if (!staging.empty() && main_rank()) stdfs::remove_all(staging, ec);
    // A failed shard stops every rank (they agreed on it and the failing rank has
    // reported it); a single process goes on, as without sharding.
    if (!periodic || e.kind() != ErrorKind::kRuntime || (sharded && comm)) throw;
    // The run goes on (the next checkpoint tries again); the last good one stays usable.
    metrics->write(nlohmann::ordered_json{{"step", steps_done}, {"event", "warning"},
                                          {"kind", "checkpoint_not_written"}, {"message", e.what()}});
    progress->line(std::string("warning: ") + e.what());
    return "";
  }
}

int64_t Trainer::State::rollback(int64_t step, std::string* checkpoint_dir) {
  std::vector<std::string> rejected;
  // Rank 0 picks the checkpoint; every rank loads it (the run directory must be visible
  // to all ranks, as on a shared filesystem) and the replicas are verified equal.
  if (main_rank()) *checkpoint_dir = checkpoint::find_resumable(run.root(), &rejected);
  if (comm) *checkpoint_dir = comm->broadcast_string(*checkpoint_dir, "rollback checkpoint choice");
  const int64_t to = restore(*checkpoint_dir, guard::RestoreScope::kRollback);
  if (comm) dist::verify_parameters(*comm, params, names, to);
  TORCH_INTERNAL_ASSERT(to <= step + 1);
  // The window that led to the anomaly is steps [to, step]; skip its data (and any extra
  // steps asked for) so the continuation reads fresh batches.
  source->skip(step + 1 - to + cfg.guard.recovery.rollback_skip_steps);
  return to;
}

TrainResult Trainer::State::result_so_far() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  TrainResult r;
  r.run_dir = run.root();
  r.rank = env.rank;
  r.world_size = env.world_size;
  r.parameters = model::count_parameters(*model);
  r.initial_val_loss = r.final_val_loss = nan;
  r.steps = start_step;
  r.complete = complete;
  if (start_step == 0) return r;
  r.resumed_from = start_step;
  r.first_loss = r.final_loss = nan;
  if (!main_rank()) return r;
  // The run's own history: its first numbers, and all of them when it is complete.
  const auto history = read_history(run.metrics());
  r.first_loss = history.first_loss;
  r.initial_val_loss = history.initial_val_loss;
  if (complete) {
    r.final_loss = history.final_loss;
    r.final_val_loss = history.final_val_loss;
    r.skipped_steps = history.skipped_steps;
    r.anomalies = history.anomalies;
    r.recovery_actions = history.recovery_actions;
    r.rollbacks = history.rollbacks;
    r.snapshots = history.snapshots;
    r.checkpoint_dir = run.checkpoint(start_step);
  }
  return r;
}

nlohmann::ordered_json Trainer::State::trainer_state(int64_t steps_done) const {
  const auto g = guarded->state_dict();
  nlohmann::ordered_json guard_state = g.at("guard");
  guard_state["snapshots"] = snapshots ? snapshots->budget().state_dict() : nlohmann::json(nullptr);
  return {{"step", steps_done},
          {"scaler", g.at("scaler")},
          {"clipper", g.at("clipper")},
          {"rng", to_hex(at::detail::getDefaultCPUGenerator().get_state())},
          {"data_offset", source->offset()},
          {"last_scale_growth", g.at("last_scale_growth")},
          {"guard", guard_state}};
}

void Trainer::State::check_loaded_values(const std::string& dir) const {
  // Values no training step produces: the checkpoint is refused like a corrupt one (resume
  // falls back to the one before). One host read per tensor, at restore only.
  const std::string optimizer_file =
      sharded ? dir + "/" + checkpoint::optimizer_shard_file(env.rank, env.world_size) : dir + "/optimizer.pt";
  const auto bad = [](const torch::Tensor& t) { return !torch::isfinite(t).all().item<bool>(); };
  for (size_t i = 0; i < params.size(); ++i) {
    if (bad(params[i].detach()))
      throw bad_input(dir + "/model.safetensors", "tensor '" + names[i] + "' holds non-finite values");
    if (!guarded->hooks().moments) continue;
    const auto m = guarded->hooks().moments(i);
    if (m.exp_avg.defined() && bad(m.exp_avg))
      throw bad_input(optimizer_file, "exp_avg of '" + names[i] + "' holds non-finite values");
    if (m.exp_avg_sq.defined() && (bad(m.exp_avg_sq) || (m.exp_avg_sq < 0).any().item<bool>()))
      throw bad_input(optimizer_file, "exp_avg_sq of '" + names[i] +
                                          "' holds non-finite or negative values (a second moment is a mean of squares)");
    if (m.momentum_buffer.defined() && bad(m.momentum_buffer))
      throw bad_input(optimizer_file, "momentum_buffer of '" + names[i] + "' holds non-finite values");
  }
}

int64_t Trainer::State::restore(const std::string& dir, guard::RestoreScope scope) {
  // Every field of trainer_state.json is checked before anything is loaded: a checkpoint
  // whose state is wrong (a negative step, a short RNG state, a counter of the wrong
  // type) is rejected whole, like a corrupt one, and the model stays as it was.
  const std::string where = dir + "/trainer_state.json";
  const auto st = read_json_file(where);
  const JsonReader r(st, where);
  r.integer("step", 0);
  const int64_t offset = r.has("data_offset") ? r.integer("data_offset", 0) : 0;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const auto rng = from_hex(r.string("rng"), where);
  if (rng.numel() != gen.get_state().numel())
    r.fail("rng", "holds " + std::to_string(rng.numel()) + " bytes of generator state, this LibTorch's CPU generator " +
                      std::to_string(gen.get_state().numel()));
  guard::GuardedStep(guarded->options(), params, names).load_state_dict(st, scope, where);
  const bool with_snapshots = scope == guard::RestoreScope::kResume && snapshots && r.has("guard") &&
                              r.object("guard").has("snapshots") && !r.object("guard").raw("snapshots").is_null();
  if (with_snapshots) forensics::SnapshotBudget(cfg.guard.snapshot).load_state_dict(r.object("guard").raw("snapshots"), where);

  auto loaded = checkpoint::load_checkpoint(dir, *model, *optimizer);  // checks the architecture and every tensor
  check_loaded_values(dir);
  guarded->load_state_dict(st, scope, where);
  gen.set_state(rng);
  if (scope == guard::RestoreScope::kResume) {
    source->set_offset(offset);
    if (with_snapshots) snapshots->budget().load_state_dict(r.object("guard").raw("snapshots"), where);
  }
  return loaded.step;
}

}  // namespace gradguard::train
