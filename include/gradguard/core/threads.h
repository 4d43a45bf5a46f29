// CPU thread policy. A process's threads go to exactly one of two pools, never both:
// ATen's intra-op pool (OpenMP; elementwise ops, reductions, softmax) or the BLAS
// library's own pool (OpenBLAS's pthreads; every matmul). Both at full width
// oversubscribe the cores: each pool's idle workers spin while the other's need the CPU
// (measured on 2 cores: both at 2 threads halve throughput against either at 1).
// Which one should get them was measured too (docs/performance.md): with OpenBLAS,
// giving the threads to BLAS and running ATen's ops on one thread is ~1.4x faster on
// the small models of the benchmark, because with ATen's pool at 2 and BLAS at 1 every
// matmul runs on one core while ATen's second thread spins idle.
#pragma once

#include <cstdint>
#include <string>

namespace gradguard {

struct ThreadReport {
  int64_t intra_op = 0;      // ATen intra-op threads in effect
  std::string blas;          // BLAS library found ("openblas", "mkl", "blis", or "unknown")
  int64_t blas_threads = 0;  // what the BLAS pool was set to; 0 = no setter found (left alone)
  std::string pool;          // the pool that got the threads: "aten" or "blas"
};

// The pool `requested` ("auto", "aten" or "blas"; run.thread_pool) resolves to for the
// BLAS library `blas` (ThreadReport::blas): auto is "blas" for OpenBLAS, whose own pthread
// pool is measured faster, and "aten" otherwise; "blas" without a known BLAS (no setter
// to give the threads to) is "aten". Throws gradguard::Error naming run.thread_pool for
// any other value.
std::string resolve_thread_pool(const std::string& requested, const std::string& blas);
// The name check alone (config load): throws gradguard::Error naming run.thread_pool
// unless `name` is auto, aten or blas.
void check_thread_pool(const std::string& name);

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

// Gives default_threads(threads) threads (`threads` itself when > 0) to the pool that
// resolve_thread_pool(pool, <the BLAS found>) names and sets the other to one thread.
// Safe to call more than once.
ThreadReport configure_threads(int64_t threads, const std::string& pool = "auto");

}  // namespace gradguard
