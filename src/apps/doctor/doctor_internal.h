// Shared between the doctor's translation units: small string helpers and the groups of
// checks that read the machine (machine_checks.cpp, build_checks.cpp,
// interface_checks.cpp) or measure it (bench_checks.cpp). run_doctor() in doctor.cpp
// calls them in order.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gradguard/apps/doctor.h"

namespace gradguard::doctor::detail {

// ---- helpers -----------------------------------------------------------------------------

Check make_check(std::string name, Status status, std::string value, std::string detail = "");
std::string lower(std::string text);
std::string trim(const std::string& text);
std::vector<std::string> split(const std::string& text, char separator);
std::string join(const std::vector<std::string>& items, const std::string& separator);
// printf into a std::string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));
// A whole file, or nullopt when it cannot be read.
std::optional<std::string> read_text(const std::string& path);
// "1.5 GiB" style for a byte count.
std::string format_bytes(double bytes);

// ---- network interfaces (interface_checks.cpp) ----------------------------------------------

// "env.NCCL_SOCKET_IFNAME" / "env.GLOO_SOCKET_IFNAME" for `value` on `host` (doctor.h's
// check_environment() lists the rules).
Check check_nccl_socket_ifname(const std::string& var, const std::string& value,
                               const HostFacts& host);
Check check_gloo_socket_ifname(const std::string& var, const std::string& value,
                               const HostFacts& host);

// ---- build, device, BLAS, threads (build_checks.cpp) ---------------------------------------

// What LibTorch was built with and can use.
struct BuildFacts {
  std::string version;    // the library's TORCH_VERSION (from at::show_config())
  std::string kind;       // "CPU", "CUDA" or "ROCm"
  std::string runtime;    // "12.1" (CUDA Runtime / HIP Runtime), empty on CPU builds
  int64_t gpu_count = 0;  // devices LibTorch sees (torch::cuda::device_count())
};
BuildFacts read_build_facts();
std::vector<Check> check_build(const BuildFacts& build, int64_t telemetry_gpus);
// The device the benchmarks use, chosen as the trainer chooses (dist::gpu_for_rank):
// "auto"/"cuda" take cuda:<local rank> when LibTorch sees a GPU. On a device that cannot
// be used, returns nullopt with the reason in *why.
std::optional<std::string> resolve_device(const std::string& requested, const BuildFacts& build,
                                          int64_t local_rank, int64_t local_world_size, std::string* why);
// "gpu.driver": NVIDIA / AMD kernel driver versions against the build's runtime.
Check check_driver(const BuildFacts& build);
// "blas" and "threads": applies gradguard's thread policy (as the trainer does) first.
std::vector<Check> check_blas_and_threads(int64_t requested_threads, const HostFacts& host,
                                          const CpuInfo& cpu);

// ---- CPU, memory, disk, GPU state (machine_checks.cpp) -------------------------------------

std::vector<Check> check_system(const DoctorOptions& options, const HostFacts& host,
                                const CpuInfo& cpu);
// GPU samples from telemetry (`*names` receives the GPU names in NVML/SMI order); a
// "gpu.state" skip when there is no GPU telemetry.
std::vector<Check> check_gpu_state(telemetry::TelemetryBackend backend, std::vector<std::string>* names);

// ---- benchmarks (bench_checks.cpp) ---------------------------------------------------------

struct BenchPlan {
  std::string device;          // "cpu" or "cuda:N"
  int64_t matmul_size = 0;     // n of the n x n matmuls
  int64_t reps = 0;            // timed repetitions (median)
  double bandwidth_mib = 0;    // memory-bandwidth and device-to-device copy size (MiB)
  double allreduce_mib = 0;    // all-reduce message size (MiB)
  double warn_fraction = 0.3;  // matmul warns under this fraction of the peak
  bool quick = false;          // shorter samples (5 ms instead of 50 ms)
  std::string gpu_name;        // the device's model name from telemetry; empty unknown
  CpuInfo cpu;
  int64_t cores = 1;      // CPUs the CPU benchmark's threads may use
  int64_t gpu_count = 0;  // GPUs LibTorch sees (device-to-device needs two)
  std::FILE* progress = nullptr;
};
// Sizes from the options (0 = by device and quick mode); reads /proc/cpuinfo.
BenchPlan make_plan(const DoctorOptions& options, const std::string& device, int64_t cores,
                    int64_t gpu_count);
// "bench.matmul_fp32", "bench.matmul_bf16", "bench.memory_bandwidth", "bench.device_to_device".
std::vector<Check> run_local_benchmarks(const BenchPlan& plan);

}  // namespace gradguard::doctor::detail

namespace gradguard::dist {
class Communicator;
}

namespace gradguard::doctor::detail {
// "bench.allreduce": bus bandwidth of a float32 all-reduce over `comm`: NCCL on
// plan.device's memory, or Gloo on host memory.
Check run_allreduce(dist::Communicator& comm, const BenchPlan& plan);
}  // namespace gradguard::doctor::detail
