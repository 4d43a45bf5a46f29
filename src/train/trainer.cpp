// The loop reads top to bottom: per step, set the lr, accumulate gradients over the
// micro-batches, clip (the one host sync of the step, which also reads the loss), step
// the optimizer unless the gradients are non-finite, then write metrics, validate and
// checkpoint on their cadences. Checkpoints are written to a temporary directory and
// renamed, so a crash never leaves a half-written one behind.
#include "gradguard/train/trainer.h"

#include <chrono>
#include <ctime>
#include <filesystem>
#include <limits>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/threads.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/amp/loss_scaler.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/optim/schedule.h"
#include "gradguard/train/metrics.h"
#include "gradguard/train/progress.h"
#include "gradguard/train/step.h"

namespace gradguard::train {
namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Trainer::State {
  config::Config cfg;
  std::FILE* out = stdout;
  torch::Device device = torch::kCPU;
  std::string run_dir;
  ThreadReport threads;
  model::LlamaForCausalLM model{nullptr};
  std::shared_ptr<data::TokenDataset> train, val;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;  // [tensor] HF parameter names, parallel to params
  std::unique_ptr<amp::LossScaler> scaler;
  std::unique_ptr<grad::GradStatsComputer> stats;
  std::unique_ptr<grad::Clipper> clipper;
  double peak_lr = 0;  // optim.lr after the batch-size scaling rule
  int64_t start_step = 0;                // first step to run (> 0 after a resume)
  std::vector<std::string> resume_notes;  // what the resume did, for the progress display
};

namespace {

torch::Device resolve_device(const std::string& name) {
  if (name == "cpu") return torch::kCPU;
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (!torch::cuda::is_available())
    throw bad_input("run.device", "'" + name + "' requested but this LibTorch build sees no CUDA/ROCm device");
  return torch::Device(name);
}

std::string default_run_name(const config::Config& c) {
  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return "llama-" + std::to_string(c.model.num_layers) + "x" + std::to_string(c.model.hidden_size) + "-" + stamp;
}

// metrics.jsonl cut back to what was true at `step` (lines of later steps were written
// after the checkpoint a resume continues from).
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::istringstream in(fs::read_file(path));
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("step")) continue;  // a line cut short by a crash
    const int64_t s = j["step"].get<int64_t>();
    if (j.contains("val_loss") ? s <= step : s < step) kept += line + "\n";
  }
  fs::write_file_atomic(path, kept);
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

Trainer::Trainer(config::Config config, std::FILE* out, const std::string& resume_run_dir)
    : s_(std::make_unique<State>()) {
  s_->out = out;
  auto& c = s_->cfg = std::move(config);
  c.finalize();
  s_->device = resolve_device(c.run.device);
  amp::check_supported(c.amp, s_->device);
  configure_allocator();
  s_->threads = configure_threads(c.run.threads);
  torch::manual_seed(c.run.seed);

  if (!c.model.init_from.empty()) {
    auto from = c.model.init_from;
    c.model = checkpoint::read_hf_config(from, c.model);
    c.model.init_from = from;
    c.finalize();
  }
  auto train_file = std::make_shared<data::TokenFile>(c.data.train_path, c.model.vocab_size);
  s_->train = std::make_shared<data::TokenDataset>(train_file, c.data.seq_len, c.data.shuffle, c.run.seed);
  if (!c.data.val_path.empty()) {
    auto val_file = std::make_shared<data::TokenFile>(c.data.val_path, c.model.vocab_size);
    s_->val = std::make_shared<data::TokenDataset>(val_file, c.data.seq_len, false, c.run.seed);
  }

  s_->model = model::LlamaForCausalLM(c.model);
  if (!c.model.init_from.empty()) checkpoint::load_hf_weights(c.model.init_from, *s_->model);
  s_->model->to(s_->device);
  optim::NamedParameters named;
  for (const auto& item : s_->model->named_parameters()) {
    named.emplace_back(item.key(), item.value());
    s_->params.push_back(item.value());
    s_->names.push_back(item.key());
  }
  s_->peak_lr = optim::scaled_lr(c.optim.lr, c.optim.lr_scaling, c.optim.base_batch, c.batch.global_batch);
  optim::OptimOptions optim_options = c.optim;
  optim_options.lr = s_->peak_lr;
  s_->optimizer = optim::make_optimizer(named, optim_options);
  s_->scaler = std::make_unique<amp::LossScaler>(c.amp.scaler, amp::resolve_scaler_mode(c.amp.scaler, c.amp.dtype));
  s_->stats = std::make_unique<grad::GradStatsComputer>(s_->params, s_->names);
  s_->clipper = std::make_unique<grad::Clipper>(c.clip, s_->params, s_->names);

  if (!resume_run_dir.empty()) {
    s_->run_dir = resume_run_dir;
    std::vector<std::string> rejected;
    const std::string dir = checkpoint::find_resumable(resume_run_dir, &rejected);
    for (const auto& r : rejected) s_->resume_notes.push_back("skipped checkpoint: " + r);
    auto loaded = checkpoint::load_checkpoint(dir, *s_->model, *s_->optimizer);
    const auto& st = loaded.trainer_state;
    try {
      s_->scaler->load_state_dict(st.at("scaler"));
      s_->clipper->load_state_dict(st.at("clipper"));
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(from_hex(st.at("rng").get<std::string>(), dir));
    } catch (const nlohmann::json::exception& e) {
      throw bad_input(dir + "/trainer_state.json", std::string("malformed: ") + e.what());
    }
    s_->start_step = loaded.step;
    if (s_->start_step > c.schedule.total_steps)
      throw bad_input("schedule.total_steps", "the checkpoint is at step " + std::to_string(s_->start_step) +
                                                  ", past schedule.total_steps = " +
                                                  std::to_string(c.schedule.total_steps));
    s_->resume_notes.push_back("resumed from " + dir + " (step " + std::to_string(s_->start_step) + ")");
    truncate_metrics(s_->run_dir + "/metrics.jsonl", s_->start_step);
    fs::write_file_atomic(s_->run_dir + "/config.yaml", config::to_yaml(c));
    return;
  }
  if (c.run.name.empty()) c.run.name = default_run_name(c);
  s_->run_dir = (stdfs::path(c.run.dir) / c.run.name).string();
  const bool has_run = fs::exists(s_->run_dir + "/metrics.jsonl") || fs::exists(s_->run_dir + "/config.yaml");
  if (has_run && !c.run.overwrite)
    throw bad_input("run.name", "run directory '" + s_->run_dir +
                                    "' already holds a run; choose another run.name or set run.overwrite=true");
  if (has_run) {
    stdfs::remove(s_->run_dir + "/metrics.jsonl");
    stdfs::remove_all(s_->run_dir + "/checkpoints");
  }
  stdfs::create_directories(s_->run_dir);
  fs::write_file_atomic(s_->run_dir + "/config.yaml", config::to_yaml(c));
}

Trainer::~Trainer() = default;
const config::Config& Trainer::config() const { return s_->cfg; }
const std::string& Trainer::run_dir() const { return s_->run_dir; }

TrainResult Trainer::run() {
  const auto& c = s_->cfg;
  auto& model = *s_->model;
  // min_lr scales with lr so the floor keeps its ratio to the peak.
  optim::ScheduleOptions schedule_options = c.schedule;
  schedule_options.min_lr *= s_->peak_lr / c.optim.lr;
  const optim::LrSchedule schedule(s_->peak_lr, schedule_options);
  MetricsWriter metrics(s_->run_dir + "/metrics.jsonl");
  Progress progress(c.log.progress, c.schedule.total_steps, c.log.every, s_->out);
  const double nan = std::numeric_limits<double>::quiet_NaN();

  TrainResult result;
  result.run_dir = s_->run_dir;
  result.parameters = model::count_parameters(model);
  result.initial_val_loss = result.final_val_loss = nan;
  char header[512];
  std::snprintf(header, sizeof header,
                "gradguard %s | model %lld params (%lld layers x %lld wide) | %lld seq x %lld tokens = %lld tokens/step "
                "(micro %lld x accum %lld) | %lld threads, BLAS %s | run %s",
                GRADGUARD_VERSION, (long long)result.parameters, (long long)c.model.num_layers,
                (long long)c.model.hidden_size, (long long)c.batch.global_batch, (long long)c.data.seq_len,
                (long long)(c.batch.global_batch * c.data.seq_len), (long long)c.batch.micro_batch,
                (long long)c.batch.accum_steps, (long long)s_->threads.intra_op, s_->threads.blas.c_str(),
                s_->run_dir.c_str());
  progress.line(header);
  for (const auto& w : c.warnings) progress.line("warning: " + w);
  for (const auto& n : s_->resume_notes) progress.line(n);
  if (s_->peak_lr != c.optim.lr) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "optim.lr_scaling %s: peak lr %.3e (optim.lr %.3e at base_batch %lld)",
                  c.optim.lr_scaling.c_str(), s_->peak_lr, c.optim.lr, (long long)c.optim.base_batch);
    progress.line(msg);
  }

  auto validate = [&](int64_t step) {
    if (!s_->val) return nan;
    double v = evaluate(model, *s_->val, c.batch.micro_batch, c.eval.batches, c.amp, s_->device);
    metrics.write_validation(step, v);
    char msg[128];
    std::snprintf(msg, sizeof msg, "step %lld/%lld | val_loss %.4f", (long long)step,
                  (long long)c.schedule.total_steps, v);
    progress.line(msg);
    return v;
  };
  model.train();
  if (s_->start_step == 0) result.initial_val_loss = validate(0);
  result.resumed_from = s_->start_step > 0 ? s_->start_step : -1;
  auto save = [&](int64_t steps_done) {
    nlohmann::ordered_json state = {{"step", steps_done},
                                    {"scaler", s_->scaler->state_dict()},
                                    {"clipper", s_->clipper->state_dict()},
                                    {"rng", to_hex(at::detail::getDefaultCPUGenerator().get_state())}};
    return checkpoint::save_checkpoint(s_->run_dir + "/checkpoints", steps_done, model, *s_->optimizer, state,
                                       config::to_yaml(c), c.checkpoint.keep_last);
  };

  const int64_t tokens_per_step = c.batch.global_batch * c.data.seq_len;
  const auto start = Clock::now();
  result.steps = s_->start_step;
  for (int64_t step = s_->start_step; step < c.schedule.total_steps; ++step) {
    const auto step_start = Clock::now();
    const double lr = schedule.lr_at(step);
    optim::set_learning_rate(*s_->optimizer, lr);
    for (auto& p : s_->params) p.mutable_grad() = torch::Tensor();  // set_to_none: fresh buffers

    // Sample k = (step * accum + m) * micro + b (DESIGN.md deterministic order).
    std::vector<data::Batch> micro;
    for (int64_t m = 0; m < c.batch.accum_steps; ++m)
      micro.push_back(s_->train->batch((step * c.batch.accum_steps + m) * c.batch.micro_batch, c.batch.micro_batch));
    const double loss_scale = s_->scaler->scale();
    auto loss = accumulate_gradients(model, micro, tokens_per_step, c.amp, s_->device, loss_scale);
    const auto& inject = c.debug.inject_nonfinite_steps;
    if (std::find(inject.begin(), inject.end(), step) != inject.end()) {
      torch::NoGradGuard no_grad;
      s_->params[0].grad().view(-1)[0].fill_(std::numeric_limits<float>::infinity());
    }

    // The guarded step: one statistics pass (the step's single host sync, which also
    // reads the loss), host-side clip and scaler decisions, then the update unless the
    // gradients were non-finite.
    auto stats = s_->stats->compute(1.0 / loss_scale, {loss}, s_->clipper->device_hook());
    auto clip = s_->clipper->apply(stats);
    auto scaler = s_->scaler->update(stats.nonfinite);
    StepMetrics m;
    m.step = step;
    m.loss = stats.extras[0];
    m.lr = lr;
    m.grad_norm = clip.grad_norm;
    m.clip_coef = clip.clip_coef;
    m.clip_threshold = clip.threshold;
    m.loss_scale = loss_scale;
    m.skipped = scaler.skipped;
    for (size_t k = 0; k < stats.layer_norms.size(); ++k)
      m.layer_grad_norms.emplace_back(s_->stats->groups().names[k], stats.layer_norms[k]);
    if (m.skipped) {
      ++result.skipped_steps;
      nlohmann::ordered_json event = {{"step", step}, {"event", "skip"}, {"reason", "nonfinite_gradients"},
                                      {"loss_scale", loss_scale}, {"next_loss_scale", scaler.next_scale}};
      metrics.write(event);
    } else {
      s_->optimizer->step();
    }
    if (scaler.stuck) {
      nlohmann::ordered_json event = {{"step", step}, {"event", "anomaly"}, {"kind", "loss_scale_stuck"},
                                      {"loss_scale", loss_scale}, {"min_scale", c.amp.scaler.min_scale}};
      metrics.write(event);
      metrics.write_step(m);
      throw Error(ErrorKind::kHalted, "amp.scaler.min_scale",
                  "step " + std::to_string(step) + ": gradients overflow even at the minimum loss scale " +
                      std::to_string(c.amp.scaler.min_scale) + " (" + std::to_string(c.amp.scaler.min_scale_patience) +
                      " steps in a row); training cannot make progress. Run directory: " + s_->run_dir);
    }
    m.tokens = tokens_per_step;
    const double dt = std::chrono::duration<double>(Clock::now() - step_start).count();
    m.tokens_per_s = tokens_per_step / dt;
    m.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    metrics.write_step(m);
    progress.step(m);
    if (step == s_->start_step) result.first_loss = m.loss;
    result.final_loss = m.loss;
    result.steps = step + 1;

    const bool last = step + 1 == c.schedule.total_steps;
    if (c.eval.every > 0 && (step + 1) % c.eval.every == 0 && !last) validate(step + 1);
    if (c.checkpoint.every > 0 && (step + 1) % c.checkpoint.every == 0 && !last)
      save(step + 1);
  }
  result.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  result.tokens_per_s = (result.steps - s_->start_step) * tokens_per_step / std::max(result.elapsed_s, 1e-9);
  result.final_val_loss = validate(result.steps);
  result.checkpoint_dir = save(result.steps);
  progress.finish();
  return result;
}

}  // namespace gradguard::train
