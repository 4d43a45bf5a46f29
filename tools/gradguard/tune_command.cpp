// `gradguard tune`: short probe runs that pick clip threshold, warmup and LR at a small
// batch, then grow the batch while its gradients behave (tune/tune.h); writes the
// recommended config as YAML with the evidence beside it.
#include <cstdio>

#include "commands.h"
#include "gradguard/apps/tune.h"

namespace gradguard::cli {

void add_tune_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("tune", "Probe clip threshold, warmup, LR and batch size; recommend a config (YAML)");
  auto o = std::make_shared<tune::TuneOptions>();
  cmd->add_option("-c,--config", o->config_path, "Base YAML configuration (default: built-in)");
  cmd->add_option("-s,--set", o->overrides, "Override of the base config: key.path=value; repeatable");
  cmd->add_option("-o,--out", o->out_dir, "Output folder (probes/, tune.md, tune.json, tune.yaml)")->capture_default_str();
  cmd->add_option("--steps", o->probe_steps, "Optimizer steps per probe")->capture_default_str();
  cmd->add_option("--start-batch", o->start_batch, "Batch of the sweeps (0: global_batch / 4)")->capture_default_str();
  cmd->add_option("--max-batch", o->max_batch, "Largest batch tried when growing (0: 2 x global_batch)")
      ->capture_default_str();
  cmd->add_option("--growth", o->growth, "Batch factor per growth round")->capture_default_str();
  cmd->add_option("--clip", o->clip_values, "clip.max_norm candidates, ascending")->delimiter(',')->capture_default_str();
  cmd->add_option("--warmup", o->warmup_fractions, "Warmup fractions, descending")->delimiter(',')->capture_default_str();
  cmd->add_option("--lr-scale", o->lr_scales, "Multiples of optim.lr, ascending")->delimiter(',')->capture_default_str();
  cmd->add_option("--tolerance", o->tolerance, "Relative loss a safer choice may cost")->capture_default_str();
  cmd->add_option("--noise-ratio", o->noise_ratio, "Stop growing past this x the gradient noise scale (0: off)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "Fit the recommendation's micro-batch to this GPU (as gradguard plan)");
  cmd->add_option("--memory", o->memory_gb, "... or to this much memory per GPU, GB");
  cmd->add_option("--gpus", o->gpus, "How many of them the run uses")->capture_default_str();
  cmd->add_flag("--force", o->overwrite, "Overwrite results in the output folder");
  cmd->callback([&action, o] {
    action = [o] {
      const auto r = tune::run_tune(*o, stdout);
      std::printf("\n%s\nwritten to %s/tune.yaml (recommended config), tune.md and tune.json\n", r.markdown().c_str(),
                  o->out_dir.c_str());
      return 0;
    };
  });
}

}  // namespace gradguard::cli
