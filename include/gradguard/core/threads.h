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

// requested 0 = all cores. Safe to call more than once.
ThreadReport configure_threads(int64_t requested);

}  // namespace gradguard
