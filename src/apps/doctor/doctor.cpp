// run_doctor(): the order of the checks, the distributed part (rendezvous, all-reduce,
// rank 0 gathering what the other ranks found), the report's text and JSON forms, and
// the small helpers the other doctor files share. The checks themselves live in
// env_checks.cpp (environment variables), build_checks.cpp (LibTorch, driver, BLAS,
// threads), machine_checks.cpp (CPU, memory, disk, GPU state) and bench_checks.cpp.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "doctor_internal.h"
#include "gradguard/config/config.h"
#include "gradguard/core/device.h"
#include "gradguard/core/error.h"
#include "gradguard/dist/communicator.h"

namespace gradguard::doctor {

// ---- helpers ---------------------------------------------------------------------------

namespace detail {

Check make_check(std::string name, Status status, std::string value, std::string detail) {
  Check c;
  c.name = std::move(name);
  c.status = status;
  c.value = std::move(value);
  c.detail = std::move(detail);
  return c;
}

std::string lower(std::string text) {
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, separator)) out.push_back(item);
  if (out.empty() || (!text.empty() && text.back() == separator)) out.emplace_back();
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

std::string strprintf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  char buffer[512];
  const int n = std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  if (n < static_cast<int>(sizeof(buffer))) return buffer;
  std::string big(static_cast<size_t>(n) + 1, '\0');
  va_start(args, format);
  std::vsnprintf(big.data(), big.size(), format, args);
  va_end(args);
  big.pop_back();
  return big;
}

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string format_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return strprintf("%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return strprintf("%.0f MiB", bytes / (1024.0 * 1024));
}

}  // namespace detail

using detail::make_check;
using detail::strprintf;

const char* status_name(Status status) {
  switch (status) {
    case Status::kPass:
      return "pass";
    case Status::kWarn:
      return "warn";
    case Status::kFail:
      return "fail";
    case Status::kSkip:
      return "skip";
    case Status::kInfo:
      return "info";
  }
  return "?";
}

// ---- options and report ------------------------------------------------------------------

void DoctorOptions::validate() const {
  static const std::regex device_re("cpu|auto|cuda(:[0-9]+)?");
  if (!std::regex_match(device, device_re))
    throw bad_input("--device", "'" + device + "' is not valid (valid: auto, cpu, cuda, cuda:N)");
  auto range = [](const char* key, double v, double lo, double hi, const std::string& what) {
    if (!(v >= lo && v <= hi))
      throw bad_input(key, "must be " + what + ", got " + format_number(v));
  };
  range("--threads", double(threads), 0, 1024, "in [0, 1024] (0 = CPUs / ranks on this node)");
  range("--matmul-size", double(matmul_size), 0, 65536, "in [0, 65536] (0 = by device)");
  range("--reps", double(reps), 0, 1000, "in [0, 1000] (0 = 5, quick 3)");
  range("--bandwidth-mib", bandwidth_mib, 0, 65536, "in [0, 65536] MiB (0 = 256, quick 16)");
  range("--allreduce-mib", allreduce_mib, 0, 65536, "in [0, 65536] MiB (0 = 64, quick 4)");
  range("--min-free-disk-gib", min_free_disk_gib, 0, 1e9, ">= 0 GiB (0 disables)");
  if (!(matmul_warn_fraction > 0 && matmul_warn_fraction <= 1))
    throw bad_input("--warn-fraction",
                    "must be in (0, 1], got " + format_number(matmul_warn_fraction));
  if (!(dist_timeout_s > 0))
    throw bad_input("--dist-timeout", "must be > 0 s, got " + format_number(dist_timeout_s));
  parse_choice<telemetry::TelemetryBackend>(telemetry_backend, "--gpu-backend");
}

int64_t Report::count(Status status) const {
  return std::count_if(checks.begin(), checks.end(),
                       [&](const Check& c) { return c.status == status; });
}

const Check* Report::find(const std::string& name) const {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
}

int Report::exit_code(bool strict) const {
  return count(Status::kFail) > 0 || (strict && count(Status::kWarn) > 0) ? 1 : 0;
}

std::string Report::to_text() const {
  size_t width = 0;
  for (const auto& c : checks) width = std::max(width, std::min<size_t>(c.name.size(), 28));
  std::string out = "gradguard doctor on " + host;
  if (world_size > 1)
    out += strprintf(" (rank %lld of %lld)", (long long)rank, (long long)world_size);
  out += "\n";
  for (const auto& c : checks) {
    std::string status = detail::lower(status_name(c.status));
    for (auto& ch : status) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    out += strprintf("%s  %-*s  %s", status.c_str(), static_cast<int>(width), c.name.c_str(),
                     c.value.c_str());
    if (!c.detail.empty()) out += " \u2014 " + c.detail;
    out += "\n";
  }
  out += strprintf("summary: %lld pass, %lld warn, %lld fail, %lld skip, %lld info\n",
                   (long long)count(Status::kPass), (long long)count(Status::kWarn),
                   (long long)count(Status::kFail), (long long)count(Status::kSkip),
                   (long long)count(Status::kInfo));
  return out;
}

nlohmann::ordered_json Report::to_json(bool strict) const {
  nlohmann::ordered_json j;
  j["host"] = host;
  j["rank"] = rank;
  j["world_size"] = world_size;
  j["checks"] = nlohmann::ordered_json::array();
  for (const auto& c : checks) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : c.metrics)
      m[k] = std::isfinite(v) ? nlohmann::ordered_json(v) : nullptr;
    j["checks"].push_back({{"name", c.name},
                           {"status", status_name(c.status)},
                           {"value", c.value},
                           {"detail", c.detail},
                           {"metrics", m}});
  }
  nlohmann::ordered_json s;
  for (Status st : {Status::kPass, Status::kWarn, Status::kFail, Status::kSkip, Status::kInfo})
    s[status_name(st)] = count(st);
  s["strict"] = strict;
  s["exit_code"] = exit_code(strict);
  j["summary"] = s;
  return j;
}

// ---- run_doctor ------------------------------------------------------------------------------

namespace {

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown-host";
}

// Rank 0 adds the other ranks' warnings and failures ("rank<r>.<name>"; those a rank on
// rank 0's host shares with rank 0 are not repeated) and the spread
// of the matmul benchmark across ranks ("ranks.matmul_fp32"); every rank waits until it
// has. Uses the store side channel, so it works after a broken collective too.
void gather_ranks(dist::Communicator& comm, Report& report) {
  try {
    nlohmann::json mine = {{"host", report.host}, {"checks", nlohmann::json::array()}};
    for (const auto& c : report.checks) {
      const bool bench = c.metrics.count("tflops") > 0 && c.name == "bench.matmul_fp32";
      if (c.status == Status::kWarn || c.status == Status::kFail || bench)
        mine["checks"].push_back({{"name", c.name},
                                  {"status", int(c.status)},
                                  {"value", c.value},
                                  {"detail", c.detail},
                                  {"tflops", bench ? c.metrics.at("tflops") : 0.0}});
    }
    if (comm.rank() != 0) comm.publish("doctor", mine.dump());
    comm.agree("doctor-published", "");
    if (comm.rank() == 0) {
      std::vector<std::pair<int64_t, nlohmann::json>> ranks = {{0, mine}};
      for (const auto& [r, payload] : comm.collect("doctor"))
        ranks.emplace_back(r, nlohmann::json::parse(payload));
      std::vector<Check> added;
      double lo = INFINITY, hi = 0;
      int64_t slowest = 0;
      for (const auto& [r, j] : ranks) {
        for (const auto& c : j["checks"]) {
          const auto status = static_cast<Status>(c["status"].get<int>());
          if (c["name"] == "bench.matmul_fp32" && c["tflops"].get<double>() > 0) {
            const double t = c["tflops"].get<double>();
            if (t < lo) lo = t, slowest = r;
            hi = std::max(hi, t);
          }
          // A rank on rank 0's host that found what rank 0 found adds nothing.
          const bool same =
              j["host"] == report.host && std::any_of(mine["checks"].begin(), mine["checks"].end(),
                                                      [&](const nlohmann::json& m) {
                                                        return m["name"] == c["name"] &&
                                                               m["status"] == c["status"];
                                                      });
          if (r != 0 && !same && (status == Status::kWarn || status == Status::kFail))
            added.push_back(make_check(
                "rank" + std::to_string(r) + "." + c["name"].get<std::string>(), status,
                c["value"].get<std::string>() + " [" + j["host"].get<std::string>() + "]",
                c["detail"].get<std::string>()));
        }
      }
      if (hi > 0 && ranks.size() > 1) {
        Check spread =
            make_check("ranks.matmul_fp32", Status::kPass,
                       strprintf("%.3g..%.3g TFLOP/s over %zu ranks", lo, hi, ranks.size()));
        if (lo < 0.8 * hi) {
          spread.status = Status::kWarn;
          spread.detail = strprintf(
              "rank %lld is %.0f%% slower than the fastest: the job runs at the slowest "
              "rank's pace (throttled or shared device?)",
              (long long)slowest, 100 * (1 - lo / hi));
        }
        added.push_back(spread);
      }
      for (auto& c : added) report.checks.push_back(std::move(c));
    }
    comm.agree("doctor-done", "");
  } catch (const std::exception& e) {
    report.checks.push_back(
        make_check("dist.gather", Status::kFail, "ranks could not share results", e.what()));
  }
}

}  // namespace

Check check_memory_plan(const plan::PlanInputs& in, double device_bytes, const std::string& device) {
  const auto e = plan::estimate(in);
  const double share = e.total / device_bytes;
  Check c = make_check("memory.plan", share <= 0.9 ? Status::kPass : share <= 1 ? Status::kWarn : Status::kFail,
                       strprintf("the run needs %s per rank of %s in %s (%.0f%%)", detail::format_bytes(e.total).c_str(),
                                 detail::format_bytes(device_bytes).c_str(), device.c_str(), 100 * share));
  c.metrics["estimate_bytes"] = e.total;
  c.metrics["device_bytes"] = device_bytes;
  if (share <= 0.9) return c;
  const auto s = plan::suggest(in, device_bytes);
  if (share <= 1) {
    c.detail = "less than 10% headroom in " + device + ": fragmentation may run it out of memory";
  } else if (s.fits) {
    c.detail = strprintf("%s: too small for micro-batch %lld; micro-batch %lld x accumulation %lld%s fits (%s)",
                         device.c_str(), (long long)in.micro_batch, (long long)s.micro_batch,
                         (long long)s.accum_steps, s.checkpointing ? " with activation checkpointing" : "",
                         detail::format_bytes(s.estimate.total).c_str());
  } else {
    std::string layout;
    for (const auto& l : plan::compare_layouts(in, device_bytes))
      if (l.suggestion.fits && layout.empty()) layout = l.name;
    c.detail = "no micro-batch fits in " + device + (layout.empty() ? std::string(": no layout does either")
                                                                      : "; the first layout that does: " + layout) +
               " (`gradguard plan` compares them)";
  }
  return c;
}

std::pair<double, std::string> memory_budget(const std::string& device, const std::vector<Check>& checks,
                                             int64_t local_ranks) {
  double bytes = NAN;
  std::string where;
  if (device.empty()) return {bytes, where};
  for (const auto& c : checks) {
    if (device == "cpu" && c.name == "memory" && c.metrics.count("available_gib")) {
      bytes = c.metrics.at("available_gib") * 1073741824.0 / static_cast<double>(std::max<int64_t>(1, local_ranks));
      where = local_ranks > 1 ? "this CPU's available memory per rank" : "this CPU's available memory";
    }
    // The smallest board on the node: every rank must fit on the one it gets.
    if (device != "cpu" && c.name.rfind("gpu.", 0) == 0 && c.metrics.count("memory_total_mib")) {
      const double b = c.metrics.at("memory_total_mib") * 1048576.0;
      if (b > 0 && !(b >= bytes)) bytes = b, where = c.name;
    }
  }
  return {bytes, where};
}

Report run_doctor(const DoctorOptions& options, const dist::EnvLookup& env, std::FILE* progress) {
  options.validate();
  Report report;
  report.host = host_name();
  auto add = [&](std::vector<Check> checks) {
    for (auto& c : checks) report.checks.push_back(std::move(c));
  };

  // Who we are: a bad launcher environment is a failure, and we go on as one process.
  dist::DistEnv denv;
  Check dist_check;
  try {
    denv = dist::detect_env(env);
    dist_check =
        make_check("dist.env", denv.distributed() ? Status::kPass : Status::kInfo, denv.describe());
  } catch (const Error& e) {
    dist_check = make_check("dist.env", Status::kFail, "invalid launcher environment", e.what());
  }
  report.rank = denv.rank;
  report.world_size = denv.world_size;
  report.local_rank = denv.local_rank;
  const HostFacts host = read_host_facts(denv.local_world_size);
  const CpuInfo cpu = read_cpu_info();

  // What the machine is and how it is configured.
  const detail::BuildFacts build = detail::read_build_facts();
  std::vector<std::string> gpu_names;  // [gpu] in the management library's order
  auto gpu_checks = detail::check_gpu_state(parse_choice<telemetry::TelemetryBackend>(options.telemetry_backend, "--gpu-backend"), &gpu_names);
  add(detail::check_build(build, static_cast<int64_t>(gpu_names.size())));
  std::string why;
  const auto device = detail::resolve_device(options.device, build, denv.local_rank, denv.local_world_size, &why);
  report.checks.push_back(
      device ? make_check("device", Status::kInfo, *device, "the device benchmarks run on")
             : make_check("device", Status::kFail, "unusable", why));
  report.checks.push_back(detail::check_driver(build));
  add(detail::check_blas_and_threads(options.threads, host, cpu));
  add(check_environment(env, host));
  report.checks.push_back(dist_check);
  add(detail::check_system(options, host, cpu));
  // The configured run against this device's memory: on the CPU the memory available to
  // this rank's share of the node, on a GPU its total as the management library reports it.
  if (!options.config_path.empty() || !options.overrides.empty()) {
    auto in = plan::PlanInputs::from_config(config::load_config(options.config_path, options.overrides),
                                            denv.world_size);
    if (device && *device == "cpu") in.for_this_cpu();
    std::vector<Check> seen = report.checks;
    seen.insert(seen.end(), gpu_checks.begin(), gpu_checks.end());
    const auto [bytes, where] = memory_budget(device ? *device : "", seen, denv.local_world_size);
    report.checks.push_back(std::isnan(bytes) ? make_check("memory.plan", Status::kSkip, "device memory unknown",
                                                           "give it to `gradguard plan --memory GB`")
                                              : check_memory_plan(in, bytes, where));
  }
  add(std::move(gpu_checks));

  // Meet the other ranks before the benchmarks, so theirs overlap as training's would.
  std::unique_ptr<dist::Communicator> comm;
  if (denv.distributed() && dist_check.status != Status::kFail) {
    if (progress != nullptr && denv.rank == 0)
      std::fprintf(progress, "doctor: meeting %lld ranks at %s:%d ...\n",
                   (long long)denv.world_size, denv.master_addr.c_str(), denv.master_port);
    try {
      dist::DistOptions dist_options;
      dist_options.timeout_s = options.dist_timeout_s;
      // On a GPU of a build with NCCL the ranks meet on NCCL, as training would (auto
      // backend); otherwise on Gloo over host memory.
      const torch::Device comm_device =
          device && *device != "cpu" && dist::nccl_compiled() ? torch::Device(*device) : torch::Device(torch::kCPU);
      make_current(comm_device);
      comm = std::make_unique<dist::Communicator>(denv, dist_options, comm_device);
      comm->agree("doctor-start", "");
      report.checks.push_back(make_check(
          "dist.rendezvous", Status::kPass,
          strprintf("%lld ranks met (%s)", (long long)denv.world_size, name_of(comm->backend()))));
    } catch (const std::exception& e) {
      comm.reset();
      report.checks.push_back(
          make_check("dist.rendezvous", Status::kFail, "ranks did not meet", e.what()));
    }
  }

  // Benchmarks.
  detail::BenchPlan plan =
      detail::make_plan(options, device.value_or("cpu"), host.cores, build.gpu_count);
  plan.progress = denv.local_rank == 0 ? progress : nullptr;  // one node, one progress stream
  if (!plan.device.empty() && plan.device != "cpu") {
    const size_t index = static_cast<size_t>(std::strtoll(plan.device.c_str() + 5, nullptr, 10));
    // Management-library order may differ from CUDA's; on the usual one-model node it does not
    // matter.
    if (!gpu_names.empty()) plan.gpu_name = gpu_names[std::min(index, gpu_names.size() - 1)];
  }
  if (!options.benchmarks)
    report.checks.push_back(make_check("bench", Status::kSkip, "benchmarks disabled (--no-bench)"));
  else if (!device)
    report.checks.push_back(make_check("bench", Status::kSkip, "no usable device"));
  else
    add(detail::run_local_benchmarks(plan));
  if (!denv.distributed())
    report.checks.push_back(make_check("bench.allreduce", Status::kSkip, "one process",
                                       "run `gradguard launch --nproc N -- doctor` to measure it"));
  else if (!comm)
    report.checks.push_back(make_check("bench.allreduce", Status::kSkip, "the ranks did not meet"));
  else if (!options.benchmarks)
    report.checks.push_back(
        make_check("bench.allreduce", Status::kSkip, "benchmarks disabled (--no-bench)"));
  else
    report.checks.push_back(detail::run_allreduce(*comm, plan));

  if (comm) gather_ranks(*comm, report);
  return report;
}

}  // namespace gradguard::doctor
