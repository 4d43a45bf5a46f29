// Data-parallel communication, measured on the ranks of one run.
//
// Part 1, all-reduce bus bandwidth of the flat gradient buffer (every parameter of the
// model, fp32): median time of a sum all-reduce; algorithm bandwidth = bytes / time,
// bus bandwidth = algbw x 2 (world - 1) / world (the traffic each link carries in a ring,
// so numbers compare across world sizes -- the convention of nccl-tests).
// Part 2, how much of the gradient communication backward hides. Three variants of one
// optimizer step's gradient work (accum micro-batches, forward + backward), interleaved
// (A, B, C, A, B, C, ...) after a warm-up, medians compared:
//   compute   forward/backward only, no communication;
//   serial    the same, then every bucket all-reduced after backward (nothing hidden);
//   overlap   GradSync as training runs it: buckets all-reduce during the last backward.
// comm = serial - compute; hidden = (serial - overlap) / comm, the fraction of the
// communication time that the overlap took off the step.
//
// Run: build/bench/dist_comm [--nproc N] [--repeats R] [--bucket-mb MB]
// Without RANK in the environment it launches N ranks of itself (gradguard launch's
// library); rank 0 prints the table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gradguard/core/stats.h"
#include "gradguard/core/threads.h"
#include "gradguard/dist/communicator.h"
#include "gradguard/dist/grad_sync.h"
#include "gradguard/dist/launch.h"
#include "gradguard/model/llama.h"
#include "gradguard/train/step.h"

using namespace gradguard;
using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int worker(int repeats, double bucket_mb) {
  const auto env = dist::detect_env();
  configure_threads(std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) /
                                             env.local_world_size));
  dist::DistOptions options;
  options.bucket_mb = bucket_mb;
  dist::Communicator comm(env, options, torch::kCPU);
  const bool main_rank = env.rank == 0;

  torch::manual_seed(1);
  model::LlamaOptions o;  // the default model: 4 layers x 128 wide
  model::LlamaForCausalLM net(o);
  std::vector<at::Tensor> params;
  int64_t numel = 0;
  for (const auto& p : net->parameters()) params.push_back(p), numel += p.numel();

  // Part 1: the flat buffer.
  auto flat = torch::ones({numel});
  std::vector<double> t_ar;
  for (int i = 0; i < repeats + 3; ++i) {
    const auto t = Clock::now();
    comm.allreduce_sum(flat, "bench all-reduce");
    if (i >= 3) t_ar.push_back(seconds_since(t));
  }
  const double bytes = static_cast<double>(numel) * 4.0, t = median(t_ar), world = env.world_size;
  const double algbw = bytes / t / 1e9, busbw = algbw * 2.0 * (world - 1.0) / world;

  // Part 2: a step's gradient work: 2 micro-batches of 16 x 64 tokens per rank.
  const int64_t accum = 2, micro = 16, T = 64;
  std::vector<data::Batch> batches;
  for (int64_t m = 0; m < accum; ++m) {
    auto tokens = torch::randint(0, o.vocab_size, {micro, T + 1}, torch::kLong);
    batches.push_back({tokens.narrow(1, 0, T).contiguous(), tokens.narrow(1, 1, T).contiguous()});
  }
  const int64_t total_tokens = accum * micro * T * env.world_size;
  amp::AmpOptions amp;
  const int64_t side_slots = 1;
  dist::GradSync sync(params, comm, options, side_slots);
  auto side = torch::zeros({side_slots});
  auto compute = [&] {
    sync.begin_step(0);
    train::accumulate(*net, batches, total_tokens, amp, torch::kCPU, 1.0, false);
  };
  auto serial = [&] {
    sync.begin_step(0);
    train::accumulate(*net, batches, total_tokens, amp, torch::kCPU, 1.0, false);
    sync.arm(side);  // after backward: no hook fires, finish() sends every bucket
    sync.finish();
  };
  auto overlap = [&] {
    sync.begin_step(0);
    train::accumulate(*net, batches, total_tokens, amp, torch::kCPU, 1.0, false,
                      [&](const train::Accumulation&) { sync.arm(side); });
    sync.finish();
  };
  std::vector<double> tc, ts, to;
  int64_t in_backward = 0;
  for (int i = 0; i < repeats + 2; ++i) {
    // Every rank runs the same sequence, so the collectives pair up.
    auto t0 = Clock::now();
    compute();
    const double a = seconds_since(t0);
    t0 = Clock::now();
    serial();
    const double b = seconds_since(t0);
    t0 = Clock::now();
    overlap();
    const double c = seconds_since(t0);
    in_backward = sync.buckets_launched_in_backward();
    if (i >= 2) tc.push_back(a), ts.push_back(b), to.push_back(c);
  }
  // Rank 0 reports rank-0 medians; the ranks' step times are alike (same work).
  if (main_rank) {
    const double c = median(tc), s = median(ts), v = median(to);
    const double comm_s = std::max(s - c, 1e-9);
    std::printf("dist_comm: %lld ranks (%s), backend %s, %lld threads per rank, %d repeats (medians)\n\n",
                (long long)env.world_size, env.source.c_str(), name_of(comm.backend()),
                (long long)std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) /
                                                    env.local_world_size),
                repeats);
    std::printf("all-reduce of the flat gradient buffer: %lld params, %.2f MB fp32\n", (long long)numel, bytes / 1e6);
    std::printf("  time %.3f ms | algbw %.3f GB/s | busbw %.3f GB/s\n\n", t * 1e3, algbw, busbw);
    std::printf("gradient work of one step (%lld micro-batches of %lld x %lld tokens per rank), %lld buckets of %.1f MiB\n",
                (long long)accum, (long long)micro, (long long)T, (long long)sync.num_buckets(), bucket_mb);
    std::printf("  compute only          %8.2f ms\n", c * 1e3);
    std::printf("  + all-reduce after    %8.2f ms  (communication %.2f ms)\n", s * 1e3, comm_s * 1e3);
    std::printf("  + all-reduce overlap  %8.2f ms  (%lld of %lld buckets launched during backward)\n", v * 1e3,
                (long long)in_backward, (long long)sync.num_buckets());
    std::printf("  hidden behind backward: %.0f%% of the communication\n",
                100.0 * std::clamp((s - v) / comm_s, 0.0, 1.0));
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  int64_t nproc = 2;
  int repeats = 15;
  double bucket_mb = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--nproc") nproc = std::atoll(argv[i + 1]);
    else if (a == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (a == "--bucket-mb") bucket_mb = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: dist_comm [--nproc N] [--repeats R] [--bucket-mb MB]\n");
      return 2;
    }
  }
  try {
    if (std::getenv("RANK") != nullptr) return worker(repeats, bucket_mb);
    dist::LaunchOptions launch;
    launch.nproc = nproc;
    std::vector<std::string> args = {"/proc/self/exe", "--repeats", std::to_string(repeats), "--bucket-mb",
                                     std::to_string(bucket_mb)};
    return dist::launch(launch, args, "/proc/self/exe", {});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_comm: %s\n", e.what());
    return 1;
  }
}
