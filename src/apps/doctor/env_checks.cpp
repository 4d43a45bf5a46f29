// The environment-variable rules of `gradguard doctor`. Each rule sees one variable's
// value and the host's facts and returns one Check; the table at the bottom lists every
// variable in the order docs/doctor.md explains them. A variable that is unset gives no
// check: the checklist shows only what someone set. Values are compared
// case-insensitively where the consuming library does (NCCL, PyTorch).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>

#include "doctor_internal.h"

namespace gradguard::doctor {
namespace {

using detail::join;
using detail::lower;
using detail::make_check;
using detail::split;
using detail::trim;

using Rule =
    std::function<Check(const std::string& var, const std::string& value, const HostFacts& host)>;

Check named(const std::string& var, Status status, const std::string& value, std::string detail) {
  return make_check("env." + var, status, var + "=" + value, std::move(detail));
}

bool is_off(const std::string& value) {
  const std::string v = lower(trim(value));
  return v.empty() || v == "0" || v == "false" || v == "no" || v == "off";
}

// A whole-string positive integer, or -1.
int64_t positive_int(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  errno = 0;
  const long long v = std::strtoll(t.c_str(), nullptr, 10);
  return errno != 0 || v <= 0 ? -1 : static_cast<int64_t>(v);
}

// ---- rules -------------------------------------------------------------------------------

Check launch_blocking(const std::string& var, const std::string& value, const HostFacts&) {
  if (is_off(value)) return named(var, Status::kPass, value, "");
  return named(
      var, Status::kFail, value,
      "every kernel launch waits for the kernel to finish, so the host cannot queue work ahead and "
      "the GPU idles between kernels (often several times slower). A debugging switch: unset it");
}

Check serialize(const std::string& var, const std::string& value, const HostFacts&) {
  if (is_off(value)) return named(var, Status::kPass, value, "");
  const bool kernels = var == "AMD_SERIALIZE_KERNEL";
  return named(var, kernels ? Status::kFail : Status::kWarn, value,
               std::string("ROCm waits around every ") + (kernels ? "kernel" : "copy") +
                   ", serialising the GPU's queues. A debugging switch: unset it");
}

// NCCL_PROTO / NCCL_ALGO: "a,b", "^a,b", and for NCCL_ALGO also "op:list;op:list".
Check nccl_choice(const std::string& var, const std::string& value,
                  const std::vector<std::string>& known) {
  std::vector<std::string> unknown;
  bool empty_selection = false;
  for (const auto& part : split(value, ';')) {
    std::string list = trim(part);
    if (const auto colon = list.find(':'); colon != std::string::npos)
      list = list.substr(colon + 1);
    const bool exclude = !list.empty() && list[0] == '^';
    if (exclude) list.erase(0, 1);
    int64_t listed = 0;
    for (const auto& item : split(list, ',')) {
      const std::string name = lower(trim(item));
      if (name.empty()) continue;
      ++listed;
      if (std::none_of(known.begin(), known.end(),
                       [&](const std::string& k) { return lower(k) == name; }))
        unknown.push_back(trim(item));
    }
    if (exclude ? listed >= static_cast<int64_t>(known.size()) : listed == 0)
      empty_selection = true;
  }
  const std::string valid = "valid: " + join(known, ", ") + ", a \"^\" prefix to exclude";
  if (!unknown.empty())
    return named(
        var, Status::kFail, value,
        "unknown value" + std::string(unknown.size() > 1 ? "s " : " ") + join(unknown, ", ") +
            ": NCCL rejects the setting and fails at communicator creation (" + valid + ")");
  if (empty_selection) return named(var, Status::kFail, value, "selects nothing (" + valid + ")");
  return named(var, Status::kWarn, value,
               "overrides NCCL's per-size, per-topology choice, which is usually faster; keep "
               "it only to work around a known bug");
}

Check nccl_debug(const std::string& var, const std::string& value, const HostFacts&) {
  const std::string v = lower(trim(value));
  if (v == "info" || v == "trace")
    return named(
        var, Status::kWarn, value,
        "logs every communicator setup and (TRACE) every call: slower start-up, large logs, slower "
        "collectives with TRACE. Use WARN for long runs");
  if (v == "warn" || v == "version" || v == "none" || v == "error" || v == "abort")
    return named(var, Status::kPass, value, "");
  return named(var, Status::kWarn, value, "unknown level (NCCL knows VERSION, WARN, INFO, TRACE)");
}

Check switch_on_warns(const std::string& var, const std::string& value, const std::string& why) {
  return is_off(value) ? named(var, Status::kPass, value, "")
                       : named(var, Status::kWarn, value, why);
}

Check thread_count(const std::string& var, const std::string& value, const HostFacts& host) {
  if (trim(value).empty()) return named(var, Status::kInfo, value, "empty: ignored");
  // OMP_NUM_THREADS may list one count per nesting level ("8,2"): the first one counts.
  const int64_t n = positive_int(split(value, ',').front());
  if (n < 0)
    return named(var, Status::kFail, value,
                 "not a positive integer: the library ignores it or refuses to start its pool");
  const std::string overridden =
      "gradguard sizes ATen's intra-op and the BLAS pool itself (run.threads, run.thread_pool); "
      "this still sizes pools other code starts";
  const int64_t total = n * std::max<int64_t>(1, host.local_world_size);
  if (total > host.cores)
    return named(
        var, Status::kWarn, value,
        std::to_string(n) + " threads" +
            (host.local_world_size > 1 ? " x " + std::to_string(host.local_world_size) + " ranks"
                                       : "") +
            " > " + std::to_string(host.cores) +
            " CPUs: threads that outnumber the CPUs fight for them. " + overridden);
  return named(var, Status::kPass, value, overridden);
}

Check binding(const std::string& var, const std::string& value, const HostFacts& host) {
  const std::string v = lower(trim(value));
  const bool on = var == "OMP_PROC_BIND" ? !(v.empty() || v == "false")
                                         : !(v.empty() || v == "disabled" || v == "none");
  if (on && host.local_world_size > 1)
    return named(var, Status::kWarn, value,
                 "with " + std::to_string(host.local_world_size) +
                     " ranks on this node, every rank binds its threads to the same first CPUs; "
                     "leave it unset or give each rank its own CPU list");
  return named(var, Status::kInfo, value, "pins OpenMP threads to CPUs");
}

Check visible_devices(const std::string& var, const std::string& value, const HostFacts&) {
  const std::string v = trim(value);
  if (v.empty() || v == "-1" || lower(v) == "nodevfiles")
    return named(var, Status::kWarn, value, "hides every GPU from this process");
  return named(var, Status::kInfo, value,
               "only these GPUs are visible (indices renumbered from 0)");
}

Check library_override(const std::string& var, const std::string& value, const HostFacts&) {
  struct stat st {};
  if (value.find('/') != std::string::npos && stat(value.c_str(), &st) != 0)
    return named(var, Status::kWarn, value, "no such file: GPU telemetry will be missing");
  return named(var, Status::kInfo, value, "GPU telemetry loads this library");
}

Check info(const std::string& var, const std::string& value, const std::string& why) {
  return named(var, Status::kInfo, value, why);
}

struct VarRule {
  std::string name;
  Rule rule;
};

const std::vector<VarRule>& rules() {
  static const std::vector<std::string> kProtos = {"Simple", "LL", "LL128"};
  static const std::vector<std::string> kAlgos = {
      "Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"};
  auto warn_when_on = [](std::string why) {
    return [why](const std::string& var, const std::string& value, const HostFacts&) {
      return switch_on_warns(var, value, why);
    };
  };
  auto warn_when_off = [](std::string why) {
    return [why](const std::string& var, const std::string& value, const HostFacts&) {
      return is_off(value) && !trim(value).empty() ? named(var, Status::kWarn, value, why)
                                                   : named(var, Status::kPass, value, "");
    };
  };
  auto just_info = [](std::string why) {
    return [why](const std::string& var, const std::string& value, const HostFacts&) {
      return info(var, value, why);
    };
  };
  static const std::vector<VarRule> kRules = {
      {"CUDA_LAUNCH_BLOCKING", launch_blocking},
      {"HIP_LAUNCH_BLOCKING", launch_blocking},
      {"AMD_SERIALIZE_KERNEL", serialize},
      {"AMD_SERIALIZE_COPY", serialize},
      {"NCCL_SOCKET_IFNAME", detail::check_nccl_socket_ifname},
      {"GLOO_SOCKET_IFNAME", detail::check_gloo_socket_ifname},
      {"NCCL_PROTO", [](const std::string& var, const std::string& v,
                        const HostFacts&) { return nccl_choice(var, v, kProtos); }},
      {"NCCL_ALGO", [](const std::string& var, const std::string& v,
                       const HostFacts&) { return nccl_choice(var, v, kAlgos); }},
      {"NCCL_DEBUG", nccl_debug},
      {"NCCL_IB_DISABLE",
       [](const std::string& var, const std::string& v, const HostFacts& host) {
         if (is_off(v)) return named(var, Status::kPass, v, "");
         return named(
             var, host.has_infiniband ? Status::kWarn : Status::kInfo, v,
             "NCCL traffic between nodes falls back to TCP sockets" +
                 std::string(host.has_infiniband ? " although this host has InfiniBand" : ""));
       }},
      {"NCCL_P2P_DISABLE",
       warn_when_on("GPU-to-GPU traffic goes through host memory instead of NVLink/PCIe "
                    "peer-to-peer: much lower intra-node bandwidth")},
      {"NCCL_SHM_DISABLE",
       warn_when_on("intra-node traffic without peer-to-peer falls back to sockets")},
      {"NCCL_BLOCKING_WAIT",
       warn_when_on("the host blocks on every collective (a debugging aid for hangs): no "
                    "overlap of communication and computation")},
      {"TORCH_NCCL_BLOCKING_WAIT",
       warn_when_on("the host blocks on every collective (a debugging aid for hangs): "
                    "no overlap of communication and computation")},
      {"NCCL_ASYNC_ERROR_HANDLING",
       warn_when_off("a failed or hung collective is never detected: the job hangs "
                     "until the scheduler kills it")},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING",
       warn_when_off("a failed or hung collective is never detected: the job "
                     "hangs until the scheduler kills it")},
      {"TORCH_DISTRIBUTED_DEBUG",
       [](const std::string& var, const std::string& v, const HostFacts&) {
         const std::string l = lower(trim(v));
         if (l == "detail")
           return named(var, Status::kWarn, v,
                        "checks every collective's shapes across ranks: extra "
                        "synchronisation on every call");
         if (l == "info") return named(var, Status::kInfo, v, "extra logging at start-up");
         if (l == "off") return named(var, Status::kPass, v, "");
         return named(var, Status::kWarn, v, "unknown level (OFF, INFO, DETAIL)");
       }},
      {"HSA_ENABLE_SDMA",
       [](const std::string& var, const std::string& v, const HostFacts&) {
         const std::string t = trim(v);
         if (t == "0")
           return named(
               var, Status::kInfo, v,
               "copies use blit kernels on the compute units instead of the SDMA copy engines: a "
               "work-around for SDMA problems on some systems; it can lower host<->GPU copy "
               "bandwidth and takes compute units from kernels. Keep it only if you need it");
         if (t == "1") return named(var, Status::kPass, v, "");
         return named(var, Status::kWarn, v, "expected 0 or 1");
       }},
      {"HSA_OVERSUBSCRIBE",
       [](const std::string& var, const std::string& v, const HostFacts&) {
         const std::string t = trim(v);
         if (t == "0") return named(var, Status::kPass, v, "");
         return named(
             var, Status::kWarn, v,
             t == "1"
                 ? "lets ROCm oversubscribe the GPU's hardware queues; the GPU then time-slices "
                   "them, which makes throughput lower and unpredictable"
                 : "expected 0 or 1");
       }},
      {"HSA_XNACK",
       [](const std::string& var, const std::string& v, const HostFacts&) {
         const std::string t = trim(v);
         if (t == "0") return named(var, Status::kInfo, v, "GPU page-fault retry (XNACK) off: the default");
         if (t == "1")
           return named(var, Status::kInfo, v,
                        "GPU page-fault retry (unified memory) on: memory can be over-committed, at a "
                        "cost on some kernels");
         return named(var, Status::kWarn, v, "expected 0 or 1");
       }},
      {"AMD_LOG_LEVEL",
       [](const std::string& var, const std::string& v, const HostFacts&) {
         const int64_t n = trim(v) == "0" ? 0 : positive_int(v);
         if (n < 0) return named(var, Status::kWarn, v, "expected 0..4");
         if (n >= 3)
           return named(var, Status::kWarn, v, "ROCm logs every API call: slow and huge logs");
         return named(var, Status::kPass, v, "");
       }},
      {"CUDA_VISIBLE_DEVICES", visible_devices},
      {"HIP_VISIBLE_DEVICES", visible_devices},
      {"ROCR_VISIBLE_DEVICES", visible_devices},
      {"OMP_NUM_THREADS", thread_count},
      {"MKL_NUM_THREADS", thread_count},
      {"OPENBLAS_NUM_THREADS", thread_count},
      {"GOTO_NUM_THREADS", thread_count},
      {"BLIS_NUM_THREADS", thread_count},
      {"OMP_PROC_BIND", binding},
      {"GOMP_CPU_AFFINITY", binding},
      {"KMP_AFFINITY", binding},
      {"ATEN_CPU_CAPABILITY",
       [](const std::string& var, const std::string& v, const HostFacts&) {
         if (lower(trim(v)) == "default")
           return named(var, Status::kWarn, v,
                        "ATen's vectorised CPU kernels are off: slower CPU ops");
         return named(var, Status::kInfo, v, "limits ATen's CPU kernels to this instruction set");
       }},
      {"PYTORCH_CUDA_ALLOC_CONF",
       just_info("caching-allocator settings (fragmentation vs. speed)")},
      {"PYTORCH_HIP_ALLOC_CONF", just_info("caching-allocator settings (fragmentation vs. speed)")},
      {"LD_PRELOAD", just_info("preloaded libraries (allocators, profilers) change performance and "
                               "override gradguard's malloc tuning")},
      {"GRADGUARD_NVML_LIBRARY", library_override},
      {"GRADGUARD_ROCM_SMI_LIBRARY", library_override},
  };
  return kRules;
}

}  // namespace

std::vector<Check> check_environment(const dist::EnvLookup& env, const HostFacts& host) {
  std::vector<Check> out;
  for (const auto& r : rules()) {
    const char* value = env(r.name.c_str());
    if (value != nullptr) out.push_back(r.rule(r.name, value, host));
  }
  if (out.empty())
    out.push_back(make_check("env.variables", Status::kPass,
                             "none of " + std::to_string(rules().size()) + " known variables set",
                             "see docs/doctor.md for the list"));
  return out;
}

const std::vector<std::string>& environment_variables() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& r : rules()) n.push_back(r.name);
    return n;
  }();
  return names;
}

}  // namespace gradguard::doctor
