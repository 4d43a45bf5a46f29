// Setting a run up: the model, data, optimizer and guard from a validated Config, the
// run directory (fresh, or an existing one to resume), and the pieces of trainer state
// that checkpoints carry (trainer_state.json) and restore. The step loop is in
// trainer.cpp.
#include <ctime>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/device.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/optim/optimizer.h"
#include "trainer_internal.h"

namespace gradguard::train {
namespace stdfs = std::filesystem;

namespace {

// run.device for this rank: a GPU gets an index (dist::gpu_for_rank: cuda:LOCAL_RANK
// when several ranks share the node) and becomes the current device.
torch::Device resolve_device(const std::string& name, const dist::DistEnv& env) {
  if (name == "cpu") return torch::kCPU;
  if (name == "auto" && !torch::cuda::is_available()) return torch::kCPU;
  if (!torch::cuda::is_available())
    throw bad_input("run.device", "'" + name + "' requested but this LibTorch build sees no CUDA/ROCm device");
  const torch::Device requested(name == "auto" ? "cuda" : name);
  const auto index = dist::gpu_for_rank(requested.has_index() ? requested.index() : -1, env.local_rank,
                                        env.local_world_size, static_cast<int64_t>(torch::cuda::device_count()));
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  make_current(device);
  return device;
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
  s_->env = dist::detect_env();
  c.finalize(s_->env.world_size);
  s_->device = resolve_device(c.run.device, s_->env);
  amp::check_supported(c.amp, s_->device);
  configure_allocator();
  // Ranks sharing a node share its cores: by default each takes its share, so ATen's
  // threads of one rank do not fight another's.
  s_->threads = configure_threads(default_threads(c.run.threads, s_->env.local_world_size), c.run.thread_pool);
  if (s_->env.distributed()) s_->comm = std::make_unique<dist::Communicator>(s_->env, c.dist, s_->device);
  torch::manual_seed(c.run.seed);

  // Everything that can fail on one rank alone (a data file, init_from, the run
  // directory) happens before the ranks agree; collectives only after they have.
  std::string resume_dir;
  std::exception_ptr failure;
  try {
    s_->build();
    if (!resume_run_dir.empty()) {
      s_->run_dir = resume_run_dir;
      if (s_->main_rank()) {
        std::vector<std::string> rejected;
        resume_dir = checkpoint::find_resumable(resume_run_dir, &rejected);
        for (const auto& r : rejected) s_->resume_notes.push_back("skipped checkpoint: " + r);
      }
    } else if (s_->main_rank()) {
      s_->create_run_dir();
    }
  } catch (...) {
    failure = std::current_exception();
  }
  s_->agree("setup", failure);
  if (s_->comm) {
    s_->run_dir = s_->comm->broadcast_string(s_->run_dir, "run directory broadcast");
    resume_dir = s_->comm->broadcast_string(resume_dir, "checkpoint choice broadcast");
  }

  if (!resume_run_dir.empty()) {
    try {
      s_->start_step = s_->restore(resume_dir, /*with_guard=*/true);
      if (s_->start_step > c.schedule.total_steps)
        throw bad_input("schedule.total_steps", "the checkpoint is at step " + std::to_string(s_->start_step) +
                                                    ", past schedule.total_steps = " +
                                                    std::to_string(c.schedule.total_steps));
      s_->resume_notes.push_back("resumed from " + resume_dir + " (step " + std::to_string(s_->start_step) + ")");
      if (s_->main_rank()) {
        truncate_metrics(s_->run_dir + "/metrics.jsonl", s_->start_step);
        fs::write_file_atomic(s_->run_dir + "/config.yaml", config::to_yaml(c));
      }
    } catch (...) {
      failure = std::current_exception();
    }
    s_->agree("resume", failure);
  }
  if (s_->comm) {
    // Replicas start equal: from rank 0's initialisation, or (resumed) from the same
    // checkpoint, which is verified rather than trusted.
    if (resume_run_dir.empty())
      dist::broadcast_parameters(*s_->comm, s_->params);
    else
      dist::verify_parameters(*s_->comm, s_->params, s_->names, s_->start_step);
    s_->sync = std::make_unique<dist::GradSync>(s_->params, *s_->comm, c.dist, s_->side_slots());
    s_->resume_notes.push_back("data parallel: " + s_->env.describe() + ", backend " + s_->comm->backend() +
                               ", " + std::to_string(s_->sync->num_buckets()) + " gradient buckets, hook " +
                               c.dist.hook);
  }
}

void Trainer::State::build() {
  auto& c = cfg;
  if (!c.model.init_from.empty()) {
    auto from = c.model.init_from;
    c.model = checkpoint::read_hf_config(from, c.model);
    c.model.init_from = from;
    c.finalize(env.world_size);
  }
  auto train_file = std::make_shared<data::TokenFile>(c.data.train_path, c.model.vocab_size);
  train = std::make_shared<data::TokenDataset>(train_file, c.data.seq_len, c.data.shuffle, c.run.seed);
  if (!c.data.val_path.empty()) {
    auto val_file = std::make_shared<data::TokenFile>(c.data.val_path, c.model.vocab_size);
    val = std::make_shared<data::TokenDataset>(val_file, c.data.seq_len, false, c.run.seed);
  }

  model = model::LlamaForCausalLM(c.model);
  if (!c.model.init_from.empty()) checkpoint::load_hf_weights(c.model.init_from, *model);
  model->to(device);
  optim::NamedParameters named;
  for (const auto& item : model->named_parameters()) {
    named.emplace_back(item.key(), item.value());
    params.push_back(item.value());
    names.push_back(item.key());
  }
  peak_lr = optim::scaled_lr(c.optim.lr, c.optim.lr_scaling, c.optim.base_batch, c.batch.global_batch);
  optim::OptimOptions optim_options = c.optim;
  optim_options.lr = peak_lr;
  optimizer = optim::make_optimizer(named, optim_options);
  scaler = std::make_unique<amp::LossScaler>(c.amp.scaler, amp::resolve_scaler_mode(c.amp.scaler, c.amp.dtype));
  stats = std::make_unique<grad::GradStatsComputer>(params, names);
  clipper = std::make_unique<grad::Clipper>(c.clip, params, names);

  const auto& layer_names = stats->groups().names;
  const int64_t warmup = c.guard.warmup >= 0 ? c.guard.warmup : c.schedule.warmup_steps;
  detector = std::make_unique<guard::AnomalyDetector>(c.guard, layer_names, warmup);
  ladder = std::make_unique<guard::RecoveryLadder>(c.guard.recovery);
  snapshots = std::make_unique<guard::SnapshotBudget>(c.guard.snapshot);
  noise = std::make_unique<guard::NoiseScaleEstimator>(c.guard.noise_scale.ema);
  if (c.telemetry.enabled) sampler = std::make_unique<telemetry::Sampler>(c.telemetry);
  prefetcher = std::make_unique<data::BatchPrefetcher>(
      [this](const data::BatchPrefetcher::Key& k) { return micro_batches(k[0], k[1], k[2] != 0, env.rank); },
      device);
}

void Trainer::State::create_run_dir() {
  auto& c = cfg;
  if (c.run.name.empty()) c.run.name = default_run_name(c);
  run_dir = (stdfs::path(c.run.dir) / c.run.name).string();
  const bool has_run = fs::exists(run_dir + "/metrics.jsonl") || fs::exists(run_dir + "/config.yaml");
  if (has_run && !c.run.overwrite)
    throw bad_input("run.name", "run directory '" + run_dir +
                                    "' already holds a run; choose another run.name or set run.overwrite=true");
  if (has_run) {  // everything a run writes, so no output of the old run mixes with the new
    stdfs::remove(run_dir + "/metrics.jsonl");
    stdfs::remove_all(run_dir + "/checkpoints");
    stdfs::remove_all(run_dir + "/snapshots");
    for (const char* f : {"report.html", "steps.csv", "telemetry.csv"}) stdfs::remove(run_dir + "/" + f);
    std::error_code ec;
    for (const auto& e : stdfs::directory_iterator(run_dir, ec))
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) stdfs::remove(e.path(), ec);
  }
  stdfs::create_directories(run_dir);
  fs::write_file_atomic(run_dir + "/config.yaml", config::to_yaml(c));
}

void Trainer::State::agree(const std::string& phase, const std::exception_ptr& error) {
  if (!comm) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::string message;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "unknown error";
    }
    comm->report_failure(message);
  }
  comm->agree(phase, message);
  if (error) std::rethrow_exception(error);
}

nlohmann::ordered_json Trainer::State::trainer_state(int64_t steps_done) const {
  return {{"step", steps_done},
          {"scaler", scaler->state_dict()},
          {"clipper", clipper->state_dict()},
          {"rng", to_hex(at::detail::getDefaultCPUGenerator().get_state())},
          {"data_offset", data_offset},
          {"last_scale_growth", last_scale_growth},
          {"guard",
           {{"detector", detector->state_dict()},
            {"recovery", ladder->state_dict()},
            {"snapshots", snapshots->state_dict()},
            {"noise_scale", noise->state_dict()}}}};
}

int64_t Trainer::State::restore(const std::string& dir, bool with_guard) {
  auto loaded = checkpoint::load_checkpoint(dir, *model, *optimizer);
  const auto& st = loaded.trainer_state;
  try {
    scaler->load_state_dict(st.at("scaler"));
    clipper->load_state_dict(st.at("clipper"));
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(from_hex(st.at("rng").get<std::string>(), dir));
    // Checkpoints written before the guard existed have none of these: start fresh.
    // The detector's windows describe the weights, so they go back with them on a
    // rollback too; budgets, snapshots and the data offset only come back on a resume.
    if (st.contains("guard")) detector->load_state_dict(st.at("guard").at("detector"));
    if (with_guard) {
      data_offset = st.value("data_offset", int64_t{0});
      last_scale_growth = st.value("last_scale_growth", int64_t{-1});
      if (st.contains("guard")) {
        const auto& g = st.at("guard");
        ladder->load_state_dict(g.at("recovery"));
        snapshots->load_state_dict(g.at("snapshots"));
        noise->load_state_dict(g.at("noise_scale"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad_input(dir + "/trainer_state.json", std::string("malformed: ") + e.what());
  }
  return loaded.step;
}

data::StepBatches Trainer::State::micro_batches(int64_t step, int64_t data_offset, bool inject_spike,
                                                int64_t rank) const {
  const auto& b = cfg.batch;
  const int64_t T = cfg.data.seq_len;
  const int64_t world = env.world_size;
  // Sample k = (((step + data_offset) * accum + m) * world + rank) * micro + row.
  auto out = data::step_batches(*train, {b.micro_batch, b.accum_steps, world}, step + data_offset, rank);
  if (!inject_spike) return out;
  const int64_t spike_rank = cfg.guard.inject.rank;
  // A corrupted batch: uniform random tokens, reproducible from (seed, step, rank); each
  // affected rank draws its micro-batches m = 0, 1, ... in order from its own generator.
  const int64_t ranks = rank >= 0 ? 1 : world;
  for (int64_t i = 0; i < ranks; ++i) {
    const int64_t r = rank >= 0 ? rank : i;
    if (spike_rank != -1 && spike_rank != r) continue;
    std::mt19937_64 rng(cfg.run.seed * 1000003ULL + static_cast<uint64_t>(step) +
                        static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ULL);
    std::uniform_int_distribution<int64_t> token(0, cfg.model.vocab_size - 1);
    for (int64_t m = 0; m < b.accum_steps; ++m) {
      auto& mb = out.micro[static_cast<size_t>(m * ranks + i)];
      auto window = torch::empty({b.micro_batch, T + 1}, torch::kLong);
      auto* w = window.data_ptr<int64_t>();
      for (int64_t j = 0; j < window.numel(); ++j) w[j] = token(rng);
      mb.inputs = window.narrow(1, 0, T).contiguous();
      mb.targets = window.narrow(1, 1, T).contiguous();
    }
  }
  return out;
}

at::Tensor Trainer::State::side_values(const Accumulation& partial) const {
  torch::NoGradGuard no_grad;
  const int64_t world = env.world_size, accum = cfg.batch.accum_steps;
  auto side = torch::zeros({side_slots()}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  side.narrow(0, 0, 1).copy_(partial.loss.reshape({1}));
  for (int64_t m = 0; m < static_cast<int64_t>(partial.micro_losses.size()); ++m)
    side.narrow(0, 1 + m * world + env.rank, 1).copy_(partial.micro_losses[m].reshape({1}));
  if (partial.first_sq_norm.defined())
    side.narrow(0, 1 + world * accum + env.rank, 1).copy_(partial.first_sq_norm.reshape({1}));
  return side;
}

Trainer::~Trainer() = default;
const config::Config& Trainer::config() const { return s_->cfg; }
const std::string& Trainer::run_dir() const { return s_->run_dir; }

}  // namespace gradguard::train
