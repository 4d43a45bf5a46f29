// `gradguard doctor`: checks a machine before a long run and says, item by item, whether
// it is fit for one: the LibTorch build and the device it can use, driver and runtime
// versions, the BLAS library and the thread layout, the environment variables that
// silently cost throughput or break a job (launch-blocking left on, a socket interface
// that does not exist, a forced NCCL protocol, ...), the GPUs' and CPUs' state (clocks,
// throttling, temperature, load), free memory and disk, and short benchmarks (matmul
// TFLOP/s against the device's peak, memory bandwidth, device-to-device and all-reduce
// bandwidth when there are several devices or ranks).
//
// Why built this way:
// - Every finding is a Check with a status (pass / warn / fail / skip / info), a one-line
//   value and advice, so the CLI prints a checklist, --json prints the same list, and
//   the exit code is a function of the statuses alone (1 when anything failed).
// - The rules are pure functions of their inputs (an environment lookup, the host's
//   facts, GPU samples, version strings) so each one is unit-tested with made-up inputs;
//   only run_doctor() reads the machine. The environment is read through an EnvLookup,
//   as dist/env.h does, so tests inject environments without setenv.
// - Under a launcher (`gradguard launch --nproc 2 -- doctor`) every rank checks itself,
//   the ranks measure all-reduce bandwidth together over gradguard's own Communicator,
//   and rank 0 adds what the other ranks found (their warnings, failures and benchmark
//   spread) to its report; only local rank 0 prints. With one process the collective
//   checks are "skip".
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gradguard/apps/plan.h"
#include "gradguard/dist/env.h"
#include "gradguard/telemetry/telemetry.h"

namespace gradguard::doctor {

enum class Status {
  kPass,  // checked and fine
  kWarn,  // works, but costs throughput or reliability; fails the run only with --strict
  kFail,  // will break or badly slow a long run: the exit code becomes 1
  kSkip,  // does not apply here (no GPU, one process, ...)
  kInfo,  // a measurement or a fact with nothing to judge it against
};

// "pass", "warn", "fail", "skip", "info".
const char* status_name(Status status);

struct Check {
  std::string name;  // stable dotted id, e.g. "env.HIP_LAUNCH_BLOCKING", "bench.matmul_fp32"
  Status status = Status::kInfo;
  std::string value;   // what was found, one line, e.g. "0.06 TFLOP/s (45% of 0.13 peak)"
  std::string detail;  // why it matters and what to do; empty when there is nothing to add
  std::map<std::string, double> metrics;  // measured numbers for --json, e.g. {"tflops": 0.06}
};

struct Report {
  std::vector<Check> checks;  // in the order they were made
  std::string host;           // host name
  int64_t rank = 0;           // this process's rank and the job's size (1 without launcher)
  int64_t world_size = 1;
  int64_t local_rank = 0;  // rank on this node; local rank 0 prints the node's report

  int64_t count(Status status) const;
  // The first check named `name`, or nullptr.
  const Check* find(const std::string& name) const;
  // 1 when any check failed, or, with `strict`, warned; else 0.
  int exit_code(bool strict) const;
  // The checklist: one line per check ("PASS  name  value — advice") and a summary line.
  std::string to_text() const;
  // {"host", "rank", "world_size", "checks": [{"name", "status", "value", "detail",
  // "metrics"}], "summary": {"pass": n, "warn": n, "fail": n, "skip": n, "info": n,
  // "exit_code": 0|1}}.
  nlohmann::ordered_json to_json(bool strict) const;
};

struct DoctorOptions {
  // Short benchmarks (well under a second each), for tests and smoke checks.
  bool quick = false;
  // false: no matmul, bandwidth or all-reduce measurement.
  bool benchmarks = true;
  // auto (cuda:<local rank> when LibTorch sees a GPU, else cpu) | cpu | cuda | cuda:N.
  std::string device = "auto";
  // Intra-op threads, as run.threads; 0 = CPUs / ranks on this node.
  int64_t threads = 0;
  // n of the n x n matmuls; 0 = by device (CPU 2048, GPU 8192; quick 256 / 2048).
  int64_t matmul_size = 0;
  // Timed repetitions per benchmark, median reported; 0 = 5 (quick 3); <= 1000.
  int64_t reps = 0;
  // Buffer of the memory-bandwidth copy (MiB); 0 = 256 (quick 16).
  double bandwidth_mib = 0;
  // All-reduce message (MiB); 0 = 64 (quick 4).
  double allreduce_mib = 0;
  // Warn when matmul TFLOP/s < this x the peak; in (0, 1].
  double matmul_warn_fraction = 0.3;
  // Warn when the current directory has less free space (GiB); 0 disables (< 1 GiB fails).
  double min_free_disk_gib = 10;
  // Rendezvous and collective timeout with several ranks (s, > 0).
  double dist_timeout_s = 120;
  // GPU state source, as telemetry.backend: auto | nvml | rocm_smi | none.
  std::string telemetry_backend = "auto";
  // A run's configuration to check against this device's memory with `gradguard plan`'s
  // estimate (the check "memory.plan"); "" and no overrides = no such check.
  std::string config_path;
  std::vector<std::string> overrides;

  // Throws gradguard::Error (bad input) naming the CLI option, e.g. "--reps".
  void validate() const;
};

// Runs every check: reads the machine, the environment through `env`, the launcher's
// variables (RANK, WORLD_SIZE, ...; an invalid set is a "dist.env" failure), and runs
// the benchmarks. With several ranks it meets the others (gradguard's Communicator, Gloo)
// and rank 0's report also holds what the others found. Progress of the slow steps goes
// to `progress` (nullptr: silent), never to stdout. Sets ATen's and the BLAS library's
// thread counts as training would (core/threads.h). Throws gradguard::Error (bad input)
// for invalid options; every problem found on the machine is a Check, not an exception.
Report run_doctor(const DoctorOptions& options, const dist::EnvLookup& env = dist::process_env,
                  std::FILE* progress = nullptr);

// ---- the rules, as pure functions (each unit-tested) ----------------------------------

// "memory.plan": the run `in` against `device_bytes` of memory per rank (apps/plan.h's
// estimate): pass below 90%, warn up to 100%, fail above, naming the micro-batch x
// accumulation that fits or, when none does, the first memory layout that would.
Check check_memory_plan(const plan::PlanInputs& in, double device_bytes, const std::string& device);

// The memory one rank has for the plan check: on "cpu" the "memory" check's available
// memory over the node's `local_ranks`, on a GPU the smallest "gpu.N" check's total; NAN
// (and "") when the checks do not say. The second member names where the figure came from.
std::pair<double, std::string> memory_budget(const std::string& device, const std::vector<Check>& checks,
                                             int64_t local_ranks);

struct NetInterface {
  std::string name;       // e.g. "eth0"
  bool up = false;        // operstate "up" or "unknown" (loopback and some virtual links)
  bool has_ipv4 = false;  // an IPv4 address is assigned (Gloo binds one)
};

// What the environment rules need to know about the host.
struct HostFacts {
  int64_t cores = 1;                     // CPUs this process may use (affinity, cgroup quota)
  std::vector<NetInterface> interfaces;  // [interface] every network interface
  bool has_infiniband = false;           // /sys/class/infiniband lists a device
  int64_t local_world_size = 1;          // ranks sharing this node (from the launcher)
};

// Reads cores (sched_getaffinity, cgroup v2 cpu.max or v1 cfs quota), interfaces
// (getifaddrs, /sys/class/net/<if>/operstate) and /sys/class/infiniband.
HostFacts read_host_facts(int64_t local_world_size);

// The interfaces among `names` that NCCL would consider for NCCL_SOCKET_IFNAME = `spec`:
// a comma list of name prefixes; a leading '^' excludes the listed ones instead; a '='
// (after any '^') makes the entries exact names; an entry's ":port" suffix is ignored.
// "eth" -> eth0, eth1; "=eth0" -> eth0; "^docker,lo" -> all others; "^=eth0" -> all but eth0.
std::vector<std::string> match_nccl_interfaces(const std::string& spec,
                                               const std::vector<std::string>& names);

// One Check per relevant variable that is set ("env.<NAME>"), plus "env.variables" (a
// pass listing how many were looked at) when none is set. Never throws.
std::vector<Check> check_environment(const dist::EnvLookup& env, const HostFacts& host);

// Every variable check_environment() reads, in the order docs/doctor.md lists them.
const std::vector<std::string>& environment_variables();

// The CPU as /proc/cpuinfo and cpufreq describe it.
struct CpuInfo {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string model;   // model name
  int64_t family = 0;  // cpu family (AMD Zen 4: 25, Zen 5: 26)
  double max_mhz = 0;  // highest clock seen: cpuinfo_max_freq, else "cpu MHz"; 0 unknown
  // SMT: "siblings" / "cpu cores"; hardware threads of one core share its FMA units.
  int64_t threads_per_core = 1;
  // [flag] e.g. "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16".
  std::vector<std::string> flags;
  bool has(const std::string& flag) const;
};
// Parses the text of /proc/cpuinfo (max_mhz from the highest "cpu MHz").
CpuInfo parse_cpuinfo(const std::string& text);
// /proc/cpuinfo, then cpu*/cpufreq/cpuinfo_max_freq when present.
CpuInfo read_cpu_info();

// FLOPs per cycle per core from the vector units: fp32 avx512f 64 (32 on AMD family 25,
// whose AVX-512 runs on 256-bit units), avx2+fma 32, otherwise 8; bf16 amx_bf16 1024,
// avx512_bf16 twice the fp32 rate, otherwise 0 (no native bf16).
double cpu_flops_per_cycle(const CpuInfo& cpu, bool bf16);
// physical cores (cores / threads_per_core, at least 1) x max clock x FLOPs per cycle,
// TFLOP/s; 0 when the clock is unknown or there is no native bf16. An estimate: turbo
// clocks, AVX-512 down-clocking and VMs hiding the real clock all move it.
double estimate_cpu_peak_tflops(const CpuInfo& cpu, int64_t cores, bool bf16);

// Published dense peaks of a GPU model, matched case-insensitively on its name.
struct GpuPeak {
  std::string model;       // the table entry matched, e.g. "H100 SXM"
  double fp32_tflops = 0;  // fp32 without TF32 (what a plain fp32 matmul may use)
  double bf16_tflops = 0;  // dense bf16 tensor/matrix cores; 0 unknown
  double memory_gbps = 0;  // HBM/GDDR bandwidth, GB/s
};
std::optional<GpuPeak> gpu_peak(const std::string& device_name);

// The thread layout training will run with.
struct ThreadFacts {
  int64_t intra_op = 1;                // ATen intra-op threads in effect
  int64_t inter_op = 1;                // ATen inter-op threads
  std::string blas = "unknown";        // "openblas", "mkl", "blis", "reference", "unknown"
  int64_t blas_threads = -1;           // the BLAS library's own pool; -1 unknown
  int64_t blas_threads_at_start = -1;  // before gradguard pinned it; -1 unknown
  int64_t cores = 1;                   // CPUs this process may use
  int64_t local_world_size = 1;        // ranks sharing those cores
};
// "threads". fail: intra_op x blas_threads x local ranks > cores (oversubscribed: the
// pools fight for the cores, measured to halve throughput); warn: the BLAS thread count
// is unknown for a threaded BLAS, or fewer than half the cores are used; else pass.
Check check_threads(const ThreadFacts& facts);

// One Check per GPU ("gpu.<index>"): fail when the clocks are cut by hardware (HW
// slowdown, HW thermal, power brake), warn on software power cap / thermal slowdown, a
// temperature >= 85 C, or a GPU another process is using (>= 10% utilization, or more than
// max(2 GiB, 5%) of its memory in use); else pass. Empty input gives no checks.
std::vector<Check> check_gpus(const std::vector<telemetry::GpuSample>& gpus);

// "gpu.driver": the CUDA runtime LibTorch was built with ("12.1") against the kernel
// driver ("535.104.05"): CUDA 11.x needs >= 450.80.02, 12.x >= 525.60.13, 13.x >=
// 580.65.06 (minor-version compatibility). fail below; pass above; info when either is
// unknown (empty).
Check check_cuda_driver(const std::string& runtime, const std::string& driver);

}  // namespace gradguard::doctor
