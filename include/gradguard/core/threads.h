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

#include <array>
#include <cstdint>
#include <string>

#include "gradguard/core/choice.h"

namespace gradguard {

// run.thread_pool: which pool gets the threads.
enum class ThreadPool { kAuto, kAten, kBlas };
constexpr std::array<Choice<ThreadPool>, 3> choices(ThreadPool) {
  return {{{ThreadPool::kAuto, "auto"}, {ThreadPool::kAten, "aten"}, {ThreadPool::kBlas, "blas"}}};
}

struct ThreadReport {
  int64_t intra_op = 0;      // ATen intra-op threads in effect
  std::string blas;          // BLAS library found ("openblas", "mkl", "blis", or "unknown")
  int64_t blas_threads = 0;  // what the BLAS pool was set to; 0 = no setter found (left alone)
  ThreadPool pool = ThreadPool::kAten;  // the pool that got the threads: kAten or kBlas
};

// The pool `requested` (run.thread_pool) resolves to for the BLAS library `blas`
// (ThreadReport::blas): auto is kBlas for OpenBLAS, whose own pthread pool is measured
// faster, and kAten otherwise; kBlas without a known BLAS (no setter to give the threads
// to) is kAten.
ThreadPool resolve_thread_pool(ThreadPool requested, const std::string& blas);

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
ThreadReport configure_threads(int64_t threads, ThreadPool pool = ThreadPool::kAuto);

}  // namespace gradguard
