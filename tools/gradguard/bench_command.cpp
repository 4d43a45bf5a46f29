// `gradguard bench seed`: the side-by-side comparison of stabilisation setups
// (bench/seed.h); prints the table and writes it as seed.md / seed.json.
#include <cstdio>

#include "commands.h"
#include "gradguard/apps/seed.h"

namespace gradguard::cli {

void add_bench_command(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "Built-in benchmarks");
  bench->require_subcommand(1);
  auto* seed = bench->add_subcommand("seed", "Compare large-batch stabilisation setups on one model, data and seed");
  auto o = std::make_shared<seed::SeedOptions>();
  seed->add_option("--mode", o->mode, "full | tiny (seconds-long, for tests)")->capture_default_str();
  seed->add_option("--presets", o->presets_dir, "Folder with base.yaml and one YAML per setup")->capture_default_str();
  seed->add_option("-o,--out", o->out_dir, "Output folder (run directories, logs, seed.md, seed.json)")
      ->capture_default_str();
  seed->add_option("--set", o->overrides, "key=value applied to every setup (e.g. data.train_path=...)");
  seed->add_flag("--force", o->overwrite, "Overwrite results in the output folder");
  seed->callback([&action, o] {
    action = [o] {
      auto report = seed::run_seed_bench(*o, stdout);
      std::printf("\n%s\nwritten to %s/seed.md and %s/seed.json\n", report.markdown().c_str(), o->out_dir.c_str(),
                  o->out_dir.c_str());
      return 0;
    };
  });
}

}  // namespace gradguard::cli
