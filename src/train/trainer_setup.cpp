// Setting a run up: the model, data, optimizer and guard from a validated Config, the
// run directory (fresh, or an existing one to resume), the pieces of trainer state that
// checkpoints carry (trainer_state.json) and restore, rollback, and the result a resumed
// run starts from. The step loop is in trainer.cpp.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <limits>
#include <sstream>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/optimizer_shards.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/data/tokenizer.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/device.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/optim/adamw.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/optim/sharded_optimizer.h"
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
  std::vector<std::string> candidates;  // checkpoints whose files verify, newest first (rank 0)
  std::exception_ptr failure;
  try {
    s_->build();
    if (!resume_run_dir.empty()) {
      s_->run = RunDir(resume_run_dir);
      if (s_->main_rank()) {
        // Nothing of the run is read, let alone changed, before the lock is ours.
        s_->lock = RunLock(resume_run_dir);
        std::vector<std::string> rejected;
        candidates = checkpoint::resumable_checkpoints(resume_run_dir, &rejected);
        for (const auto& r : rejected) s_->resume_notes.push_back("skipped checkpoint: " + r);
      }
    } else if (s_->main_rank()) {
      s_->create_run_dir();
    }
  } catch (...) {
    failure = std::current_exception();
  }
  s_->agree("setup", failure);
  if (s_->comm) s_->run = RunDir(s_->comm->broadcast_string(s_->run.root(), "run directory broadcast"));
  if (s_->main_rank()) {
    State* st = s_.get();
    s_->snapshots = std::make_unique<forensics::SnapshotWriter>(
        s_->run.root(), c.guard.snapshot,
        [st](const guard::StepOutcome& out) { return st->snapshot_evidence(out); },
        [st](const std::string& dir) { checkpoint::save_hf_model(dir, *st->model); },
        [st](int64_t) {
          // Where a replay of this step starts: the newest checkpoint (the step's state
          // follows from it deterministically), or the run's own start.
          const auto& [from, dir] = st->last_checkpoint;
          return nlohmann::json{{"checkpoint", from < 0 ? std::string() : "checkpoints/" + stdfs::path(dir).filename().string()},
                                {"from_step", std::max<int64_t>(from, 0)},
                                {"world_size", st->env.world_size}};
        });
  }

  if (!resume_run_dir.empty()) {
    // Rank 0 takes the newest checkpoint whose state checks out too: one that fails is
    // passed over and reported like a corrupt one. Nothing is truncated before one has
    // loaded.
    try {
      if (s_->main_rank()) {
        std::string last_reason;
        for (const auto& dir : candidates) {
          try {
            // A model configured differently is the configuration's fault, not the
            // checkpoint's: every older one would fail the same way.
            const std::string difference = checkpoint::architecture_difference(dir, c.model, c.lora);
            if (!difference.empty())
              throw ConfigChanged{bad_input(dir + "/config.json", "the checkpoint has " + difference +
                                                                      ": the model changed between save and resume")};
            s_->start_step = s_->restore(dir, guard::RestoreScope::kResume);
            resume_dir = dir;
            break;
          } catch (const ConfigChanged& changed) {
            throw changed.error;
          } catch (const Error& e) {
            if (e.kind() != ErrorKind::kBadInput) throw;
            last_reason = e.what();
            s_->resume_notes.push_back("skipped checkpoint: " + last_reason);
          }
        }
        if (resume_dir.empty())
          throw bad_input(resume_run_dir, "no checkpoint can be resumed: every one was rejected (the newest: " +
                                              last_reason + ")");
      }
    } catch (...) {
      failure = std::current_exception();
    }
    s_->agree("checkpoint choice", failure);
    if (s_->comm) resume_dir = s_->comm->broadcast_string(resume_dir, "checkpoint choice broadcast");
    try {
      if (!s_->main_rank()) s_->start_step = s_->restore(resume_dir, guard::RestoreScope::kResume);
      if (s_->start_step > c.schedule.total_steps)
        throw bad_input("schedule.total_steps", "the checkpoint is at step " + std::to_string(s_->start_step) +
                                                    ", past schedule.total_steps = " +
                                                    std::to_string(c.schedule.total_steps));
      s_->complete = s_->start_step == c.schedule.total_steps;
      s_->resume_notes.push_back("resumed from " + resume_dir + " (step " + std::to_string(s_->start_step) + ")");
      s_->last_checkpoint = {s_->start_step, resume_dir};
      // A complete run is left exactly as it is.
      if (s_->main_rank() && !s_->complete) {
        truncate_metrics(s_->run.metrics(), s_->start_step);
        fs::write_file_atomic(s_->run.config(), config::to_yaml(c));
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
    if (c.memory.zero_stage == 2) {
      // ZeRO-2: each rank ends the step with its shard of the gradient only; the optimizer
      // steps it and the guard measures it, the shards' statistics summed in one collective.
      auto* comm = s_->comm.get();
      s_->shard_sync = std::make_unique<dist::GradShardSync>(
          s_->params, *comm, s_->sharded->layout(), static_cast<int64_t>(c.dist.bucket_mb * 1024 * 1024));
      s_->sharded->use_gradient_shard(s_->shard_sync->shard());
      s_->guarded->use_sharded_gradients(
          {s_->shard_sync->tensor_views(), s_->shard_sync->tensor_offsets(), s_->shard_sync->cuts(),
           [comm](at::Tensor& v) { comm->allreduce_sum(v, "the guard's statistics all-reduce"); }});
      s_->resume_notes.push_back("data parallel: " + s_->env.describe() + ", backend " +
                                 name_of(s_->comm->backend()) + ", " +
                                 std::to_string(s_->shard_sync->num_buckets()) +
                                 " gradient buckets reduced to their shard owners (ZeRO-2)");
    } else {
      s_->sync = std::make_unique<dist::GradSync>(s_->params, *s_->comm, c.dist, s_->side_slots());
      s_->resume_notes.push_back("data parallel: " + s_->env.describe() + ", backend " +
                                 name_of(s_->comm->backend()) + ", " + std::to_string(s_->sync->num_buckets()) +
                                 " gradient buckets, hook " + name_of(c.dist.hook));
    }
  }
}

namespace {
// A model fine-tuned from a directory with a tokenizer.json must read ids made by that
// tokenizer: ids from another one (or bytes) are in range and would train silently on
// garbage. Version-2 token files record their tokenizer's hash (data/token_file.h).
void check_tokenizer(const data::TokenFile& file, const std::string& init_from) {
  if (init_from.empty()) return;
  const uint64_t model_hash = data::tokenizer_file_hash(init_from);
  if (model_hash == 0 || file.tokenizer_hash() == model_hash) return;
  char hashes[80];
  std::snprintf(hashes, sizeof hashes, "%016llx, the model's is %016llx", (unsigned long long)file.tokenizer_hash(),
                (unsigned long long)model_hash);
  throw bad_input(file.path(), std::string("was not made with the model's tokenizer (") +
                                   (file.tokenizer_hash() == 0 ? "it has no tokenizer recorded: byte-level or llm.c ids"
                                                               : std::string("its tokenizer hash is ") + hashes) +
                                   "; model.init_from " + init_from + " has a tokenizer.json): prepare the data again "
                                   "with `gradguard prepare --tokenizer " + init_from + "`");
}
}  // namespace

void Trainer::State::build() {
  auto& c = cfg;  // finalize() has read model.init_from's config.json into c.model
  auto train_file = std::make_shared<data::TokenFile>(c.data.train_path, c.model.vocab_size);
  check_tokenizer(*train_file, c.model.init_from);
  const bool drop_overlong = c.data.overlong == "drop";
  train = std::make_shared<data::TokenDataset>(train_file, c.data.seq_len, c.data.shuffle, c.run.seed, c.data.packing,
                                               drop_overlong);
  if (c.schedule.epochs > 0) {
    // The run's length in passes over the data (HF's num_train_epochs): known only now.
    const int64_t rows = train->num_samples();
    c.schedule.total_steps = optim::ScheduleOptions::steps_for_epochs(c.schedule.epochs, rows, c.batch.global_batch);
    c.length_from_data = true;
    c.finalize(env.world_size);  // warmup_ratio, the checks and the warnings again, with the length known
    if (c.schedule.warmup_steps > c.schedule.total_steps)
      throw bad_input("schedule.warmup_steps", std::to_string(c.schedule.warmup_steps) + " is longer than the run: " +
                                                   "schedule.epochs " + format_number(c.schedule.epochs) + " of " +
                                                   c.data.train_path + " make " +
                                                   std::to_string(c.schedule.total_steps) + " steps");
    length_note = "schedule.epochs " + format_number(c.schedule.epochs) + ": " + std::to_string(rows) + " rows of " +
                  c.data.train_path + " at " + std::to_string(c.batch.global_batch) + " per step = " +
                  std::to_string(c.schedule.total_steps) + " steps (warmup " +
                  std::to_string(c.schedule.warmup_steps) + ")";
  }
  if (!c.data.val_path.empty()) {
    auto val_file = std::make_shared<data::TokenFile>(c.data.val_path, c.model.vocab_size);
    data::check_same_dataset(*train_file, *val_file);
    if (val_file->has_flags() != train_file->has_flags()) {
      throw bad_input(c.data.val_path, std::string(val_file->has_flags() ? "has" : "has no") +
                                           " token flags (chat/SFT samples) and " + c.data.train_path + " " +
                                           (train_file->has_flags() ? "has" : "has none") +
                                           ": prepare both from the same data");
    }
    val = std::make_shared<data::TokenDataset>(val_file, c.data.seq_len, false, c.run.seed, c.data.packing,
                                               drop_overlong);
  }

  if (!c.model.init_from.empty()) checkpoint::check_weights_fit_config(c.model.init_from, c.model);
  model = model::LlamaForCausalLM(c.model);
  if (!c.model.init_from.empty()) checkpoint::load_hf_weights(c.model.init_from, *model);
  // LoRA freezes what was loaded and adds the adapters (model/lora.h); only parameters
  // that train reach the optimizer, the guard and the gradient synchronisation.
  if (c.lora.enabled()) model::add_lora(*model, c.lora);
  // Low-precision working weights (memory.weights_dtype): the whole model, frozen base
  // included, in that dtype; the optimizer keeps float32 masters of what trains.
  if (c.memory.weights_dtype == amp::AmpDtype::kFp32)
    model->to(device);
  else
    model->to(device, c.memory.weights_dtype == amp::AmpDtype::kBf16 ? torch::kBFloat16 : torch::kHalf);
  optim::NamedParameters named;
  for (const auto& item : model->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    named.emplace_back(item.key(), item.value());
    params.push_back(item.value());
    names.push_back(item.key());
  }
  peak_lr = optim::scaled_lr(c.optim.lr, c.optim.lr_scaling, c.optim.base_batch, c.batch.global_batch);
  optim::OptimOptions optim_options = c.optim;
  optim_options.lr = peak_lr;
  if (c.memory.sharded_optimizer()) {
    optim::ShardingOptions sh;  // zero_stage 0: every rank keeps the whole state (masters, offload)
    sh.rank = c.memory.zero_stage > 0 ? env.rank : 0;
    sh.world_size = c.memory.zero_stage > 0 ? env.world_size : 1;
    sh.master_weights = c.memory.weights_dtype != amp::AmpDtype::kFp32 && c.memory.master_weights;
    sh.offload = c.memory.offload_optimizer;
    const bool variant = !optim::adamw_variant(c.optim).plain();
    sh.kernel = variant ? optim::AdamWKernel::foreach : optim::resolve_adamw_kernel(c.optim.implementation, device);
    optim::AllGather gather;
    if (comm && sh.world_size > 1) {
      // As bytes: the all-gather does no arithmetic, and Gloo has no bfloat16.
      gather = [this](const at::Tensor& mine, std::vector<at::Tensor>& all) {
        std::vector<at::Tensor> bytes;
        for (auto& t : all) bytes.push_back(t.view(torch::kByte));
        comm->allgather_async(mine.view(torch::kByte), bytes, "optimizer all-gather").wait();
      };
    }
    auto opt = std::make_unique<optim::ShardedOptimizer>(named, optim_options, sh, std::move(gather));
    sharded = opt.get();
    optimizer = std::move(opt);
  } else {
    optimizer = optim::make_optimizer(named, optim_options);
  }
  guard::GuardedStepOptions g;
  g.clip = c.clip;
  g.scaler = c.amp.scaler;
  g.amp_dtype = c.amp.dtype;
  g.guard = c.guard;
  g.warmup_steps = c.schedule.warmup_steps;
  g.peak_lr = peak_lr;
  g.adam_betas = c.optim.betas;
  g.adam_eps = c.optim.eps;
  auto hooks = guard::optimizer_hooks(*optimizer, params);
  if (sharded) {
    hooks.moments = [this](size_t i) { return sharded->moments(i); };
    hooks.reset_moments = [this](size_t i) { return sharded->reset_moments(i); };
  }
  // A rollback needs a checkpoint; rank 0 holds them, so its answer decides for all.
  hooks.rollback_available = [this] {
    bool has = main_rank() && fs::exists(run.latest_checkpoint_link());
    if (comm) has = comm->broadcast_string(has ? "1" : "0", "checkpoint check") == "1";
    return has;
  };
  if (main_rank()) {
    hooks.snapshot = [this](const guard::GuardedStep& step, const guard::StepOutcome& out, bool force) {
      return (*snapshots)(step, out, force);
    };
  } else {
    hooks.snapshot = [](const guard::GuardedStep&, const guard::StepOutcome&, bool) {
      return guard::SnapshotResult{"", "written by rank 0"};
    };
  }
  guarded = std::make_unique<guard::GuardedStep>(g, params, names, std::move(hooks));
  if (c.telemetry.enabled) sampler = std::make_unique<telemetry::Sampler>(c.telemetry);
  prefetcher = std::make_unique<data::BatchPrefetcher>(
      [this](const data::BatchPrefetcher::Key& k) { return micro_batches(k[0], k[1], k[2] != 0, env.rank); },
      device);
}

void Trainer::State::create_run_dir() {
  auto& c = cfg;
  if (c.run.name.empty()) c.run.name = default_run_name(c);
  run = RunDir((stdfs::path(c.run.dir) / c.run.name).string());
  // The lock first: of two runs started together with one name, one gets the directory
  // and the other is refused here, before it looks at (or clears) anything.
  lock = RunLock(run.root());
  const bool has_run = run.holds_run();
  if (has_run && !c.run.overwrite)
    throw bad_input("run.name", "run directory '" + run.root() +
                                    "' already holds a run; choose another run.name or set run.overwrite=true");
  if (has_run) run.clear_outputs();  // no output of the old run mixes with the new
  stdfs::create_directories(run.root());
  fs::write_file_atomic(run.config(), config::to_yaml(c));
}

optim::LrSchedule Trainer::State::schedule() const {
  // An absolute min_lr scales with lr so the floor keeps its ratio to the peak.
  return optim::LrSchedule(peak_lr, cfg.schedule, cfg.optim.lr);
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
  data_offset += step + 1 - to + cfg.guard.recovery.rollback_skip_steps;
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
  const auto g = guarded->state_dict();
  nlohmann::ordered_json guard_state = g.at("guard");
  guard_state["snapshots"] = snapshots ? snapshots->budget().state_dict() : nlohmann::json(nullptr);
  return {{"step", steps_done},
          {"scaler", g.at("scaler")},
          {"clipper", g.at("clipper")},
          {"rng", to_hex(at::detail::getDefaultCPUGenerator().get_state())},
          {"data_offset", data_offset},
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
    data_offset = offset;
    if (with_snapshots) snapshots->budget().load_state_dict(r.object("guard").raw("snapshots"), where);
  }
  return loaded.step;
}

Trainer::~Trainer() = default;
const config::Config& Trainer::config() const { return s_->cfg; }
const std::string& Trainer::run_dir() const { return s_->run.root(); }
int64_t Trainer::rank() const { return s_->env.rank; }

}  // namespace gradguard::train
