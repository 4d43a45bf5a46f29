// CPU thread policy. ATen's intra-op pool gets the cores; the BLAS library's own pool is
// pinned to one thread, because ATen already splits work across its threads and a
// second multi-threaded pool underneath oversubscribes the cores (measured on 2 cores:
// both pools at 2 threads halve throughput against either at 1).
#pragma once

#include <cstdint>
#include <string>

namespace gradguard {

struct ThreadReport {
  int64_t intra_op = 0;     // ATen intra-op threads in effect
  std::string blas;         // BLAS library found ("openblas", "mkl", "blis", or "unknown")
  bool blas_pinned = false; // the BLAS pool was set to 1 thread
};

// CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (v2
// cpu.max, else v1 cfs quota) rounded up. In a container limited to 4 CPUs of a
// 128-core host this is 4, where hardware_concurrency() says 128.
int64_t usable_cpus();

// The intra-op thread count a process should use: `requested` when > 0; else, when a
// launcher pinned this process to fewer CPUs than the node has, usable_cpus() (the pin is
// its share); else usable_cpus() split between the `local_world_size` ranks of the node.
// At least 1.
int64_t default_threads(int64_t requested, int64_t local_world_size = 1);

// The same policy on given facts (default_threads reads them from this process):
// `affinity` CPUs in the mask, `online` CPUs of the machine, `quota` CPUs of a cgroup
// quota (0 = none).
int64_t thread_share(int64_t requested, int64_t local_world_size, int64_t affinity, int64_t online, double quota);

// Sets ATen's intra-op threads to default_threads(requested) and pins the BLAS pool to
// one thread. Safe to call more than once.
ThreadReport configure_threads(int64_t requested);

}  // namespace gradguard
