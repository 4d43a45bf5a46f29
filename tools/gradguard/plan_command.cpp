// `gradguard plan [--config FILE] [--set k=v ...] [--model DIR] --gpus N --device NAME`:
// memory per GPU of the configured run, whether it fits, and the micro-batch x
// accumulation that reaches the global batch for each memory layout (apps/plan.h).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "gradguard/apps/plan.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"

namespace gradguard::cli {

void add_plan_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("plan", "Memory per GPU of a run and the layouts and micro-batches that fit");
  struct Args {
    std::string config, model, device;
    std::vector<std::string> sets;
    int64_t gpus = 1, global_batch = -1, seq = -1, micro = -1;
    double memory_gb = 0;
    bool cpu = false, json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("-c,--config", a->config, "YAML configuration file (default: built-in)");
  cmd->add_option("-s,--set", a->sets, "Override: key.path=value (value read as YAML); repeatable");
  cmd->add_option("--model", a->model, "Hugging Face model directory whose config.json gives the shapes");
  cmd->add_option("--gpus", a->gpus, "Data-parallel ranks (GPUs)")->capture_default_str();
  cmd->add_option("--device", a->device, "mi210 (the default) | mi250x | mi300x | a100-40 | a100 | h100 | h200, in any case");
  cmd->add_option("--memory", a->memory_gb, "Memory per device in GB (overrides the device's own)");
  cmd->add_option("--global-batch", a->global_batch, "Sequences per optimizer step to reach (default: the config's)");
  cmd->add_option("--seq", a->seq, "Sequence length (default: data.seq_len)");
  cmd->add_option("--micro", a->micro, "Micro-batch of 'this run' (default: batch.micro_batch)");
  cmd->add_flag("--cpu", a->cpu, "Plan for CPU processes: no GPU runtime or allocator buffers");
  cmd->add_flag("--json", a->json, "Print the plan as JSON");
  cmd->callback([&action, a, cmd] {
    // Which of the optional sizes were given: a given one is checked, never replaced by
    // the configuration's (-1 is not "unset" when the user typed it).
    const bool has_global = cmd->count("--global-batch") > 0, has_seq = cmd->count("--seq") > 0,
               has_micro = cmd->count("--micro") > 0;
    action = [a, has_global, has_seq, has_micro] {
      if (a->gpus < 1 || a->gpus > (int64_t{1} << 20))
        throw bad_input("--gpus", "must be in [1, 1048576], got " + std::to_string(a->gpus));
      if (a->memory_gb < 0 || !(a->memory_gb < 1e6))
        throw bad_input("--memory", "must be a size in GB > 0, got " + std::to_string(a->memory_gb));
      // Ranges that keep every product (tokens per step, bytes) far inside int64 and double.
      struct Size {
        const char* key;
        bool given;
        int64_t value, lo, hi;
      };
      for (const auto& z : {Size{"--global-batch", has_global, a->global_batch, 0, int64_t{1} << 30},
                            Size{"--seq", has_seq, a->seq, 1, int64_t{1} << 24},
                            Size{"--micro", has_micro, a->micro, 1, int64_t{1} << 20}})
        if (z.given && (z.value < z.lo || z.value > z.hi))
          throw bad_input(z.key, "must be in [" + std::to_string(z.lo) + ", " + std::to_string(z.hi) + "], got " +
                                     std::to_string(z.value));
      // --model is model.init_from: its config.json is read before the configuration is
      // validated, so its positions allow the sequence length asked for.
      auto sets = a->sets;
      if (!a->model.empty()) sets.insert(sets.begin(), "model.init_from=" + a->model);
      const auto cfg = config::load_config(a->config, sets);
      auto in = plan::PlanInputs::from_config(cfg, a->gpus);
      if (has_global) in.global_batch = a->global_batch;
      if (has_seq) in.seq_len = a->seq;
      if (has_micro) in.micro_batch = a->micro;
      if (in.global_batch > 0 && in.global_batch % a->gpus != 0)
        throw bad_input("--global-batch", std::to_string(in.global_batch) + " sequences do not divide over " +
                                              std::to_string(a->gpus) + " GPUs");
      if (a->cpu) in.for_this_cpu();
      const plan::Device device = plan::device_for(a->device, a->memory_gb);
      const std::string text = a->json ? plan::to_json(in, device).dump(2) + "\n" : plan::render(in, device);
      std::fputs(text.c_str(), stdout);
      return 0;
    };
  });
}

}  // namespace gradguard::cli
