// Setting a run up: the device, threads and communicator; the model, data, optimizer,
// guard and step source from a validated Config (build); the fresh run directory; the
// ranks agreeing on each phase; and, once the replicas are equal, the data-parallel mode.
// Choosing and restoring a checkpoint is in trainer_checkpoints.cpp, the loop in trainer.cpp.
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
#include "gradguard/config/components.h"
#include "gradguard/checkpoint/optimizer_shards.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/data/tokenizer/tokenizer.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/device.h"
#include "gradguard/core/error.h"
#include "gradguard/dist/grad_sync.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/optim/adamw.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/optim/sharded_optimizer.h"
#include "gradguard/train/memory_estimate.h"
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
  std::vector<std::string> candidates;  // checkpoints whose files verify, newest first (rank 0)
  std::exception_ptr failure;
  try {
    s_->build();
    if (!resume_run_dir.empty()) {
      s_->run = RunDir(resume_run_dir);
      // Nothing of the run is read, let alone changed, before the lock is ours.
      if (s_->main_rank()) s_->lock = RunLock(resume_run_dir);
      candidates = s_->resume_candidates();
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

  if (!resume_run_dir.empty()) s_->resume(resume_run_dir, candidates);
  if (s_->comm) {
    // Replicas start equal: from rank 0's initialisation, or (resumed) from the same
    // checkpoint, which is verified rather than trusted.
    if (resume_run_dir.empty())
      dist::broadcast_parameters(*s_->comm, s_->params);
    else
      dist::verify_parameters(*s_->comm, s_->params, s_->names, s_->start_step);
  }
  // The data-parallel mode (ZeRO-2 wires the optimizer and the guard to its shard).
  s_->reduction = make_grad_reduction(c, s_->params, s_->comm.get(), s_->sharded, *s_->guarded);
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
  if (device.is_cpu()) {
    // Nothing of the model's size is allocated before it is known to fit this machine
    // (the ranks of a node share its memory).
    auto in = PlanInputs::from_config(c, env.world_size);
    in.for_this_cpu();
    check_fits_this_machine(in, env.local_world_size,
                            c.model.init_from.empty() ? std::string("model") : c.model.init_from + "/config.json");
  }
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
  const auto layout = c.memory.resolve(env.world_size, env.rank);
  if (layout.sharded_optimizer) {
    optim::ShardingOptions sh;  // shard_world 1: every rank keeps the whole state (masters, offload)
    sh.rank = layout.shard_rank;
    sh.world_size = layout.shard_world;
    sh.master_weights = layout.masters;
    sh.offload = layout.offload;
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
  const auto g = config::guarded_step_options(c, c.schedule.warmup_steps, peak_lr);
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
  source = std::make_unique<StepSource>(cfg, train, env.rank, env.world_size, device);
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

Trainer::~Trainer() = default;
const config::Config& Trainer::config() const { return s_->cfg; }
const std::string& Trainer::run_dir() const { return s_->run.root(); }
int64_t Trainer::rank() const { return s_->env.rank; }

}  // namespace gradguard::train
