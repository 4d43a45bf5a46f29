// Looks up the BLAS thread setters at run time (dlsym), so one binary works with
// whichever BLAS the system's LibTorch is linked against, and with none. Counts the CPUs
// a process may really use (affinity, cgroup quota), so a container or a `taskset` does
// not get one thread per host core.
#include "gradguard/core/threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include <ATen/Parallel.h>

#include "gradguard/core/error.h"

namespace gradguard {
namespace {

// CPUs allowed by a cgroup CPU quota; 0 without a quota.
double cgroup_cpu_limit() {
  const auto first_line = [](const std::string& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
  };
  const std::string v2 = first_line("/sys/fs/cgroup/cpu.max");
  if (!v2.empty()) {
    std::istringstream in(v2);
    std::string quota;
    double period = 0;
    if (in >> quota >> period && quota != "max" && period > 0) return std::strtod(quota.c_str(), nullptr) / period;
    return 0;
  }
  for (const char* dir : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    const double q = std::strtod(first_line(std::string(dir) + "/cpu.cfs_quota_us").c_str(), nullptr);
    const double p = std::strtod(first_line(std::string(dir) + "/cpu.cfs_period_us").c_str(), nullptr);
    if (q > 0 && p > 0) return q / p;
  }
  return 0;
}

int64_t online_cpus() { return std::max<int64_t>(1, std::thread::hardware_concurrency()); }

// CPUs in this process's affinity mask (online_cpus() when it cannot be read).
int64_t affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : online_cpus();
}

// A quota caps the CPUs at its value rounded up (at least 1).
int64_t capped(int64_t cpus, double quota) {
  return quota > 0 ? std::min<int64_t>(cpus, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(quota)))) : cpus;
}

}  // namespace

int64_t usable_cpus() { return capped(affinity_cpus(), cgroup_cpu_limit()); }

int64_t thread_share(int64_t requested, int64_t local_world_size, int64_t affinity, int64_t online, double quota) {
  if (requested > 0) return requested;
  // A launcher that pins each rank (Slurm --cpus-per-task, mpirun --bind-to, taskset)
  // narrows the affinity mask: that mask is already this rank's share. Otherwise the
  // node's CPUs (capped by a cgroup quota all ranks share) are split between its ranks.
  const int64_t usable = capped(affinity, quota);
  if (affinity < online) return usable;
  return std::max<int64_t>(1, usable / std::max<int64_t>(1, local_world_size));
}

int64_t default_threads(int64_t requested, int64_t local_world_size) {
  return thread_share(requested, local_world_size, affinity_cpus(), online_cpus(), cgroup_cpu_limit());
}

ThreadPool resolve_thread_pool(ThreadPool requested, const std::string& blas) {
  if (blas == "unknown" || blas.empty()) return ThreadPool::kAten;
  if (requested == ThreadPool::kAuto) return blas == "openblas" ? ThreadPool::kBlas : ThreadPool::kAten;
  return requested;
}

ThreadReport configure_threads(int64_t threads, ThreadPool pool) {
  ThreadReport report;
  const int64_t n = default_threads(threads);
  using Setter = void (*)(int);
  Setter set_blas = nullptr;
  for (const auto& [symbol, name] : {std::pair<const char*, const char*>{"openblas_set_num_threads", "openblas"},
                                     {"MKL_Set_Num_Threads", "mkl"}, {"bli_thread_set_num_threads", "blis"}}) {
    if (void* fn = dlsym(RTLD_DEFAULT, symbol)) {
      set_blas = reinterpret_cast<Setter>(fn);
      report.blas = name;
      break;
    }
  }
  if (report.blas.empty()) report.blas = "unknown";
  report.pool = resolve_thread_pool(pool, report.blas);
  const int64_t aten = report.pool == ThreadPool::kBlas ? 1 : n;
  at::set_num_threads(static_cast<int>(aten));
  report.intra_op = at::get_num_threads();
  if (set_blas) {
    report.blas_threads = report.pool == ThreadPool::kBlas ? n : 1;
    set_blas(static_cast<int>(report.blas_threads));
  }
  return report;
}

}  // namespace gradguard
