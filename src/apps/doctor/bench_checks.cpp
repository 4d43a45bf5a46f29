// The doctor's benchmarks: an n x n matmul (fp32, and bf16 where the device has native
// bf16) against the device's peak, a large copy for memory bandwidth, a copy between two
// GPUs, and a float32 all-reduce between ranks.
//
// Timing: one untimed warm-up call (allocator, BLAS/cuBLAS handles, kernel selection),
// then `reps` samples, each timing `inner` back-to-back calls between device syncs; the
// median per-call time is reported. `inner` is chosen so a sample lasts at least a few
// milliseconds, which keeps timer and sync overhead out of fast GPU kernels. Collectives
// use inner = 1 on every rank (every rank must make the same calls).
//   matmul:    TFLOP/s = 2 n^3 / t
//   copy:      GB/s = 2 x bytes / t (each byte read once and written once, as STREAM's copy)
//   device-to-device: GB/s = bytes / t (one direction)
//   all-reduce: algbw = bytes / t; busbw = algbw x 2 (n-1) / n, the traffic each rank's
//              link carries in a ring all-reduce, comparable across rank counts (the
//              convention of nccl-tests).
// GPU syncs go through torch::cuda::synchronize, which exists (and is never reached) in
// CPU-only builds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "doctor_internal.h"
#include "gradguard/dist/communicator.h"

namespace gradguard::doctor::detail {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds per call of `fn` (see the file comment). min_sample_s = 0: inner = 1.
double median_seconds(const std::function<void()>& fn, const std::function<void()>& sync,
                      int64_t reps, double min_sample_s) {
  fn();
  sync();
  int64_t inner = 1;
  if (min_sample_s > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync();
    const double first = std::max(seconds_since(t0), 1e-7);
    inner = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(min_sample_s / first)), 1, 1000);
  }
  std::vector<double> samples;  // [rep] seconds per call
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < inner; ++i) fn();
    sync();
    samples.push_back(seconds_since(t0) / static_cast<double>(inner));
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

bool is_gpu(const BenchPlan& plan) {
  return plan.device != "cpu";
}

std::function<void()> syncer(const torch::Device& device) {
  if (!device.is_cuda()) return [] {};
  const int64_t index = device.index();
  return [index] { torch::cuda::synchronize(index); };
}

double min_sample(const BenchPlan& plan) {
  return plan.quick ? 0.005 : 0.05;
}

void progress(const BenchPlan& plan, const std::string& what) {
  if (plan.progress != nullptr) {
    std::fprintf(plan.progress, "doctor: %s on %s ...\n", what.c_str(), plan.device.c_str());
    std::fflush(plan.progress);
  }
}

Check matmul(const BenchPlan& plan, bool bf16) {
  const std::string name = bf16 ? "bench.matmul_bf16" : "bench.matmul_fp32";
  const torch::Device device(plan.device);
  // The peak: the published one for a known GPU, else an estimate from the CPU's clock
  // and vector units for the threads ATen will use.
  double peak = 0;
  std::string source;
  if (is_gpu(plan)) {
    if (auto p = gpu_peak(plan.gpu_name)) {
      peak = bf16 ? p->bf16_tflops : p->fp32_tflops;
      source = p->model + " peak";
    }
  } else {
    if (bf16 && cpu_flops_per_cycle(plan.cpu, true) == 0)
      return make_check(
          name, Status::kSkip, "no native bf16 on this CPU",
          "bf16 matmuls are emulated on CPUs without AVX512-BF16 or AMX: train in fp32 here");
    const int64_t threads = std::min<int64_t>(at::get_num_threads(), plan.cores);
    peak = estimate_cpu_peak_tflops(plan.cpu, threads, bf16);
    source = strprintf("estimated peak of %lld core%s", (long long)threads, threads > 1 ? "s" : "");
  }
  const int64_t n = plan.matmul_size;
  progress(plan, strprintf("%s matmul n=%lld", bf16 ? "bf16" : "fp32", (long long)n));
  const auto opts =
      torch::TensorOptions().device(device).dtype(bf16 ? torch::kBFloat16 : torch::kFloat32);
  const auto a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
  auto c = torch::empty({n, n}, opts);
  const double t =
      median_seconds([&] { at::mm_out(c, a, b); }, syncer(device), plan.reps, min_sample(plan));
  const double tflops = 2.0 * std::pow(static_cast<double>(n), 3) / t / 1e12;
  Check check =
      make_check(name, Status::kInfo, strprintf("%.3g TFLOP/s (n=%lld)", tflops, (long long)n));
  check.metrics = {{"tflops", tflops}, {"n", double(n)}, {"seconds", t}};
  if (peak <= 0) {
    check.detail = is_gpu(plan) ? "no published peak known for \"" + plan.gpu_name + "\""
                                : "CPU clock unknown";
    return check;
  }
  const double fraction = tflops / peak;
  check.metrics["peak_tflops"] = peak;
  check.metrics["fraction_of_peak"] = fraction;
  check.value += strprintf(" = %.0f%% of %.3g (%s)", 100 * fraction, peak, source.c_str());
  check.status = fraction < plan.warn_fraction ? Status::kWarn : Status::kPass;
  if (check.status == Status::kWarn)
    check.detail = strprintf(
        "under %.0f%% of the peak: a busy machine, throttled clocks, slow BLAS kernels or "
        "(CPU) an estimate off by turbo/VM clocks",
        100 * plan.warn_fraction);
  if (plan.quick)
    check.detail +=
        std::string(check.detail.empty() ? "" : "; ") + "quick mode: small n understates";
  return check;
}

Check memory_bandwidth(const BenchPlan& plan) {
  const torch::Device device(plan.device);
  const double bytes = plan.bandwidth_mib * kMiB;
  progress(plan, strprintf("memory copy of %.0f MiB", plan.bandwidth_mib));
  const auto opts = torch::TensorOptions().device(device).dtype(torch::kFloat32);
  const auto src = torch::ones({static_cast<int64_t>(bytes / 4)}, opts);
  auto dst = torch::empty_like(src);
  const double t =
      median_seconds([&] { dst.copy_(src); }, syncer(device), plan.reps, min_sample(plan));
  const double gbps = 2.0 * bytes / t / 1e9;
  Check check = make_check("bench.memory_bandwidth", Status::kInfo,
                           strprintf("%.3g GB/s (copy of %.0f MiB)", gbps, plan.bandwidth_mib));
  check.metrics = {{"gbps", gbps}, {"bytes", bytes}, {"seconds", t}};
  if (is_gpu(plan)) {
    if (auto p = gpu_peak(plan.gpu_name)) {
      check.metrics["peak_gbps"] = p->memory_gbps;
      check.value += strprintf(" = %.0f%% of %.0f (%s peak)", 100 * gbps / p->memory_gbps,
                               p->memory_gbps, p->model.c_str());
      check.status = gbps < 0.5 * p->memory_gbps ? Status::kWarn : Status::kPass;
      if (check.status == Status::kWarn)
        check.detail = "under half the memory's peak (a copy reaches ~80-90%)";
    }
  } else {
    check.detail = "no reference for CPU memory; compare between machines of one kind";
    if (plan.quick) check.detail += "; quick mode: the buffer may fit in cache";
  }
  return check;
}

Check device_to_device(const BenchPlan& plan) {
  if (!is_gpu(plan)) return make_check("bench.device_to_device", Status::kSkip, "no GPU");
  if (plan.gpu_count < 2)
    return make_check("bench.device_to_device", Status::kSkip, "one GPU visible");
  const torch::Device from(plan.device);
  const torch::Device to(torch::kCUDA,
                         static_cast<c10::DeviceIndex>((from.index() + 1) % plan.gpu_count));
  const double bytes = plan.bandwidth_mib * kMiB;
  progress(plan, strprintf("copy of %.0f MiB to %s", plan.bandwidth_mib, to.str().c_str()));
  const auto src =
      torch::ones({static_cast<int64_t>(bytes / 4)}, torch::TensorOptions().device(from));
  auto dst = torch::empty({src.numel()}, torch::TensorOptions().device(to));
  const auto sync_from = syncer(from), sync_to = syncer(to);
  const double t = median_seconds([&] { dst.copy_(src, /*non_blocking=*/true); },
                                  [&] {
                                    sync_from();
                                    sync_to();
                                  },
                                  plan.reps, min_sample(plan));
  const double gbps = bytes / t / 1e9;
  Check check = make_check(
      "bench.device_to_device", Status::kInfo,
      strprintf("%.3g GB/s %s -> %s", gbps, from.str().c_str(), to.str().c_str()),
      "NVLink/Infinity Fabric reach 100s of GB/s; PCIe peer-to-peer ~25 (Gen4); under ~10 "
      "means copies bounce through host memory");
  check.metrics = {{"gbps", gbps}, {"bytes", bytes}, {"seconds", t}};
  return check;
}

// Runs `bench`; an exception (out of memory, an unsupported dtype) becomes a failed check.
Check guarded(const std::string& name, const std::function<Check()>& bench) {
  try {
    return bench();
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    return make_check(name, Status::kFail, "benchmark failed", what.substr(0, what.find('\n')));
  } catch (const std::exception& e) {
    return make_check(name, Status::kFail, "benchmark failed", e.what());
  }
}

}  // namespace

BenchPlan make_plan(const DoctorOptions& options, const std::string& device, int64_t cores,
                    int64_t gpu_count) {
  BenchPlan plan;
  plan.device = device;
  plan.quick = options.quick;
  const bool gpu = device != "cpu";
  plan.matmul_size = options.matmul_size > 0 ? options.matmul_size
                     : gpu                   ? (options.quick ? 2048 : 8192)
                                             : (options.quick ? 256 : 2048);
  plan.reps = options.reps > 0 ? options.reps : options.quick ? 3 : 5;
  plan.bandwidth_mib = options.bandwidth_mib > 0 ? options.bandwidth_mib : options.quick ? 16 : 256;
  plan.allreduce_mib = options.allreduce_mib > 0 ? options.allreduce_mib : options.quick ? 4 : 64;
  plan.warn_fraction = options.matmul_warn_fraction;
  plan.cpu = read_cpu_info();
  plan.cores = cores;
  plan.gpu_count = gpu_count;
  return plan;
}

std::vector<Check> run_local_benchmarks(const BenchPlan& plan) {
  return {
      guarded("bench.matmul_fp32", [&] { return matmul(plan, false); }),
      guarded("bench.matmul_bf16", [&] { return matmul(plan, true); }),
      guarded("bench.memory_bandwidth", [&] { return memory_bandwidth(plan); }),
      guarded("bench.device_to_device", [&] { return device_to_device(plan); }),
  };
}

Check run_allreduce(dist::Communicator& comm, const BenchPlan& plan) {
  return guarded("bench.allreduce", [&] {
    const double bytes = plan.allreduce_mib * kMiB;
    const int64_t n = comm.world_size();
    if (comm.rank() == 0 && plan.progress != nullptr) {
      std::fprintf(plan.progress, "doctor: all-reduce of %.0f MiB over %lld ranks ...\n",
                   plan.allreduce_mib, (long long)n);
      std::fflush(plan.progress);
    }
    // NCCL reduces device memory and returns once the collective is queued: the timing
    // waits for the device. Gloo reduces host memory and returns when it is done.
    const bool on_device = comm.backend() == dist::DistBackend::kNccl;
    const torch::Device where = on_device ? torch::Device(plan.device) : torch::Device(torch::kCPU);
    auto buffer = torch::ones({static_cast<int64_t>(bytes / 4)}, torch::TensorOptions().dtype(torch::kFloat32).device(where));
    const double t = median_seconds([&] { comm.allreduce_sum(buffer, "doctor all-reduce benchmark"); },
                                    syncer(where), plan.reps, 0);
    const double algbw = bytes / t / 1e9;
    const double busbw = algbw * 2.0 * static_cast<double>(n - 1) / static_cast<double>(n);
    Check check = make_check(
        "bench.allreduce", Status::kInfo,
        strprintf("busbw %.3g GB/s (algbw %.3g GB/s; %lld ranks, %.0f MiB, %s on %s memory)", busbw, algbw,
                  (long long)n, plan.allreduce_mib, name_of(comm.backend()), on_device ? "device" : "host"),
        "the bandwidth gradient sync gets; compare with the link speed between the ranks");
    check.metrics = {{"busbw_gbps", busbw},
                     {"algbw_gbps", algbw},
                     {"bytes", bytes},
                     {"seconds", t},
                     {"ranks", double(n)}};
    return check;
  });
}

}  // namespace gradguard::doctor::detail
