// Micro-benchmarks of the pieces of one optimizer step on the default model (4 layers,
// 128 wide, micro-batch 32 x 64 tokens): forward+backward, gradient clipping (gradguard's
// foreach norm with one host copy vs LibTorch's torch::nn::utils::clip_grad_norm_), and
// the AdamW update. Run: build/bench/step_bench  (Google Benchmark flags apply).
#include <benchmark/benchmark.h>

#include <torch/torch.h>

#include "gradguard/core/allocator.h"
#include "gradguard/core/threads.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/model/llama.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/train/step.h"

namespace {
using namespace gradguard;

struct Fixture {
  Fixture() {
    configure_allocator();
  configure_threads(0);
    torch::manual_seed(0);
    model = model::LlamaForCausalLM(model::LlamaOptions{});
    auto tokens = torch::randint(0, 256, {32, 65}, torch::kLong);
    batch = {tokens.narrow(1, 0, 64).contiguous(), tokens.narrow(1, 1, 64).contiguous()};
    for (const auto& p : model->parameters()) params.push_back(p);
    train::accumulate_gradients(*model, {batch}, 32 * 64, amp::AmpOptions{}, torch::kCPU);
  }
  model::LlamaForCausalLM model{nullptr};
  data::Batch batch;
  std::vector<torch::Tensor> params;
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_ForwardBackward(benchmark::State& state) {
  auto& f = fixture();
  amp::AmpOptions amp;
  if (state.range(0) == 1) amp.dtype = amp::AmpDtype::kBf16;
  for (auto _ : state) {
    for (auto& p : f.params) p.mutable_grad() = torch::Tensor();
    auto loss = train::accumulate_gradients(*f.model, {f.batch}, 32 * 64, amp, torch::kCPU);
    benchmark::DoNotOptimize(loss.item<float>());
  }
  state.SetItemsProcessed(state.iterations() * 32 * 64);
  state.SetLabel(state.range(0) == 1 ? "bf16 autocast" : "fp32");
}
BENCHMARK(BM_ForwardBackward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ClipGradguard(benchmark::State& state) {
  auto& f = fixture();
  grad::ClipOptions o;
  o.max_norm = 1e9;  // measure without modifying the gradients
  std::vector<std::string> names;
  for (const auto& item : f.model->named_parameters()) names.push_back(item.key());
  grad::GradStatsComputer stats(f.params, names);
  grad::Clipper clipper(o, f.params, names);
  for (auto _ : state) benchmark::DoNotOptimize(clipper.apply(stats.compute(1.0)).grad_norm);
}
BENCHMARK(BM_ClipGradguard)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_ClipLibTorch(benchmark::State& state) {
  auto& f = fixture();
  for (auto _ : state) benchmark::DoNotOptimize(torch::nn::utils::clip_grad_norm_(f.params, 1e9));
}
BENCHMARK(BM_ClipLibTorch)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_AdamWStep(benchmark::State& state) {
  auto& f = fixture();
  optim::NamedParameters named;
  for (const auto& item : f.model->named_parameters()) named.emplace_back(item.key(), item.value());
  optim::OptimOptions o;
  o.lr = 1e-12;  // keep the weights essentially unchanged across iterations
  auto opt = optim::make_optimizer(named, o);
  for (auto _ : state) opt->step();
}
BENCHMARK(BM_AdamWStep)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
