// `gradguard train [--config FILE] [--set key=value ...] [--name NAME]`: trains on the
// built-in default when no file is given, then prints a summary.
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "gradguard/config/config.h"
#include "gradguard/train/progress.h"
#include "gradguard/train/trainer.h"

namespace gradguard::cli {

void add_train_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("train", "Train a model (the built-in default: a tiny Llama on the Brown corpus)");
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto name = std::make_shared<std::string>();
  cmd->add_option("-c,--config", *path, "YAML configuration file (default: built-in)");
  cmd->add_option("-s,--set", *sets, "Override: key.path=value (value read as YAML); repeatable");
  cmd->add_option("-n,--name", *name, "Run name (same as --set run.name=NAME)");
  cmd->callback([&action, path, sets, name] {
    action = [path, sets, name] {
      auto overrides = *sets;
      if (!name->empty()) overrides.push_back("run.name=" + *name);
      train::Trainer trainer(config::load_config(*path, overrides));
      auto r = trainer.run();
      std::printf("\nsummary: %lld steps in %s (%.0f tokens/s), %lld skipped\n", (long long)r.steps,
                  train::format_duration(r.elapsed_s).c_str(), r.tokens_per_s, (long long)r.skipped_steps);
      std::printf("  train loss  %.4f -> %.4f\n", r.first_loss, r.final_loss);
      if (std::isfinite(r.final_val_loss))
        std::printf("  val loss    %.4f -> %.4f nats/token\n", r.initial_val_loss, r.final_val_loss);
      std::printf("  run dir     %s\n  checkpoint  %s\n", r.run_dir.c_str(), r.checkpoint_dir.c_str());
      return 0;
    };
  });
}

}  // namespace gradguard::cli
