// Side-by-side cost of the guard, printed as ratios measured in one run.
//
// Part 1, gradient statistics + clip on a model with >= 100 parameter tensors
// (12 layers: 111 tensors): gradguard's fused pass (one foreach norm, one host copy)
// + global clip, versus LibTorch's torch::nn::utils::clip_grad_norm_, versus a plain
// per-parameter loop that reads each norm with .item().
// Part 2, the whole guard on a training step of the default model (4 x 128, two
// micro-batches of 16 x 64 tokens): a bare step (forward/backward, AdamW, the loss read
// for logging) versus the guarded step of the trainer (fused statistics with per-layer
// norms and per-micro-batch losses, clip, loss scaler, anomaly detector, the noise-scale
// norm every 10th step, the telemetry sampler running at its default period and drained
// into the metrics, metrics line). The variants alternate (A, B, A, B, ...) after a warm-up
// and the medians are compared, so machine noise hits both alike.
//
// Run: build/bench/guard_cost [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradguard/core/allocator.h"
#include "gradguard/core/stats.h"
#include "gradguard/core/threads.h"
#include "gradguard/grad/clip.h"
#include "gradguard/grad/grad_stats.h"
#include "gradguard/guard/guarded_step.h"
#include "gradguard/model/llama.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/telemetry/telemetry.h"
#include "gradguard/train/metrics.h"
#include "gradguard/train/step.h"

using namespace gradguard;
using Clock = std::chrono::steady_clock;

namespace {

// Runs the variants interleaved `repeats` times after one warm-up round; returns the
// median seconds of each.
std::vector<double> interleaved(const std::vector<std::function<void()>>& variants, int repeats) {
  for (const auto& f : variants) f();
  std::vector<std::vector<double>> times(variants.size());
  for (int r = 0; r < repeats; ++r)
    for (size_t i = 0; i < variants.size(); ++i) {
      auto t0 = Clock::now();
      variants[i]();
      times[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  std::vector<double> out;
  for (auto& t : times) out.push_back(median(t));
  return out;
}

struct Model {
  explicit Model(model::LlamaOptions o) : net(o) {
    for (const auto& item : net->named_parameters()) {
      params.push_back(item.value());
      names.push_back(item.key());
    }
  }
  model::LlamaForCausalLM net;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
};

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 30;
  const bool allocator = configure_allocator();
  auto threads = configure_threads(0);
  std::printf("guard_cost: threads %lld ATen, %lld %s, LibTorch %s, allocator tuned: %s, %d interleaved repeats (medians)\n\n",
              (long long)threads.intra_op, (long long)threads.blas_threads, threads.blas.c_str(), TORCH_VERSION,
              allocator ? "yes" : "no", repeats);

  // ---- Part 1: statistics + clip -------------------------------------------------------
  {
    torch::manual_seed(0);
    model::LlamaOptions o;
    o.num_layers = 12;
    Model m(o);
    auto ids = torch::randint(0, 256, {8, 64}, torch::kLong);
    m.net->forward(ids).logsumexp(-1).mean().backward();
    std::vector<torch::Tensor> saved;
    for (const auto& p : m.params) saved.push_back(p.grad().clone());
    auto restore = [&] {
      for (size_t i = 0; i < saved.size(); ++i) m.params[i].grad().copy_(saved[i]);
    };
    grad::ClipOptions clip;
    clip.max_norm = 0.01;  // always clips, so every variant does the full work
    grad::GradStatsComputer stats(m.params, m.names);
    grad::Clipper clipper(clip, m.params, m.names);
    auto t = interleaved(
        {[&] {
           restore();
           clipper.apply(stats.compute(1.0));
         },
         [&] {
           restore();
           torch::nn::utils::clip_grad_norm_(m.params, 0.01);
         },
         [&] {
           restore();
           double sq = 0;
           for (const auto& p : m.params) {
             const double n = p.grad().norm().item<double>();  // one host read per tensor
             sq += n * n;
           }
           const double coef = std::min(1.0, 0.01 / (std::sqrt(sq) + 1e-6));
           for (const auto& p : m.params) p.grad().mul_(coef);
         },
         [&] { restore(); }},
        repeats * 10);
    const double base = t[3];  // the gradient restore every variant pays
    std::printf("statistics + clip, %zu parameter tensors (%lld parameters):\n", m.params.size(),
                (long long)model::count_parameters(*m.net));
    std::printf("  gradguard fused stats + clip   %8.1f us   (per-tensor + per-layer norms, 1 host copy)\n",
                (t[0] - base) * 1e6);
    std::printf("  torch clip_grad_norm_          %8.1f us   ratio gradguard/torch = %.2f\n", (t[1] - base) * 1e6,
                (t[0] - base) / (t[1] - base));
    std::printf("  per-parameter .item() loop     %8.1f us   ratio gradguard/loop  = %.2f\n\n", (t[2] - base) * 1e6,
                (t[0] - base) / (t[2] - base));
  }

  // ---- Part 2: whole guard on a training step -----------------------------------------
  {
    torch::manual_seed(0);
    Model m(model::LlamaOptions{});
    optim::NamedParameters named;
    for (size_t i = 0; i < m.params.size(); ++i) named.emplace_back(m.names[i], m.params[i]);
    optim::OptimOptions oo;
    oo.lr = 1e-4;
    auto opt = optim::make_optimizer(named, oo);
    auto tokens = torch::randint(0, 256, {32, 65}, torch::kLong);
    std::vector<data::Batch> micro;
    for (int64_t h = 0; h < 2; ++h) {
      auto t = tokens.narrow(0, 16 * h, 16);
      micro.push_back({t.narrow(1, 0, 64).contiguous(), t.narrow(1, 1, 64).contiguous()});
    }
    const int64_t step_tokens = 32 * 64;
    // Scaler off, as the trainer resolves it for fp32: a loss scale changes the backward's
    // arithmetic itself (it keeps small gradients out of the slow denormal range), which
    // would hide the guard's own cost.
    guard::GuardedStepOptions go;
    go.guard.warmup = 0;
    guard::GuardedStep guard_step(go, m.params, m.names, guard::optimizer_hooks(*opt, m.params));
    train::MetricsWriter metrics("/dev/null", 50);
    telemetry::Sampler sampler(telemetry::TelemetryOptions{});
    sampler.start();
    double sink = 0;
    auto zero = [&] {
      for (auto& p : m.params) p.mutable_grad() = torch::Tensor();
    };
    auto bare = [&] {
      zero();
      auto loss = train::accumulate_gradients(*m.net, micro, step_tokens, amp::AmpOptions{}, torch::kCPU);
      opt->step();
      sink += loss.item<double>();
    };
    int64_t step = 0;
    // The trainer's step: accumulate, the GuardedStep (which also steps the optimizer),
    // the metrics line and telemetry.
    auto guarded = [&] {
      zero();
      const bool measure = step % 10 == 0;
      auto acc = train::accumulate(*m.net, micro, step_tokens, amp::AmpOptions{}, torch::kCPU, guard_step.loss_scale(),
                                   measure);
      guard::StepInputs in;
      in.loss = acc.loss;
      in.micro_losses = torch::stack(acc.micro_losses);
      if (measure) in.noise_sq_norm = acc.first_sq_norm;
      in.noise_share = 0.5;
      in.noise_micro_batch = 16;
      in.noise_global_batch = 32;
      const auto out = guard_step.step(step, in);
      for (const auto& sample : sampler.drain()) metrics.write_telemetry(step, sample);
      metrics.write_events(out, 32);
      metrics.write_step(train::step_metrics(out, guard_step.groups().names));
      ++step;
    };
    auto t2 = interleaved({guarded, bare}, repeats);
    std::vector<double> t = {t2[1], t2[0]};
    std::printf("training step, default model (%lld parameters, %lld tokens/step):\n",
                (long long)model::count_parameters(*m.net), (long long)step_tokens);
    std::printf("  bare step      %8.2f ms\n", t[0] * 1e3);
    std::printf("  guarded step   %8.2f ms   guarded/bare = %.4f (overhead %+.2f%%)\n", t[1] * 1e3, t[1] / t[0],
                (t[1] / t[0] - 1) * 100);
    std::printf("  telemetry sampler: %.1f us per sample (every %lld ms), %lld samples\n",
                sampler.mean_sample_cost_us(), (long long)sampler.options().period_ms,
                (long long)sampler.samples_taken());
    if (sink == 42.0) std::printf("\n");
  }
  return 0;
}
