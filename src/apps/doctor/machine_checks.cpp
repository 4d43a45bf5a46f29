// What the doctor reads from the host: CPUs (affinity, cgroup quota, /proc/cpuinfo,
// cpufreq), network interfaces, governor, temperatures, load, memory, disk, /dev/shm,
// and the GPUs' state through telemetry (NVML / ROCm SMI). Everything here is read from
// /proc and /sys, so a sandbox that hides a file turns that check into "skip" rather
// than an error.
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "doctor_internal.h"
#include "gradguard/core/allocator.h"
#include "gradguard/core/meminfo.h"
#include "gradguard/core/threads.h"

namespace gradguard::doctor {

using detail::format_bytes;
using detail::make_check;
using detail::read_text;
using detail::strprintf;
using detail::trim;
namespace fs = std::filesystem;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The first line of a /sys file, trimmed; empty when unreadable.
std::string sys_value(const std::string& path) {
  auto text = read_text(path);
  return text ? trim(text->substr(0, text->find('\n'))) : "";
}

Check check_governor() {
  std::set<std::string> governors;
  std::string driver;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/cpu", ec)) {
    const std::string gov = sys_value(entry.path().string() + "/cpufreq/scaling_governor");
    if (!gov.empty()) governors.insert(gov);
    if (driver.empty()) driver = sys_value(entry.path().string() + "/cpufreq/scaling_driver");
  }
  if (governors.empty())
    return make_check("cpu.governor", Status::kSkip, "no cpufreq",
                      "the kernel exposes no frequency scaling (VM?)");
  std::string value;
  for (const auto& g : governors) value += (value.empty() ? "" : ", ") + g;
  if (!driver.empty()) value += " (" + driver + ")";
  if (governors.count("powersave") > 0) {
    // intel_pstate / amd-pstate in active mode: "powersave" still scales up under load.
    const bool dynamic = driver.find("pstate") != std::string::npos;
    return make_check(
        "cpu.governor", dynamic ? Status::kInfo : Status::kWarn, value,
        dynamic ? "clocks scale with load; \"performance\" gives steadier step times"
                : "clocks held low: set the \"performance\" governor (cpupower frequency-set -g "
                  "performance)");
  }
  return make_check("cpu.governor", Status::kPass, value);
}

Check check_cpu_temperature() {
  double hottest = NAN;
  std::string zone;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/class/thermal", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("thermal_zone", 0) != 0) continue;
    const std::string t = sys_value(entry.path().string() + "/temp");
    if (t.empty()) continue;
    const double c = std::strtod(t.c_str(), nullptr) / 1000.0;  // millidegrees
    if (std::isnan(hottest) || c > hottest)
      hottest = c, zone = sys_value(entry.path().string() + "/type");
  }
  if (std::isnan(hottest))
    return make_check("cpu.temperature", Status::kSkip, "no thermal zones", "");
  const std::string value = strprintf("%.0f C (%s)", hottest, zone.c_str());
  if (hottest >= 90)
    return make_check("cpu.temperature", Status::kWarn, value, "hot before the run: check cooling");
  return make_check("cpu.temperature", Status::kPass, value);
}

Check check_load(int64_t cores) {
  double load1 = NAN;
  try {
    load1 = telemetry::read_process_stats().load1;
  } catch (const std::exception&) {
  }
  if (std::isnan(load1)) return make_check("cpu.load", Status::kSkip, "/proc/loadavg unreadable");
  Check c = make_check("cpu.load", Status::kPass,
                       strprintf("load %.2f on %lld CPUs", load1, (long long)cores));
  c.metrics["load1"] = load1;
  if (load1 > 0.5 * static_cast<double>(cores)) {
    c.status = Status::kWarn;
    c.detail =
        "the machine is busy: benchmarks below are unreliable and training would share the CPUs";
  }
  return c;
}

Check check_memory() {
  const auto meminfo = read_meminfo();
  if (!meminfo) return make_check("memory", Status::kSkip, "/proc/meminfo unreadable");
  auto bytes = [&](const std::string& key) {
    const auto it = meminfo->find(key);
    return it == meminfo->end() ? NAN : it->second;
  };
  const double total = bytes("MemTotal"), available = bytes("MemAvailable");
  if (std::isnan(total) || std::isnan(available))
    return make_check("memory", Status::kSkip, "no MemAvailable");
  Check c = make_check("memory", Status::kPass,
                       format_bytes(available) + " available of " + format_bytes(total));
  c.metrics["available_gib"] = available / kGiB;
  c.metrics["total_gib"] = total / kGiB;
  if (available < 0.1 * total) {
    c.status = Status::kWarn;
    c.detail = "less than 10% free: data loading and checkpoint writing may swap or be OOM-killed";
  }
  return c;
}

Check check_disk(double min_free_gib) {
  struct statvfs st {};
  if (statvfs(".", &st) != 0)
    return make_check("disk", Status::kSkip, "statvfs failed on the current directory");
  const double free = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
  Check c =
      make_check("disk", Status::kPass, format_bytes(free) + " free in the current directory");
  c.metrics["free_gib"] = free / kGiB;
  if (free < kGiB) {
    c.status = Status::kFail;
    c.detail = "under 1 GiB: checkpoints and metrics cannot be written";
  } else if (min_free_gib > 0 && free < min_free_gib * kGiB) {
    c.status = Status::kWarn;
    c.detail =
        "under " + format_bytes(min_free_gib * kGiB) + ": checkpoints of a long run may not fit";
  }
  return c;
}

Check check_shm() {
  struct statvfs st {};
  if (statvfs("/dev/shm", &st) != 0) return make_check("shm", Status::kSkip, "no /dev/shm");
  const double size = static_cast<double>(st.f_blocks) * static_cast<double>(st.f_frsize);
  Check c = make_check("shm", Status::kPass, format_bytes(size) + " /dev/shm");
  if (size < kGiB) {
    c.status = Status::kWarn;
    c.detail =
        "NCCL and data loaders put buffers in /dev/shm; containers default to 64 MiB (docker "
        "--shm-size)";
  }
  return c;
}

}  // namespace

HostFacts read_host_facts(int64_t local_world_size) {
  HostFacts host;
  host.local_world_size = std::max<int64_t>(1, local_world_size);
  host.cores = usable_cpus();
  std::set<std::string> with_ipv4;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next)
      if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET)
        with_ipv4.insert(a->ifa_name);
    freeifaddrs(list);
  }
  std::error_code ec;
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator("/sys/class/net", ec))
    names.insert(entry.path().filename());
  for (const auto& name : with_ipv4)
    names.insert(name);  // /sys hidden: getifaddrs still lists them
  for (const auto& name : names) {
    const std::string state = sys_value("/sys/class/net/" + name + "/operstate");
    host.interfaces.push_back(
        {name, state.empty() || state == "up" || state == "unknown", with_ipv4.count(name) > 0});
  }
  host.has_infiniband =
      fs::exists("/sys/class/infiniband", ec) && !fs::is_empty("/sys/class/infiniband", ec);
  return host;
}

bool CpuInfo::has(const std::string& flag) const {
  return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

CpuInfo parse_cpuinfo(const std::string& text) {
  CpuInfo cpu;
  std::istringstream in(text);
  int64_t siblings = 0, cores = 0;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "cpu MHz") cpu.max_mhz = std::max(cpu.max_mhz, std::strtod(value.c_str(), nullptr));
    if (!cpu.flags.empty() && key == "flags") continue;  // first processor's block is enough
    if (key == "vendor_id" && cpu.vendor.empty()) cpu.vendor = value;
    if (key == "model name" && cpu.model.empty()) cpu.model = value;
    if (key == "cpu family" && cpu.family == 0)
      cpu.family = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "siblings" && siblings == 0) siblings = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "cpu cores" && cores == 0) cores = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "flags") {
      std::istringstream words(value);
      for (std::string w; words >> w;) cpu.flags.push_back(w);
    }
  }
  if (siblings > 0 && cores > 0 && siblings >= cores) cpu.threads_per_core = siblings / cores;
  return cpu;
}

CpuInfo read_cpu_info() {
  CpuInfo cpu = parse_cpuinfo(read_text("/proc/cpuinfo").value_or(""));
  double max_khz = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/cpu", ec))
    max_khz = std::max(
        max_khz, std::strtod(sys_value(entry.path().string() + "/cpufreq/cpuinfo_max_freq").c_str(),
                             nullptr));
  if (max_khz > 0) cpu.max_mhz = max_khz / 1000.0;
  return cpu;
}

double cpu_flops_per_cycle(const CpuInfo& cpu, bool bf16) {
  // Two FMA pipes x vector lanes x 2 FLOPs. AMD family 25 (Zen 4) splits AVX-512 over
  // 256-bit units, so it runs at the AVX2 rate.
  double fp32 = 8;
  if (cpu.has("avx2") && cpu.has("fma")) fp32 = 32;
  if (cpu.has("avx512f")) fp32 = cpu.vendor == "AuthenticAMD" && cpu.family == 25 ? 32 : 64;
  if (!bf16) return fp32;
  if (cpu.has("amx_bf16")) return 1024;
  if (cpu.has("avx512_bf16")) return 2 * fp32;
  return 0;
}

double estimate_cpu_peak_tflops(const CpuInfo& cpu, int64_t cores, bool bf16) {
  const double physical = std::max<double>(
      1.0, std::floor(static_cast<double>(cores) /
                      static_cast<double>(std::max<int64_t>(1, cpu.threads_per_core))));
  return physical * cpu.max_mhz * 1e6 * cpu_flops_per_cycle(cpu, bf16) / 1e12;
}

std::vector<Check> check_gpus(const std::vector<telemetry::GpuSample>& gpus) {
  // NVML clocks-event reason bits (nvml.h): the hardware ones mean the board is cutting
  // clocks on its own (overheating, power supply trouble); the software ones are the
  // driver keeping power or temperature in bounds.
  constexpr uint64_t kSwPowerCap = 0x4, kHwSlowdown = 0x8, kSwThermal = 0x20, kHwThermal = 0x40,
                     kHwPowerBrake = 0x80;
  std::vector<Check> out;
  for (const auto& g : gpus) {
    std::string value = (g.name.empty() ? "GPU" : g.name) + ":";
    auto add = [&](double v, const char* fmt) {
      if (!std::isnan(v)) value += strprintf(fmt, v);
    };
    add(g.temperature_c, " %.0f C,");
    add(g.power_w, " %.0f W,");
    add(g.sm_clock_mhz, " SM %.0f MHz,");
    add(g.utilization_pct, " %.0f%% busy,");
    if (!std::isnan(g.memory_used_mb) && !std::isnan(g.memory_total_mb))
      value += strprintf(" %.1f / %.0f GiB used,", g.memory_used_mb / 1024.0,
                         g.memory_total_mb / 1024.0);
    value.pop_back();
    Check c = make_check("gpu." + std::to_string(g.index), Status::kPass, value);
    std::vector<std::string> fails, warns;
    const uint64_t r = g.throttle_reasons;
    if (r & kHwSlowdown) fails.push_back("hardware slowdown");
    if (r & kHwThermal) fails.push_back("hardware thermal slowdown");
    if (r & kHwPowerBrake) fails.push_back("power brake");
    if (r & kSwThermal) warns.push_back("software thermal slowdown");
    if (r & kSwPowerCap) warns.push_back("software power cap");
    if (!std::isnan(g.temperature_c) && g.temperature_c >= 85)
      warns.push_back(strprintf("%.0f C before the run starts", g.temperature_c));
    const double used_limit = std::max(2048.0, 0.05 * g.memory_total_mb);
    if ((!std::isnan(g.utilization_pct) && g.utilization_pct >= 10) ||
        (!std::isnan(g.memory_used_mb) && g.memory_used_mb > used_limit))
      warns.push_back("another process is using it (benchmarks unreliable; memory may run short)");
    if (!fails.empty())
      c.status = Status::kFail;
    else if (!warns.empty())
      c.status = Status::kWarn;
    for (const auto& list : {fails, warns})
      for (const auto& w : list) c.detail += (c.detail.empty() ? "" : "; ") + w;
    if (!fails.empty())
      c.detail += " -- clocks are being cut by the board: check cooling and power";
    c.metrics["temperature_c"] = g.temperature_c;
    c.metrics["power_w"] = g.power_w;
    c.metrics["sm_clock_mhz"] = g.sm_clock_mhz;
    c.metrics["utilization_pct"] = g.utilization_pct;
    c.metrics["memory_used_mib"] = g.memory_used_mb;
    c.metrics["memory_total_mib"] = g.memory_total_mb;
    c.metrics["throttle_reasons"] = static_cast<double>(g.throttle_reasons);
    out.push_back(std::move(c));
  }
  return out;
}

namespace detail {

std::vector<Check> check_system(const DoctorOptions& options, const HostFacts& host,
                                const CpuInfo& cpu) {
  std::vector<Check> out;
  const int64_t online = std::max<int64_t>(1, std::thread::hardware_concurrency());
  std::string value = (cpu.model.empty() ? "CPU" : cpu.model) + ", " + std::to_string(host.cores) +
                      " of " + std::to_string(online) + " CPUs usable";
  if (cpu.max_mhz > 0) value += strprintf(", %.2f GHz", cpu.max_mhz / 1000.0);
  value += cpu.has("avx512f") ? ", AVX-512" : cpu.has("avx2") ? ", AVX2" : "";
  if (cpu.has("amx_bf16") || cpu.has("avx512_bf16"))
    value += cpu.has("amx_bf16") ? ", AMX-BF16" : ", AVX512-BF16";
  out.push_back(
      make_check("cpu", Status::kInfo, value,
                 host.cores < online ? "CPU affinity or a cgroup quota limits this process" : ""));
  out.push_back(check_governor());
  out.push_back(check_cpu_temperature());
  out.push_back(check_load(host.cores));
  out.push_back(check_memory());
  out.push_back(check_disk(options.min_free_disk_gib));
  out.push_back(check_shm());
  if (host.has_infiniband) {
    rlimit lim{};
    if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
      out.push_back(make_check("memlock", Status::kWarn,
                               format_bytes(static_cast<double>(lim.rlim_cur)),
                               "RDMA pins memory: set `ulimit -l unlimited` for InfiniBand"));
  }
  out.push_back(
      configure_allocator()
          ? make_check("allocator", Status::kPass, "glibc malloc thresholds raised")
          : make_check("allocator", Status::kWarn, "glibc refused the malloc tuning",
                       "every step may page-fault its activations in again (core/allocator.h)"));
  return out;
}

std::vector<Check> check_gpu_state(telemetry::TelemetryBackend backend, std::vector<std::string>* names) {
  std::string note;
  auto monitor = telemetry::open_gpu_monitor(backend, &note);
  if (!monitor) {
    const std::string prefix = "no GPU telemetry: ";
    if (note.compare(0, prefix.size(), prefix) == 0) note.erase(0, prefix.size());
    return {make_check("gpu.state", Status::kSkip, "no GPU telemetry", note)};
  }
  const auto samples = monitor->sample();
  for (const auto& s : samples) names->push_back(s.name);
  auto out = check_gpus(samples);
  if (out.empty())
    out.push_back(make_check("gpu.state", Status::kSkip, monitor->backend() + " reports no GPU"));
  return out;
}

}  // namespace detail
}  // namespace gradguard::doctor
