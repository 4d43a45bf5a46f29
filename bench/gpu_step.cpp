// gpu_step: throughput, MFU and host syncs per step of gradguard's training step on one
// GPU, with the guard on and off, for bench/gpu/run.sh (and by hand: it also runs on the
// CPU, slowly, with --device cpu).
//
//   guarded  the trainer's step (src/train/trainer.cpp): guard::GuardedStep after
//            accumulate over micro-batches under autocast with the loss scale, the fused
//            statistics pass (unscale, per-tensor/per-layer/global norms, the loss and
//            micro-batch losses read back in the one host copy), global clip, loss
//            scaler, anomaly detector, AdamW (fused on CUDA with LibTorch >= 2.0);
//   bare     what a plain loop does: accumulate, AdamW, one loss.item() for the log line.
//            No clipping, no statistics. Only for bf16/fp32 (an fp16 loop without a
//            scaler is not a loop anyone runs).
// Data are uniform random tokens made on the device (throughput does not depend on
// them). The variants alternate in rounds after a warm-up so clock and thermal drift hit
// both alike. Every step is timed with device events (core/device.h StepTimer) read
// after the round's final sync, and the round's wall time with the host clock after a
// device synchronize; tokens/s comes from the wall time. Host syncs per step come from a
// separate short pass under SyncCounter (LibTorch's sync debug mode), so counting never
// touches the timed steps.
//
// MFU = tokens/s x (6 N + 12 L d T) / peak, N = all trainable parameters, L layers, d
// width, T sequence length (the attention term counts QK^T and AV, forward and backward,
// without halving for the causal mask, as PaLM's appendix does); peak defaults to
// 989 TFLOP/s, the dense BF16 tensor-core peak of an H100/H200 SXM (--peak-tflops).
//
// Prints one JSON object on stdout (progress on stderr).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gradguard/amp/precision.h"
#include "gradguard/core/choice.h"
#include "gradguard/core/device.h"
#include "gradguard/core/stats.h"
#include "gradguard/guard/guarded_step.h"
#include "gradguard/model/llama.h"
#include "gradguard/optim/optimizer.h"
#include "gradguard/train/step.h"

using namespace gradguard;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string device = "cuda";
  int64_t layers = 12, hidden = 768, heads = 12, kv_heads = 12, intermediate = 2048, vocab = 256;
  int64_t seq = 1024, micro = 16, accum = 2;
  std::string dtype = "bf16";
  int64_t steps = 20, warmup = 3, rounds = 2, sync_steps = 3;
  double peak_tflops = 989.0;
  bool bare = true;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "gpu_step: %s\nusage: gpu_step [--device cuda|cpu] [--layers N] [--hidden N] [--heads N] "
               "[--kv-heads N] [--intermediate N] [--vocab N] [--seq T] [--micro B] [--accum A] "
               "[--dtype bf16|fp16|fp32] [--steps N] [--warmup N] [--rounds N] [--sync-steps N] "
               "[--peak-tflops X] [--no-bare]\n",
               msg);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--no-bare") {
      a.bare = false;
      continue;
    }
    if (i + 1 >= argc) usage(("missing value after " + k).c_str());
    const char* v = argv[++i];
    auto num = [&] { return std::atoll(v); };
    if (k == "--device") a.device = v;
    else if (k == "--layers") a.layers = num();
    else if (k == "--hidden") a.hidden = num();
    else if (k == "--heads") a.heads = num();
    else if (k == "--kv-heads") a.kv_heads = num();
    else if (k == "--intermediate") a.intermediate = num();
    else if (k == "--vocab") a.vocab = num();
    else if (k == "--seq") a.seq = num();
    else if (k == "--micro") a.micro = num();
    else if (k == "--accum") a.accum = num();
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--steps") a.steps = num();
    else if (k == "--warmup") a.warmup = num();
    else if (k == "--rounds") a.rounds = num();
    else if (k == "--sync-steps") a.sync_steps = num();
    else if (k == "--peak-tflops") a.peak_tflops = std::atof(v);
    else usage(("unknown option " + k).c_str());
  }
  if (a.steps < 1 || a.rounds < 1 || a.micro < 1 || a.accum < 1) usage("steps, rounds, micro and accum must be >= 1");
  if (a.dtype == "fp16") a.bare = false;
  return a;
}

void sync_device(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

class Bench {
 public:
  Bench(const Args& a, const torch::Device& device) : a_(a), device_(device), net_(options(a)) {
    net_->to(device);
    optim::NamedParameters named;
    for (const auto& item : net_->named_parameters()) {
      named.emplace_back(item.key(), item.value());
      params_.push_back(item.value());
      names_.push_back(item.key());
    }
    amp_.dtype = parse_choice<amp::AmpDtype>(a.dtype, "--dtype");
    optim::OptimOptions oo;
    oo.lr = 1e-4;  // small: the weights stay sane over the run, the cost is the same
    optimizer_ = optim::make_optimizer(named, oo);
    guard::GuardedStepOptions go;
    go.scaler = amp_.scaler;
    go.amp_dtype = amp_.dtype;
    guarded_ = std::make_unique<guard::GuardedStep>(go, params_, names_, guard::optimizer_hooks(*optimizer_, params_));
    // Four step-sized sets of random batches on the device, cycled.
    for (int set = 0; set < 4; ++set) {
      std::vector<data::Batch> micro;
      for (int64_t m = 0; m < a.accum; ++m) {
        auto t = torch::randint(0, a.vocab, {a.micro, a.seq + 1}, torch::TensorOptions().dtype(torch::kLong).device(device));
        micro.push_back({t.narrow(1, 0, a.seq).contiguous(), t.narrow(1, 1, a.seq).contiguous()});
      }
      batches_.push_back(std::move(micro));
    }
  }

  static model::LlamaOptions options(const Args& a) {
    model::LlamaOptions o;
    o.num_layers = a.layers;
    o.hidden_size = a.hidden;
    o.num_heads = a.heads;
    o.num_kv_heads = a.kv_heads;
    o.intermediate_size = a.intermediate;
    o.vocab_size = a.vocab;
    o.max_seq_len = std::max<int64_t>(a.seq, 1024);
    return o;
  }

  int64_t parameters() { return model::count_parameters(*net_); }
  int64_t tokens_per_step() const { return a_.micro * a_.accum * a_.seq; }

  void guarded() {
    zero();
    const auto& micro = batches_[static_cast<size_t>(step_ % 4)];
    auto acc = train::accumulate(*net_, micro, tokens_per_step(), amp_, device_, guarded_->loss_scale(),
                                 /*measure_first=*/false);
    guard::StepInputs in;
    in.loss = acc.loss;
    in.micro_losses = torch::stack(acc.micro_losses);
    const auto out = guarded_->step(step_, in);
    last_loss_ = out.loss;
    if (out.scaler.skipped) ++skipped_;
    ++step_;
  }

  void bare() {
    zero();
    const auto& micro = batches_[static_cast<size_t>(step_ % 4)];
    auto loss = train::accumulate(*net_, micro, tokens_per_step(), amp_, device_, 1.0, false).loss;
    optimizer_->step();
    last_loss_ = loss.item<double>();  // the log line's read: one host sync
    ++step_;
  }

  double last_loss() const { return last_loss_; }
  int64_t skipped() const { return skipped_; }

 private:
  void zero() {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();  // set_to_none, as the trainer
  }

  Args a_;
  torch::Device device_;
  model::LlamaForCausalLM net_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  amp::AmpOptions amp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<guard::GuardedStep> guarded_;
  std::vector<std::vector<data::Batch>> batches_;
  int64_t step_ = 0, skipped_ = 0;
  double last_loss_ = 0;
};

struct Variant {
  std::string name;
  std::function<void()> step;
  std::vector<double> event_ms;  // [timed step] device-event (or host-clock) time
  double wall_s = 0;             // host wall time of the timed steps, device synchronized
  int64_t timed_steps = 0;
  std::optional<int64_t> syncs;  // over sync_steps steps
  std::string sync_note;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const torch::Device device(a.device);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "gpu_step: --device %s but LibTorch sees no CUDA device (CPU-only LibTorch, or no GPU)\n",
                 a.device.c_str());
    return 1;
  }
  torch::manual_seed(0);
  Bench bench(a, device);
  const int64_t n_params = bench.parameters();
  const double flops_per_token = 6.0 * static_cast<double>(n_params) +
                                 12.0 * static_cast<double>(a.layers * a.hidden * a.seq);
  std::fprintf(stderr,
               "gpu_step: %s, LibTorch %s, gradguard build %s | %lld params (%lld x %lld, %lld heads / %lld kv, "
               "vocab %lld) | %lld tokens/step (micro %lld x accum %lld x seq %lld) | %s\n",
               device.str().c_str(), TORCH_VERSION, gpu_build_kind(), (long long)n_params, (long long)a.layers,
               (long long)a.hidden, (long long)a.heads, (long long)a.kv_heads, (long long)a.vocab,
               (long long)bench.tokens_per_step(), (long long)a.micro, (long long)a.accum, (long long)a.seq,
               a.dtype.c_str());

  std::vector<Variant> variants(a.bare ? 2 : 1);
  variants[0].name = "guarded";
  variants[0].step = [&] { bench.guarded(); };
  if (a.bare) {
    variants[1].name = "bare";
    variants[1].step = [&] { bench.bare(); };
  }

  // Warm-up: lazy initialisation, cuBLAS/SDPA kernel selection, optimizer state, caches.
  for (auto& v : variants) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < a.warmup; ++i) v.step();
    sync_device(device);
    std::fprintf(stderr, "gpu_step: warm-up %s: %lld steps in %.2f s\n", v.name.c_str(), (long long)a.warmup,
                 std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const bool mem = reset_peak_memory(device);

  const int64_t per_round = std::max<int64_t>(1, a.steps / a.rounds);
  for (int64_t r = 0; r < a.rounds; ++r)
    for (auto& v : variants) {
      std::vector<std::unique_ptr<StepTimer>> timers;
      sync_device(device);
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < per_round; ++i) {
        timers.push_back(std::make_unique<StepTimer>(device));
        timers.back()->start();
        v.step();
        timers.back()->stop();
      }
      sync_device(device);
      v.wall_s += std::chrono::duration<double>(Clock::now() - t0).count();
      v.timed_steps += per_round;
      for (auto& t : timers) v.event_ms.push_back(t->elapsed_ms());  // all completed: no wait
      std::fprintf(stderr, "gpu_step: round %lld/%lld %s: %lld steps, median %.2f ms/step, loss %.4f\n",
                   (long long)(r + 1), (long long)a.rounds, v.name.c_str(), (long long)per_round,
                   median(v.event_ms), bench.last_loss());
    }
  const auto memory = device_memory(device);

  // Host syncs per step, counted apart from the timed steps.
  for (auto& v : variants) {
    SyncCounter counter(device);
    for (int64_t i = 0; i < a.sync_steps; ++i) v.step();
    v.syncs = counter.count();
    v.sync_note = counter.unavailable_reason();
  }

  nlohmann::ordered_json out;
  out["bench"] = "gpu_step";
  out["device"] = device.str();
  out["libtorch"] = TORCH_VERSION;
  out["gradguard_build"] = gpu_build_kind();
  out["model"] = {{"layers", a.layers}, {"hidden", a.hidden},       {"heads", a.heads},
                  {"kv_heads", a.kv_heads}, {"intermediate", a.intermediate}, {"vocab", a.vocab},
                  {"parameters", n_params}};
  out["batch"] = {{"seq", a.seq}, {"micro", a.micro}, {"accum", a.accum}, {"tokens_per_step", bench.tokens_per_step()}};
  out["dtype"] = a.dtype;
  out["flops_per_token"] = flops_per_token;
  out["mfu_formula"] = "tokens/s * (6*N + 12*L*d*T) / peak";
  out["peak_tflops"] = a.peak_tflops;
  out["timer_clock"] = StepTimer(device).clock();
  out["skipped_steps"] = bench.skipped();
  if (mem && memory) {
    out["peak_allocated_mib"] = static_cast<double>(memory->allocated_peak_bytes) / (1 << 20);
    out["peak_reserved_mib"] = static_cast<double>(memory->reserved_peak_bytes) / (1 << 20);
  } else {
    out["peak_allocated_mib"] = nullptr;
  }
  for (const auto& v : variants) {
    const double tps = static_cast<double>(v.timed_steps * bench.tokens_per_step()) / v.wall_s;
    nlohmann::ordered_json j = {{"steps", v.timed_steps},
                                {"step_ms_median", median(v.event_ms)},
                                {"wall_ms_per_step", 1e3 * v.wall_s / static_cast<double>(v.timed_steps)},
                                {"tokens_per_s", tps},
                                {"mfu", tps * flops_per_token / (a.peak_tflops * 1e12)}};
    if (v.syncs) {
      j["host_syncs_per_step"] = static_cast<double>(*v.syncs) / static_cast<double>(a.sync_steps);
    } else {
      j["host_syncs_per_step"] = nullptr;  // not measurable here (the CPU, or no CUDA code): not 0
      j["host_syncs_note"] = v.sync_note;
    }
    out[v.name] = j;
  }
  if (a.bare) {
    const double on = out["guarded"]["wall_ms_per_step"].get<double>(), off = out["bare"]["wall_ms_per_step"].get<double>();
    out["guard_overhead_pct"] = 100.0 * (on - off) / off;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
