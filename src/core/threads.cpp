// Looks up the BLAS thread setters at run time (dlsym), so one binary works with
// whichever BLAS the system's LibTorch is linked against, and with none.
#include "gradguard/core/threads.h"

#include <dlfcn.h>

#include <thread>

#include <ATen/Parallel.h>

namespace gradguard {

ThreadReport configure_threads(int64_t requested) {
  ThreadReport report;
  int64_t n = requested > 0 ? requested : static_cast<int64_t>(std::thread::hardware_concurrency());
  if (n < 1) n = 1;
  at::set_num_threads(static_cast<int>(n));
  report.intra_op = at::get_num_threads();
  struct Setter {
    const char* symbol;
    const char* name;
  };
  for (const Setter& s : {Setter{"openblas_set_num_threads", "openblas"}, Setter{"MKL_Set_Num_Threads", "mkl"},
                          Setter{"bli_thread_set_num_threads", "blis"}}) {
    if (void* fn = dlsym(RTLD_DEFAULT, s.symbol)) {
      reinterpret_cast<void (*)(int)>(fn)(1);
      report.blas = s.name;
      report.blas_pinned = true;
      break;
    }
  }
  if (report.blas.empty()) report.blas = "unknown";
  return report;
}

}  // namespace gradguard
