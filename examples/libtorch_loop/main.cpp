// A plain LibTorch training loop -- a small MLP learning which of 4 directions a random
// 16-d point leans to, trained with torch::optim::AdamW -- guarded by gradguard. The
// blocks marked `gradguard` are all the guard adds: one GuardedStep that measures the
// gradients after backward (one device->host read), clips them, judges the step and
// steps the optimizer only when the update is sound; a SnapshotWriter that keeps the
// evidence of a bad step with its diagnosis; metrics.jsonl for `gradguard report`.
//
// Faults can be injected to watch the guard work: --inject-inf S puts an inf into a
// gradient after backward at step S (the step must be skipped); --inject-spike S gives
// step S random labels, a loss spike (the step must be skipped and a snapshot written).
// The program checks exactly that and exits 1 when anything else happens.
//
//   libtorch_loop [--steps N] [--run-dir DIR] [--inject-inf S] [--inject-spike S]
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <gradguard/core/error.h>
#include <gradguard/core/run_dir.h>
#include <gradguard/forensics/snapshot.h>
#include <gradguard/guard/guarded_step.h>
#include <gradguard/optim/optimizer.h>
#include <gradguard/train/metrics.h>

namespace gg = gradguard;
using Clock = std::chrono::steady_clock;

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{16, 64}, fc2{64, 4};
  MlpImpl() { register_module("fc1", fc1), register_module("fc2", fc2); }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
};
TORCH_MODULE(Mlp);

int run(int argc, char** argv) {
  int64_t steps = 60, inject_inf = -1, inject_spike = -1;
  std::string run_dir = "runs/libtorch_loop";
  if (argc % 2 == 0) throw gg::bad_input(argv[argc - 1], "a flag without a value");
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--steps") steps = std::stoll(value);
    else if (flag == "--run-dir") run_dir = value;
    else if (flag == "--inject-inf") inject_inf = std::stoll(value);
    else if (flag == "--inject-spike") inject_spike = std::stoll(value);
    else throw gg::bad_input(flag, "unknown flag; known: --steps, --run-dir, --inject-inf, --inject-spike");
  }

  torch::manual_seed(0);
  const int64_t batch = 64;
  const double base_lr = 3e-3;
  const auto teacher = torch::randn({16, 4});  // the rule the labels follow
  Mlp model;
  // betas {0.9, 0.95}: also GuardedStepOptions::adam_betas' default, which the diagnosis reads
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(base_lr).betas({0.9, 0.95}));
  torch::Tensor x, y;  // the current batch

  // ---- gradguard: the guard, its snapshots and metrics, set up once ----
  const gg::RunDir dir(run_dir);
  dir.clear_outputs();  // metrics.jsonl and snapshots/ of an earlier run
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;  // "fc1.weight", ...: per-layer norms of "fc1" and "fc2"
  for (const auto& p : model->named_parameters()) params.push_back(p.value()), names.push_back(p.key());
  gg::guard::GuardedStepOptions options;  // clip at global norm 1.0, the detector's defaults
  options.peak_lr = base_lr;
  options.guard.snapshot.min_interval = 0;  // a short run: keep every snapshot
  gg::train::MetricsWriter metrics(dir.metrics(), /*keep_recent=*/50);
  gg::forensics::SnapshotWriter snapshots(run_dir, options.guard.snapshot, [&](const gg::guard::StepOutcome&) {
    gg::forensics::SnapshotEvidence evidence;  // what only the loop knows: the batch, recent metrics
    evidence.inputs = x.unsqueeze(0), evidence.targets = y.unsqueeze(0);  // [micro-batches, batch, ...]
    evidence.metrics_lines = metrics.recent();
    return evidence;
  });
  gg::guard::StepHooks hooks = gg::guard::optimizer_hooks(optimizer, params);
  hooks.snapshot = std::ref(snapshots);
  gg::guard::GuardedStep guarded(options, params, names, hooks);
  // ---- end gradguard ----

  std::vector<std::string> unexpected;
  int64_t skipped = 0, snapshot_count = 0;
  const auto start = Clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    const auto step_start = Clock::now();
    const double lr = base_lr * guarded.lr_factor(step);  // gradguard: a cool-down lowers it
    gg::optim::set_learning_rate(optimizer, lr);
    x = torch::randn({batch, 16});
    y = step == inject_spike ? torch::randint(0, 4, {batch}) : x.matmul(teacher).argmax(1);
    optimizer.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    (loss * guarded.loss_scale()).backward();  // gradguard: the scale (1 in fp32)
    if (step == inject_inf) {
      torch::NoGradGuard no_grad;
      params[0].grad().view(-1)[0].fill_(std::numeric_limits<float>::infinity());
    }

    // ---- gradguard: instead of optimizer.step() ----
    gg::guard::StepInputs inputs;
    inputs.loss = loss.detach();
    inputs.lr = lr;
    inputs.injected = step == inject_inf ? "nonfinite_gradients" : step == inject_spike ? "spike_batch" : "";
    const gg::guard::StepOutcome out = guarded.step(step, inputs);  // steps the optimizer unless skipped
    metrics.write_events(out, batch);
    gg::train::StepMetrics m = gg::train::step_metrics(out, guarded.groups().names);
    m.tokens = batch;  // this model has no tokens: samples
    m.tokens_per_s = batch / std::chrono::duration<double>(Clock::now() - step_start).count();
    m.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    metrics.write_step(m);
    // A loop with checkpoints would also set hooks.rollback_available and restore one
    // when out.rollback(); this one has none, so the ladder passes over that rung.
    if (out.halt) throw gg::Error(gg::ErrorKind::kHalted, out.snapshot.dir, out.halt_message);
    // ---- end gradguard ----

    std::printf("step %3lld | loss %.4f | grad_norm %8.4f | %s\n", (long long)step, out.loss, out.clip.grad_norm,
                out.applied ? "applied" : "skipped");
    for (const auto& a : out.verdict.anomalies)
      std::printf("         | %s %s: %s\n", gg::name_of(a.severity), gg::name_of(a.kind), a.message.c_str());
    if (out.recovery) {
      const std::string where = out.snapshot.dir.empty() ? "none (" + out.snapshot.skipped + ")" : out.snapshot.dir;
      std::printf("         | action %s, snapshot %s\n", gg::name_of(out.recovery->action), where.c_str());
    }
    skipped += out.skipped() ? 1 : 0;
    snapshot_count += out.snapshot.dir.empty() ? 0 : 1;

    // The self-check: each injected fault is caught, every other step is applied.
    bool spike_found = false;
    for (const auto& a : out.verdict.anomalies) spike_found |= a.kind == gg::guard::AnomalyKind::kLossSpike;
    const std::string at = "step " + std::to_string(step) + ": ";
    if (step == inject_inf && !(out.skipped() && out.stats.nonfinite))
      unexpected.push_back(at + "the inf gradient was not skipped");
    else if (step == inject_spike && !(spike_found && out.skipped() && !out.snapshot.dir.empty()))
      unexpected.push_back(at + "the loss spike was not caught with a snapshot");
    else if (step != inject_inf && step != inject_spike && (out.skipped() || out.verdict.critical()))
      unexpected.push_back(at + "an anomaly nobody injected");
  }

  std::printf("done: %lld steps, %lld skipped, %lld snapshot(s); metrics in %s\n", (long long)steps,
              (long long)skipped, (long long)snapshot_count, dir.metrics().c_str());
  for (const auto& u : unexpected) std::fprintf(stderr, "unexpected: %s\n", u.c_str());
  return unexpected.empty() ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const gg::Error& e) {  // bad flags: 2; halted by the guard: 3
    std::fprintf(stderr, "libtorch_loop: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_loop: %s\n", e.what());
    return 1;
  }
}
