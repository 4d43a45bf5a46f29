// LibTorch's build and device, GPU driver against runtime, the BLAS library and the
// thread layout. The build is read from at::show_config() (the library actually loaded,
// not the headers we compiled against: the two differing is itself a failure). The BLAS
// is found the way core/threads.cpp finds it, by its entry points (dlsym), so whichever
// BLAS the system's LibTorch resolved at load time is the one described. GPU code stays
// behind torch::cuda::*, which exists in CPU builds too, so this compiles everywhere.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "doctor_internal.h"
#include "gradguard/core/error.h"
#include "gradguard/core/threads.h"
#include "gradguard/dist/env.h"

namespace gradguard::doctor {

using detail::lower;
using detail::make_check;
using detail::read_text;
using detail::split;
using detail::strprintf;
using detail::trim;

namespace {

// The text after `key` up to the first of `ends`, trimmed; empty when absent.
std::string field(const std::string& text, const std::string& key, const char* ends) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return "";
  const size_t from = at + key.size();
  return trim(text.substr(from, text.find_first_of(ends, from) - from));
}

// "550.54.15" -> {550, 54, 15}; non-digits end a component.
std::vector<int64_t> version_numbers(const std::string& v) {
  std::vector<int64_t> out;
  for (const auto& part : split(v, '.')) {
    if (part.empty() || !std::isdigit(static_cast<unsigned char>(part[0]))) break;
    out.push_back(std::strtoll(part.c_str(), nullptr, 10));
  }
  return out;
}

// The first token of `text` that looks like a version ("550.54.15").
std::string first_version(const std::string& text) {
  std::string token;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ' ';
    if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && !token.empty())) {
      token += c;
    } else {
      if (token.find('.') != std::string::npos) return token;
      token.clear();
    }
  }
  return "";
}

struct BlasFacts {
  std::string name = "unknown";  // "openblas", "mkl", "blis", "reference", "unknown"
  std::string description;       // "OpenBLAS 0.3.21 (pthreads, Haswell kernels)"
  std::string path;              // the shared object providing sgemm_
  std::string corename;          // OpenBLAS kernel family, lower case
  int64_t threads = -1;          // the library's pool size now; -1 unknown
};

template <typename F>
F lookup(const char* symbol) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, symbol));
}

BlasFacts read_blas() {
  BlasFacts b;
  if (void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_")) {
    Dl_info info{};
    if (dladdr(sgemm, &info) != 0 && info.dli_fname != nullptr) {
      // libblas.so.3 is usually an alternatives symlink: the target says which BLAS it is.
      std::error_code ec;
      const auto real = std::filesystem::canonical(info.dli_fname, ec);
      b.path = ec ? info.dli_fname : real.string();
    }
  }
  if (auto config = lookup<char* (*)()>("openblas_get_config")) {
    b.name = "openblas";
    std::string config_text = config();
    b.description = config_text.substr(0, config_text.find(' ', 9));  // "OpenBLAS 0.3.21"
    const auto parallel = lookup<int (*)()>("openblas_get_parallel");
    const int mode = parallel ? parallel() : -1;
    if (auto core = lookup<char* (*)()>("openblas_get_corename")) b.corename = lower(core());
    b.description += strprintf(" (%s%s%s kernels)",
                               mode == 0   ? "sequential"
                               : mode == 2 ? "OpenMP"
                                           : "pthreads",
                               b.corename.empty() ? "" : ", ", b.corename.c_str());
    if (auto n = lookup<int (*)()>("openblas_get_num_threads")) b.threads = n();
  } else if (auto mkl_threads = lookup<int (*)()>("MKL_Get_Max_Threads")) {
    b.name = "mkl";
    b.description = "Intel MKL";
    b.threads = mkl_threads();
  } else if (auto blis_threads = lookup<long (*)()>("bli_thread_get_num_threads")) {
    b.name = "blis";
    b.description = "BLIS";
    b.threads = blis_threads();
  } else if (b.path.find("libblas") != std::string::npos) {
    // A libblas.so.3 without any optimised BLAS's entry points: the Netlib reference.
    b.name = "reference";
    b.description = "reference BLAS (Netlib)";
    b.threads = 1;
  } else if (at::hasMKL()) {
    b.name = "mkl";
    b.description = "Intel MKL (inside LibTorch; ATen sizes its threads)";
    b.threads = 1;  // runs inside ATen's parallel regions, which keep MKL single-threaded
  } else {
    b.description = "no BLAS entry points found";
  }
  return b;
}

Check check_blas(const BlasFacts& b, const CpuInfo& cpu) {
  std::string value = b.description + (b.path.empty() ? "" : " via " + b.path);
  if (b.name == "reference")
    return make_check(
        "blas", Status::kWarn, value,
        "the unoptimised reference BLAS makes matmuls ~50x slower: install an optimised one "
        "(Debian: libopenblas0-pthread; update-alternatives --config "
        "libblas.so.3-x86_64-linux-gnu)");
  if (b.name == "unknown")
    return make_check("blas", Status::kInfo, value, "ATen's own kernels or a static BLAS");
  std::string detail;
  static const std::vector<std::string> kAvx512Cores = {"skylakex", "cooperlake", "sapphirerapids",
                                                        "zen4", "zen5"};
  if (b.name == "openblas" && cpu.has("avx512f") && !b.corename.empty() &&
      std::find(kAvx512Cores.begin(), kAvx512Cores.end(), b.corename) == kAvx512Cores.end())
    detail = "OpenBLAS runs " + b.corename +
             " kernels on an AVX-512 CPU: a newer OpenBLAS may be faster";
  return make_check("blas", Status::kPass, value, detail);
}

}  // namespace

Check check_threads(const ThreadFacts& f) {
  const int64_t ranks = std::max<int64_t>(1, f.local_world_size);
  const int64_t blas = std::max<int64_t>(1, f.blas_threads);
  const int64_t node = f.intra_op * blas * ranks;
  // The wider of the two pools is what a rank computes with (the other should be 1).
  const int64_t used = std::max<int64_t>(f.intra_op, blas) * ranks;
  const std::string blas_text = f.blas_threads < 0 ? "?" : std::to_string(f.blas_threads);
  Check c =
      make_check("threads", Status::kPass,
                 strprintf("%lld intra-op x %s BLAS x %lld rank%s on %lld CPUs (inter-op %lld)",
                           (long long)f.intra_op, blas_text.c_str(), (long long)ranks,
                           ranks > 1 ? "s" : "", (long long)f.cores, (long long)f.inter_op));
  c.metrics = {{"intra_op", double(f.intra_op)},
               {"inter_op", double(f.inter_op)},
               {"blas_threads", double(f.blas_threads)},
               {"cores", double(f.cores)}};
  const bool threaded_blas = f.blas == "openblas" || f.blas == "mkl" || f.blas == "blis";
  if (node > f.cores) {
    c.status = Status::kFail;
    c.detail =
        strprintf("oversubscribed: %lld threads compete for %lld CPUs, which halves throughput",
                  (long long)node, (long long)f.cores);
    if (blas > 1)
      c.detail +=
          "; give the threads to one pool and set the other to 1 (gradguard does, run.thread_pool, "
          "when it finds the BLAS library's setter)";
    if (used > f.cores)
      c.detail += strprintf("; set run.threads to %lld (CPUs / ranks on this node)",
                            (long long)std::max<int64_t>(1, f.cores / ranks));
  } else if (f.blas_threads < 0 && threaded_blas) {
    c.status = Status::kWarn;
    c.detail =
        "cannot read the " + f.blas + " thread count, so oversubscription cannot be ruled out";
  } else if (2 * used < f.cores) {
    c.status = Status::kWarn;
    c.detail = strprintf("uses %lld of %lld CPUs: run.threads: 0 takes its share of all of them",
                         (long long)used, (long long)f.cores);
  }
  if (f.blas_threads_at_start > 0 && f.blas_threads > 0 && f.blas_threads_at_start != f.blas_threads)
    c.detail += (c.detail.empty() ? "" : "; ") +
                strprintf("the BLAS pool started with %lld threads; gradguard set it to %lld",
                          (long long)f.blas_threads_at_start, (long long)f.blas_threads);
  return c;
}

Check check_cuda_driver(const std::string& runtime, const std::string& driver) {
  const std::string value = "driver " + (driver.empty() ? "?" : driver) + ", CUDA runtime " +
                            (runtime.empty() ? "?" : runtime);
  const auto rt = version_numbers(runtime), dv = version_numbers(driver);
  if (rt.empty() || dv.empty()) return make_check("gpu.driver", Status::kInfo, value);
  const char* minimum = rt[0] <= 11 ? "450.80.02" : rt[0] == 12 ? "525.60.13" : "580.65.06";
  if (dv < version_numbers(minimum))
    return make_check(
        "gpu.driver", Status::kFail, value,
        strprintf("CUDA %lld.x needs driver >= %s: kernels will not launch; update the driver",
                  (long long)rt[0], minimum));
  return make_check("gpu.driver", Status::kPass, value);
}

std::optional<GpuPeak> gpu_peak(const std::string& device_name) {
  // Dense (no sparsity) published peaks; fp32 is the non-tensor rate except on AMD
  // Instinct, whose fp32 matmuls run on the matrix cores.
  struct Entry {
    const char* match;  // upper-case substring of the device name
    GpuPeak peak;
  };
  static const std::vector<Entry> kTable = {
      {"GH200", {"GH200", 67, 989, 4000}},
      {"H200", {"H200", 67, 989, 4800}},
      {"H100 NVL", {"H100 NVL", 60, 835, 3900}},
      {"H100 PCIE", {"H100 PCIe", 51, 756, 2000}},
      {"H100", {"H100 SXM", 67, 989, 3350}},
      {"A100 80GB", {"A100 80GB", 19.5, 312, 2039}},
      {"A100-SXM4-80GB", {"A100 80GB", 19.5, 312, 2039}},
      {"A100", {"A100 40GB", 19.5, 312, 1555}},
      {"A10", {"A10", 31.2, 125, 600}},
      {"L40S", {"L40S", 91.6, 362, 864}},
      {"L40", {"L40", 90.5, 181, 864}},
      {"L4", {"L4", 30.3, 121, 300}},
      {"MI325X", {"MI325X", 163.4, 1307, 6000}},
      {"MI300X", {"MI300X", 163.4, 1307, 5300}},
      {"MI250X", {"MI250X", 95.7, 383, 3277}},
      {"MI250", {"MI250", 90.5, 362, 3277}},
      {"MI210", {"MI210", 45.3, 181, 1638}},
  };
  std::string upper = device_name;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const auto& e : kTable)
    if (upper.find(e.match) != std::string::npos) return e.peak;
  return std::nullopt;
}

namespace detail {

BuildFacts read_build_facts() {
  BuildFacts b;
  const std::string config = at::show_config();
  b.version = field(config, "TORCH_VERSION=", ",\n");
  const auto on = [&](const char* key) {
    const std::string v = field(config, key, ",\n");
    return v == "ON" || v == "1";
  };
  b.kind = on("USE_ROCM=") ? "ROCm" : on("USE_CUDA=") ? "CUDA" : "CPU";
  b.runtime = first_version(field(config, b.kind == "ROCm" ? "HIP Runtime" : "CUDA Runtime", "\n"));
  b.gpu_count = b.kind == "CPU" ? 0 : static_cast<int64_t>(torch::cuda::device_count());
  return b;
}

std::vector<Check> check_build(const BuildFacts& b, int64_t telemetry_gpus) {
  std::vector<Check> out;
  Check torch =
      make_check("torch", Status::kPass, "LibTorch " + b.version + ", " + b.kind + " build");
  const auto lib = version_numbers(b.version);
  if (lib.size() >= 2 && (lib[0] != TORCH_VERSION_MAJOR || lib[1] != TORCH_VERSION_MINOR)) {
    torch.status = Status::kFail;
    torch.detail =
        strprintf("gradguard was compiled against LibTorch %d.%d headers but loads %s: rebuild it",
                  TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, b.version.c_str());
  } else {
    const std::string backend = field(at::get_parallel_info(), "ATen parallel backend:", "\n");
    if (!backend.empty()) torch.detail = "ATen parallel backend: " + backend;
  }
  out.push_back(torch);
  const std::string seen =
      std::to_string(telemetry_gpus) + " GPU" + (telemetry_gpus == 1 ? "" : "s");
  if (b.kind == "CPU") {
    out.push_back(
        telemetry_gpus > 0
            ? make_check("torch.device", Status::kWarn, "CPU build; the driver reports " + seen,
                         "this LibTorch cannot use the GPUs: build against a CUDA/ROCm LibTorch")
            : make_check("torch.device", Status::kInfo, "cpu", "no CUDA/ROCm device or build"));
  } else if (b.gpu_count == 0) {
    out.push_back(make_check("torch.device", Status::kWarn, b.kind + " build sees no GPU",
                             telemetry_gpus > 0
                                 ? "the driver reports " + seen +
                                       ": check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES and "
                                       "/dev permissions"
                                 : "no GPU driver reports a device"));
  } else {
    out.push_back(
        make_check("torch.device", Status::kPass, std::to_string(b.gpu_count) + " GPU(s) visible"));
  }
  return out;
}

std::optional<std::string> resolve_device(const std::string& requested, const BuildFacts& b,
                                          int64_t local_rank, int64_t local_world_size, std::string* why) {
  if (requested == "cpu") return "cpu";
  if (requested == "auto" && b.gpu_count == 0) return "cpu";
  if (b.gpu_count == 0) {
    *why = "--device " + requested + ": LibTorch (" + b.kind + " build) sees no GPU";
    return std::nullopt;
  }
  const int64_t index = requested.rfind("cuda:", 0) == 0 ? std::strtoll(requested.c_str() + 5, nullptr, 10) : -1;
  try {
    // The trainer's choice, so the benchmarks run where training would.
    return "cuda:" + std::to_string(dist::gpu_for_rank(index, local_rank, local_world_size, b.gpu_count));
  } catch (const Error& e) {
    const std::string message = e.what();
    const std::string prefix = e.where() + ": ";
    *why = "--device " + requested + ": " +
           (message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message);
    return std::nullopt;
  }
}

Check check_driver(const BuildFacts& b) {
  std::string nvidia = first_version(read_text("/proc/driver/nvidia/version").value_or(""));
  if (nvidia.empty()) nvidia = trim(read_text("/sys/module/nvidia/version").value_or(""));
  const std::string amd = trim(read_text("/sys/module/amdgpu/version").value_or(""));
  const bool amd_loaded = amd.size() > 0 || read_text("/sys/module/amdgpu/initstate").has_value();
  const std::string rocm = trim(read_text("/opt/rocm/.info/version").value_or(""));
  if (b.kind == "CUDA") return check_cuda_driver(b.runtime, nvidia);
  if (b.kind == "ROCm")
    return make_check(
        "gpu.driver", amd_loaded ? Status::kInfo : Status::kWarn,
        "amdgpu " + (amd.empty() ? std::string(amd_loaded ? "(in-tree)" : "not loaded") : amd) +
            ", ROCm " + (rocm.empty() ? "?" : rocm) + ", HIP runtime " + b.runtime,
        amd_loaded ? "" : "no amdgpu kernel module: no GPU will be usable");
  if (!nvidia.empty() || amd_loaded)
    return make_check(
        "gpu.driver", Status::kInfo,
        (nvidia.empty() ? "amdgpu " + amd : "NVIDIA " + nvidia) + " (LibTorch is a CPU build)");
  return make_check("gpu.driver", Status::kSkip, "no GPU driver loaded");
}

std::vector<Check> check_blas_and_threads(int64_t requested_threads, const HostFacts& host,
                                          const CpuInfo& cpu) {
  ThreadFacts f;
  f.blas_threads_at_start = read_blas().threads;
  // The trainer's policy (train/trainer_setup.cpp): ranks sharing a node split its CPUs.
  const ThreadReport report = configure_threads(default_threads(requested_threads, host.local_world_size));
  const BlasFacts blas = read_blas();
  f.intra_op = report.intra_op;
  f.inter_op = at::get_num_interop_threads();
  f.blas = blas.name;
  f.blas_threads = blas.threads;
  f.cores = host.cores;
  f.local_world_size = host.local_world_size;
  return {check_blas(blas, cpu), check_threads(f)};
}

}  // namespace detail
}  // namespace gradguard::doctor
