// GuardCore: the trainer's guard assembly (src/train/trainer_setup.cpp build()) for a loop
// that lives in Python. The options come from config::load_config (defaults + the
// loop's "section.key=value" overrides), so a Python run and `gradguard train` with the
// same --set values guard their steps identically; the hooks call back into Python.
#include "guard_core.h"

#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>
#include <torch/extension.h>

#include "gradguard/config/components.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/run_dir.h"

namespace py = pybind11;

namespace gradguard::python {
namespace {

using Clock = std::chrono::steady_clock;

// A batch tensor as a snapshot stores it: on the CPU, [micro-batches, micro, T] for
// inputs/targets and [micro-batches, micro] for sample numbers (a single micro-batch
// given without its leading dimension gets one).
at::Tensor evidence_tensor(const at::Tensor& t, int64_t dims) {
  if (!t.defined()) return t;
  at::Tensor out = t.detach().to(at::kCPU).contiguous();
  while (out.dim() < dims) out = out.unsqueeze(0);
  return out;
}

}  // namespace

GuardCore::GuardCore(std::vector<at::Tensor> params, std::vector<std::string> names, GuardCoreOptions options,
                     GuardCoreCallbacks callbacks)
    : options_(std::move(options)), callbacks_(std::move(callbacks)) {
  if (params.size() != names.size())
    throw bad_input("params", std::to_string(params.size()) + " parameters but " + std::to_string(names.size()) +
                                  " names; give one name per parameter");
  if (params.empty()) throw bad_input("params", "no parameters to guard");
  for (size_t i = 0; i < params.size(); ++i)
    if (!params[i].defined()) throw bad_input("params", "parameter '" + names[i] + "' is not a tensor");
  if (options_.world_size < 1) throw bad_input("world_size", "must be >= 1");
  cfg_ = config::load_config("", options_.overrides);
  param_names_ = std::make_shared<const std::vector<std::string>>(names);

  global_batch_ = options_.global_batch > 0 ? options_.global_batch : cfg_.batch.global_batch;
  tokens_per_step_ = options_.tokens_per_step > 0 ? options_.tokens_per_step : global_batch_ * cfg_.data.seq_len;

  // The run directory: config.yaml and metrics.jsonl from the main rank only.
  const bool writes = options_.main_rank && !options_.run_dir.empty();
  if (writes) {
    const RunDir run(options_.run_dir);
    if (!options_.resume && run.holds_run()) {
      if (!cfg_.run.overwrite)
        throw bad_input("run_dir", "'" + run.root() +
                                       "' already holds a run; choose another directory, pass resume=True to append "
                                       "to it, or set run.overwrite=true");
      run.clear_outputs();  // no output of the old run mixes with the new
    }
    std::filesystem::create_directories(run.root());
    if (!options_.resume || !fs::exists(run.config())) fs::write_file_atomic(run.config(), config::to_yaml(cfg_));
  }
  metrics_ = std::make_unique<train::MetricsWriter>(writes ? RunDir(options_.run_dir).metrics() : "",
                                                    static_cast<size_t>(cfg_.guard.snapshot.history),
                                                    writes && cfg_.log.tensorboard);
  if (writes) {
    std::function<void(const std::string&)> write_model;
    if (!callbacks_.write_model.is_none())
      write_model = [this](const std::string& dir) { callbacks_.write_model(dir); };
    snapshots_ = std::make_unique<forensics::SnapshotWriter>(
        options_.run_dir, cfg_.guard.snapshot, [this](const guard::StepOutcome& out) { return evidence(out); },
        std::move(write_model));
  }

  // The options the trainer builds its guard from (config/components.h), with the loop's
  // own warmup and peak learning rate when it says what they are.
  const auto g = config::guarded_step_options(
      cfg_, options_.warmup_steps >= 0 ? options_.warmup_steps : cfg_.schedule.warmup_steps,
      options_.peak_lr >= 0 ? options_.peak_lr : cfg_.optim.lr);

  guard::StepHooks hooks;  // no optimizer_step: the loop applies outcome.applied
  if (!callbacks_.moments.is_none())
    hooks.moments = [this](size_t i) {
      optim::ParamMoments m;
      py::object r = callbacks_.moments(i);
      if (r.is_none()) return m;
      auto t = r.cast<py::tuple>();
      if (t.size() != 4) throw bad_input("moments", "the moments callable must return a 4-tuple");
      if (!t[0].is_none()) m.exp_avg = t[0].cast<at::Tensor>();
      if (!t[1].is_none()) m.exp_avg_sq = t[1].cast<at::Tensor>();
      if (!t[2].is_none()) m.momentum_buffer = t[2].cast<at::Tensor>();
      m.step = t[3].cast<int64_t>();
      return m;
    };
  // Records the tensors a reset_moments decision names (outcome.reset_params), and
  // resets them when the loop gave an optimizer.
  hooks.reset_moments = [this](size_t i) {
    reset_tensors_.push_back(static_cast<int64_t>(i));
    return !callbacks_.reset_moments.is_none() && callbacks_.reset_moments(i).cast<bool>();
  };
  if (!callbacks_.rollback_available.is_none())
    hooks.rollback_available = [this] { return callbacks_.rollback_available().cast<bool>(); };
  if (snapshots_) {
    hooks.snapshot = [this](const guard::GuardedStep& step, const guard::StepOutcome& out, bool force) {
      return (*snapshots_)(step, out, force);
    };
  } else {
    const std::string why = options_.main_rank ? "no run directory" : "written by rank 0";
    hooks.snapshot = [why](const guard::GuardedStep&, const guard::StepOutcome&, bool) {
      return guard::SnapshotResult{"", why};
    };
  }
  guarded_ = std::make_unique<guard::GuardedStep>(g, std::move(params), std::move(names), std::move(hooks));
  start_ = last_end_ = Clock::now();
}

GuardCore::~GuardCore() = default;

bool GuardCore::noise_due(int64_t step) const {
  const int64_t every = cfg_.guard.noise_scale.every;
  return every > 0 && step % every == 0;
}

std::string GuardCore::metrics_path() const {
  return options_.main_rank && !options_.run_dir.empty() ? RunDir(options_.run_dir).metrics() : "";
}

CoreOutcome GuardCore::step(int64_t step, const CoreStepInputs& in) {
  struct Current {  // the evidence hook sees this step's batch while step() runs
    GuardCore& g;
    ~Current() { g.current_ = nullptr; }
  } current{*this};
  current_ = &in;
  reset_tensors_.clear();

  CoreOutcome r;
  r.outcome = guarded_->step(step, in.inputs);  // the one host read
  r.param_names = param_names_;
  r.layer_names = std::make_shared<const std::vector<std::string>>(guarded_->groups().names);
  r.reset_tensors = std::move(reset_tensors_);
  reset_tensors_.clear();

  // The step's lines, as the trainer writes them: events first, then the step line.
  const auto now = Clock::now();
  train::StepMetrics m = train::step_metrics(r.outcome, guarded_->groups().names);
  m.tokens = in.tokens > 0 ? in.tokens : tokens_per_step_;
  m.tokens_per_s = static_cast<double>(m.tokens) / std::max(std::chrono::duration<double>(now - last_end_).count(), 1e-9);
  m.elapsed_s = std::chrono::duration<double>(now - start_).count();
  metrics_->write_events(r.outcome, global_batch_);
  metrics_->write_step(m);
  last_end_ = now;
  return r;
}

forensics::SnapshotEvidence GuardCore::evidence(const guard::StepOutcome& out) const {
  forensics::SnapshotEvidence ev;
  if (current_ != nullptr) {
    ev.inputs = evidence_tensor(current_->batch_inputs, 3);
    ev.targets = evidence_tensor(current_->batch_targets, 3);
    ev.sample_index = evidence_tensor(current_->batch_sample_index, 2);
    if (ev.inputs.defined() != ev.targets.defined()) ev.inputs = ev.targets = at::Tensor();  // both or neither
  }
  ev.metrics_lines = metrics_->recent();
  ev.config_yaml = config::to_yaml(cfg_);
  ev.state = {{"loop", "python"},
              {"world_size", options_.world_size},
              {"global_batch", global_batch_},
              {"tokens_per_step", tokens_per_step_},
              {"batch_recorded", ev.inputs.defined() ? (options_.world_size > 1 ? "rank 0's share" : "whole") : "none"}};
  return ev;
}

void GuardCore::write_validation(int64_t step, double val_loss) { metrics_->write_validation(step, val_loss); }

void GuardCore::write_event(const std::string& text) {
  const auto line = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!line.is_object() || !line.contains("step"))
    throw bad_input("event", "a metrics line must be a JSON object with a \"step\", got " + text.substr(0, 80));
  metrics_->write(line);
}

std::string GuardCore::state_dict() const {
  nlohmann::json state = guarded_->state_dict();
  state["guard"]["snapshots"] = snapshots_ ? snapshots_->budget().state_dict() : nlohmann::json(nullptr);
  return state.dump();
}

void GuardCore::load_state_dict(const std::string& text, bool rollback) {
  const std::string where = "guard state";
  const auto state = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (state.is_discarded()) throw bad_input(where, "not valid JSON");
  const auto scope = rollback ? guard::RestoreScope::kRollback : guard::RestoreScope::kResume;
  try {
    guarded_->load_state_dict(state, scope, where);
    if (!rollback && snapshots_ && state.contains("guard") && state["guard"].contains("snapshots") &&
        !state["guard"]["snapshots"].is_null())
      snapshots_->budget().load_state_dict(state["guard"]["snapshots"]);
  } catch (const nlohmann::json::exception& e) {
    throw bad_input(where, "malformed: " + json_error_text(e));
  }
}

}  // namespace gradguard::python
