// `gradguard doctor`: every environment rule on made-up environments and hosts
// (including NCCL's interface-list syntax), the thread-oversubscription rule, the CPU
// peak estimate, the GPU state and driver rules, the report's exit code / text / JSON,
// a quick run on this machine, and the CLI: a bad variable fails with exit 1 and names
// the check, --json parses, GPU state through the fake NVML, and two ranks measure
// all-reduce bandwidth.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <map>
#include <memory>

#include <torch/cuda.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "gradguard/apps/doctor.h"
#include "test_util.h"

namespace gradguard {
namespace {

using doctor::Check;
using doctor::Status;
using ::testing::HasSubstr;
using ::testing::Not;

dist::EnvLookup env_of(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

doctor::HostFacts host(int64_t local_world_size = 1, bool infiniband = false) {
  doctor::HostFacts h;
  h.cores = 4;
  h.local_world_size = local_world_size;
  h.has_infiniband = infiniband;
  h.interfaces = {{"docker0", true, true}, {"eth0", true, true}, {"eth1", false, true},
                  {"ib0", true, true},     {"lo", true, true},   {"veth9", true, false}};
  return h;
}

// The check named `name` among the checks made for `vars` on host().
Check env_check(const std::string& name, std::map<std::string, std::string> vars,
                const doctor::HostFacts& h = host()) {
  for (const auto& c : doctor::check_environment(env_of(std::move(vars)), h))
    if (c.name == name) return c;
  ADD_FAILURE() << "no check " << name;
  return {};
}

Status env_status(const std::string& var, const std::string& value,
                  const doctor::HostFacts& h = host()) {
  return env_check("env." + var, {{var, value}}, h).status;
}

// ---- environment rules -----------------------------------------------------------------

TEST(DoctorEnv, NothingSetGivesOnePass) {
  const auto checks = doctor::check_environment(env_of({}), host());
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].name, "env.variables");
  EXPECT_EQ(checks[0].status, Status::kPass);
}

TEST(DoctorEnv, LaunchBlockingAndSerialisationFail) {
  EXPECT_EQ(env_status("HIP_LAUNCH_BLOCKING", "1"), Status::kFail);
  EXPECT_EQ(env_status("CUDA_LAUNCH_BLOCKING", "1"), Status::kFail);
  EXPECT_EQ(env_status("CUDA_LAUNCH_BLOCKING", "0"), Status::kPass);
  EXPECT_EQ(env_status("AMD_SERIALIZE_KERNEL", "3"), Status::kFail);
  EXPECT_EQ(env_status("AMD_SERIALIZE_COPY", "1"), Status::kWarn);
  const auto c = env_check("env.HIP_LAUNCH_BLOCKING", {{"HIP_LAUNCH_BLOCKING", "1"}});
  EXPECT_EQ(c.value, "HIP_LAUNCH_BLOCKING=1");
  EXPECT_THAT(c.detail, HasSubstr("unset it"));
}

TEST(DoctorEnv, NcclInterfaceSyntax) {
  const std::vector<std::string> names = {"docker0", "eth0", "eth1", "ib0", "lo"};
  using V = std::vector<std::string>;
  EXPECT_EQ(doctor::match_nccl_interfaces("eth", names), (V{"eth0", "eth1"}));     // prefix
  EXPECT_EQ(doctor::match_nccl_interfaces("ib,eth1", names), (V{"eth1", "ib0"}));  // list
  EXPECT_EQ(doctor::match_nccl_interfaces("=eth", names), V{});                    // exact
  EXPECT_EQ(doctor::match_nccl_interfaces("=eth0", names), V{"eth0"});
  EXPECT_EQ(doctor::match_nccl_interfaces("^docker,lo", names),
            (V{"eth0", "eth1", "ib0"}));                            // exclusion
  EXPECT_EQ(doctor::match_nccl_interfaces("^=eth", names), names);  // exact exclusion
  EXPECT_EQ(doctor::match_nccl_interfaces("^=eth0", names), (V{"docker0", "eth1", "ib0", "lo"}));
  EXPECT_EQ(doctor::match_nccl_interfaces("eth0:5555", names), V{"eth0"});  // port ignored
  EXPECT_EQ(doctor::match_nccl_interfaces("nosuchif0", names), V{});
}

TEST(DoctorEnv, NcclSocketIfnameMustMatchAnInterface) {
  const auto missing = env_check("env.NCCL_SOCKET_IFNAME", {{"NCCL_SOCKET_IFNAME", "nosuchif0"}});
  EXPECT_EQ(missing.status, Status::kFail);
  EXPECT_THAT(missing.detail, HasSubstr("eth0"));  // lists what the host has
  const auto typo = env_check("env.NCCL_SOCKET_IFNAME", {{"NCCL_SOCKET_IFNAME", "eth0,nosuch"}});
  EXPECT_EQ(typo.status, Status::kWarn);
  EXPECT_THAT(typo.detail, HasSubstr("nosuch"));
  EXPECT_EQ(env_status("NCCL_SOCKET_IFNAME", "^eth,lo,ib,docker,veth"),
            Status::kFail);                                              // excludes all
  EXPECT_EQ(env_status("NCCL_SOCKET_IFNAME", "^dockr"), Status::kWarn);  // excludes nothing: typo?
  EXPECT_EQ(env_status("NCCL_SOCKET_IFNAME", "=eth1"), Status::kWarn);   // down
  EXPECT_EQ(env_status("NCCL_SOCKET_IFNAME", "eth"), Status::kPass);
  EXPECT_EQ(env_status("NCCL_SOCKET_IFNAME", "^docker,lo"), Status::kPass);
}

TEST(DoctorEnv, GlooSocketIfnameIsOneExactName) {
  EXPECT_EQ(env_status("GLOO_SOCKET_IFNAME", "nosuchif0"), Status::kFail);
  EXPECT_EQ(env_status("GLOO_SOCKET_IFNAME", "eth"), Status::kFail);  // a prefix is not a name
  EXPECT_EQ(env_status("GLOO_SOCKET_IFNAME", "eth0,ib0"), Status::kFail);
  EXPECT_EQ(env_status("GLOO_SOCKET_IFNAME", "eth1"), Status::kWarn);   // down
  EXPECT_EQ(env_status("GLOO_SOCKET_IFNAME", "veth9"), Status::kWarn);  // no IPv4
  EXPECT_EQ(env_status("GLOO_SOCKET_IFNAME", "eth0"), Status::kPass);
}

TEST(DoctorEnv, NcclProtoAndAlgoValues) {
  EXPECT_EQ(env_status("NCCL_PROTO", "LL128"), Status::kWarn);      // valid, but forced
  EXPECT_EQ(env_status("NCCL_PROTO", "ll,simple"), Status::kWarn);  // case-insensitive
  EXPECT_EQ(env_status("NCCL_PROTO", "^LL,LL128"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_PROTO", "^Simple,LL,LL128"), Status::kFail);  // nothing left
  const auto bad = env_check("env.NCCL_PROTO", {{"NCCL_PROTO", "Simpel"}});
  EXPECT_EQ(bad.status, Status::kFail);
  EXPECT_THAT(bad.detail, HasSubstr("Simpel"));
  EXPECT_THAT(bad.detail, HasSubstr("LL128"));  // says what is valid
  EXPECT_EQ(env_status("NCCL_ALGO", "Ring,Tree"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_ALGO", "ring,nvlstree,PAT,collnetchain"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_ALGO", "^NVLS"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_ALGO", "allreduce:tree;allgather:ring"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_ALGO", "Treee"), Status::kFail);
  EXPECT_EQ(env_status("NCCL_ALGO", "allreduce:bogus"), Status::kFail);
}

TEST(DoctorEnv, NcclDebugAndDistributedSwitches) {
  EXPECT_EQ(env_status("NCCL_DEBUG", "INFO"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_DEBUG", "trace"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_DEBUG", "WARN"), Status::kPass);
  EXPECT_EQ(env_status("NCCL_DEBUG", "loud"), Status::kWarn);
  EXPECT_EQ(env_status("TORCH_NCCL_BLOCKING_WAIT", "1"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_BLOCKING_WAIT", "0"), Status::kPass);
  EXPECT_EQ(env_status("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"), Status::kWarn);
  EXPECT_EQ(env_status("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"), Status::kPass);
  EXPECT_EQ(env_status("TORCH_DISTRIBUTED_DEBUG", "DETAIL"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_P2P_DISABLE", "1"), Status::kWarn);
  EXPECT_EQ(env_status("NCCL_IB_DISABLE", "1"), Status::kInfo);  // no InfiniBand here
  EXPECT_EQ(env_status("NCCL_IB_DISABLE", "1", host(1, true)), Status::kWarn);  // with InfiniBand
  EXPECT_EQ(env_status("CUDA_VISIBLE_DEVICES", ""), Status::kWarn);             // hides every GPU
  EXPECT_EQ(env_status("CUDA_VISIBLE_DEVICES", "0,1"), Status::kInfo);
}

TEST(DoctorEnv, AmdVariables) {
  const auto sdma = env_check("env.HSA_ENABLE_SDMA", {{"HSA_ENABLE_SDMA", "0"}});
  EXPECT_EQ(sdma.status, Status::kInfo);
  EXPECT_THAT(sdma.detail, HasSubstr("SDMA"));
  EXPECT_EQ(env_status("HSA_ENABLE_SDMA", "1"), Status::kPass);
  EXPECT_EQ(env_status("HSA_ENABLE_SDMA", "yes"), Status::kWarn);
  EXPECT_EQ(env_status("HSA_OVERSUBSCRIBE", "1"), Status::kWarn);
  EXPECT_EQ(env_status("HSA_OVERSUBSCRIBE", "0"), Status::kPass);
  EXPECT_EQ(env_status("AMD_LOG_LEVEL", "4"), Status::kWarn);
  EXPECT_EQ(env_status("AMD_LOG_LEVEL", "0"), Status::kPass);
}

TEST(DoctorEnv, ThreadCountVariables) {
  EXPECT_EQ(env_status("OMP_NUM_THREADS", "abc"), Status::kFail);
  EXPECT_EQ(env_status("OMP_NUM_THREADS", "0"), Status::kFail);
  EXPECT_EQ(env_status("OMP_NUM_THREADS", "8"), Status::kWarn);  // 8 > 4 cores
  EXPECT_EQ(env_status("OMP_NUM_THREADS", "4"), Status::kPass);
  EXPECT_EQ(env_status("OMP_NUM_THREADS", "2,1"), Status::kPass);         // per nesting level
  EXPECT_EQ(env_status("OMP_NUM_THREADS", "3", host(2)), Status::kWarn);  // 3 x 2 ranks > 4
  EXPECT_EQ(env_status("MKL_NUM_THREADS", "x"), Status::kFail);
  EXPECT_EQ(env_status("OPENBLAS_NUM_THREADS", "1"), Status::kPass);
  EXPECT_EQ(env_status("OMP_PROC_BIND", "true", host(2)),
            Status::kWarn);  // ranks share the first CPUs
  EXPECT_EQ(env_status("OMP_PROC_BIND", "true", host(1)), Status::kInfo);
}

TEST(DoctorEnv, EveryVariableIsDocumented) {
  const std::string docs = test::read_text(test::source_path("docs/doctor.md"));
  for (const auto& name : doctor::environment_variables())
    EXPECT_THAT(docs, HasSubstr("`" + name + "`"))
        << name << " is checked but not in docs/doctor.md";
}

// ---- threads, CPU peak, GPU state, driver --------------------------------------------------

TEST(DoctorThreads, OversubscriptionFails) {
  doctor::ThreadFacts f;
  f.blas = "openblas", f.cores = 2, f.intra_op = 2, f.blas_threads = 1;
  EXPECT_EQ(doctor::check_threads(f).status, Status::kPass);
  f.blas_threads = 2;  // ATen 2 x OpenBLAS 2 on 2 cores
  const auto over = doctor::check_threads(f);
  EXPECT_EQ(over.status, Status::kFail);
  EXPECT_THAT(over.detail, HasSubstr("oversubscribed"));
  f.blas_threads = 1, f.local_world_size = 2;  // two ranks taking all cores each
  EXPECT_EQ(doctor::check_threads(f).status, Status::kFail);
  EXPECT_THAT(doctor::check_threads(f).detail, HasSubstr("run.threads to 1"));
  f.intra_op = 1;
  EXPECT_EQ(doctor::check_threads(f).status, Status::kPass);
  f.local_world_size = 1, f.cores = 8;  // 1 of 8 CPUs
  EXPECT_EQ(doctor::check_threads(f).status, Status::kWarn);
  f.cores = 1, f.blas_threads = -1;  // cannot rule it out
  EXPECT_EQ(doctor::check_threads(f).status, Status::kWarn);
  f.blas_threads = 1, f.blas_threads_at_start = 2;
  EXPECT_THAT(doctor::check_threads(f).detail, HasSubstr("set it to 1"));
}

TEST(DoctorThreads, ThreadsInTheBlasPoolCountLikeAtensOwn) {
  // run.thread_pool=blas: ATen on 1 thread, OpenBLAS on the cores.
  doctor::ThreadFacts f;
  f.blas = "openblas", f.cores = 2, f.intra_op = 1, f.blas_threads = 2, f.blas_threads_at_start = 2;
  const auto ok = doctor::check_threads(f);
  EXPECT_EQ(ok.status, Status::kPass) << ok.detail;
  EXPECT_THAT(ok.detail, Not(HasSubstr("gradguard set it")));  // unchanged from the start
  f.cores = 8;  // 2 of 8 CPUs
  EXPECT_EQ(doctor::check_threads(f).status, Status::kWarn);
  EXPECT_THAT(doctor::check_threads(f).detail, HasSubstr("uses 2 of 8 CPUs"));
  f.cores = 2, f.local_world_size = 2;  // two ranks with 2 BLAS threads each on 2 cores
  const auto over = doctor::check_threads(f);
  EXPECT_EQ(over.status, Status::kFail);
  EXPECT_THAT(over.detail, HasSubstr("run.threads to 1"));
}

TEST(DoctorCpu, ParsesCpuinfoAndEstimatesThePeak) {
  const std::string text =
      "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: Test Xeon\n"
      "cpu MHz\t\t: 2000.000\nsiblings\t: 8\ncpu cores\t: 4\nflags\t\t: fpu avx2 fma avx512f "
      "avx512_bf16\n\n"
      "processor\t: 1\ncpu MHz\t\t: 3000.000\nflags\t\t: fpu\n";
  const auto cpu = doctor::parse_cpuinfo(text);
  EXPECT_EQ(cpu.vendor, "GenuineIntel");
  EXPECT_EQ(cpu.model, "Test Xeon");
  EXPECT_DOUBLE_EQ(cpu.max_mhz, 3000);
  EXPECT_EQ(cpu.threads_per_core, 2);
  EXPECT_TRUE(cpu.has("avx512f"));
  EXPECT_DOUBLE_EQ(doctor::cpu_flops_per_cycle(cpu, false), 64);
  EXPECT_DOUBLE_EQ(doctor::cpu_flops_per_cycle(cpu, true), 128);
  // 8 logical CPUs = 4 physical cores x 3 GHz x 64 FLOPs/cycle.
  EXPECT_NEAR(doctor::estimate_cpu_peak_tflops(cpu, 8, false), 4 * 3e9 * 64 / 1e12, 1e-12);
  doctor::CpuInfo zen4 = cpu;
  zen4.vendor = "AuthenticAMD", zen4.family = 25;
  EXPECT_DOUBLE_EQ(doctor::cpu_flops_per_cycle(zen4, false), 32);  // AVX-512 on 256-bit units
  doctor::CpuInfo plain;
  plain.flags = {"avx2", "fma"};
  EXPECT_DOUBLE_EQ(doctor::cpu_flops_per_cycle(plain, false), 32);
  EXPECT_DOUBLE_EQ(doctor::cpu_flops_per_cycle(plain, true), 0);           // no native bf16
  EXPECT_DOUBLE_EQ(doctor::estimate_cpu_peak_tflops(plain, 4, false), 0);  // clock unknown
  plain.flags.push_back("amx_bf16");
  EXPECT_DOUBLE_EQ(doctor::cpu_flops_per_cycle(plain, true), 1024);
}

TEST(DoctorGpu, ThrottlingHeatAndOtherProcesses) {
  telemetry::GpuSample g;
  g.name = "Test GPU", g.temperature_c = 40, g.power_w = 70, g.utilization_pct = 0;
  g.memory_used_mb = 500, g.memory_total_mb = 81920, g.sm_clock_mhz = 1980,
  g.memory_clock_mhz = 2619;
  auto status = [](telemetry::GpuSample s) { return doctor::check_gpus({s})[0].status; };
  EXPECT_EQ(status(g), Status::kPass);
  const auto c = doctor::check_gpus({g})[0];
  EXPECT_EQ(c.name, "gpu.0");
  EXPECT_THAT(c.value, HasSubstr("Test GPU: 40 C, 70 W, SM 1980 MHz"));
  auto t = g;
  t.throttle_reasons = 0x1;  // idle: not a problem
  EXPECT_EQ(status(t), Status::kPass);
  t.throttle_reasons = 0x4;  // software power cap
  EXPECT_EQ(status(t), Status::kWarn);
  t.throttle_reasons = 0x8;  // hardware slowdown
  EXPECT_EQ(status(t), Status::kFail);
  t.throttle_reasons = 0x40;
  EXPECT_THAT(doctor::check_gpus({t})[0].detail, HasSubstr("hardware thermal"));
  auto hot = g;
  hot.temperature_c = 90;
  EXPECT_EQ(status(hot), Status::kWarn);
  auto busy = g;
  busy.utilization_pct = 87;
  EXPECT_EQ(status(busy), Status::kWarn);
  auto used = g;
  used.memory_used_mb = 10240;
  EXPECT_EQ(status(used), Status::kWarn);
  auto unknown = g;
  unknown.temperature_c = unknown.power_w = unknown.utilization_pct = NAN;
  EXPECT_EQ(status(unknown), Status::kPass);
  EXPECT_THAT(doctor::check_gpus({unknown})[0].value, ::testing::Not(HasSubstr("nan")));
  EXPECT_TRUE(doctor::check_gpus({}).empty());
}

TEST(DoctorGpu, PeakTableMatchesTheModelName) {
  EXPECT_EQ(doctor::gpu_peak("NVIDIA H100 80GB HBM3")->model, "H100 SXM");
  EXPECT_DOUBLE_EQ(doctor::gpu_peak("NVIDIA H100 80GB HBM3")->bf16_tflops, 989);
  EXPECT_EQ(doctor::gpu_peak("NVIDIA H100 PCIe")->model, "H100 PCIe");
  EXPECT_EQ(doctor::gpu_peak("NVIDIA H200")->model, "H200");
  EXPECT_EQ(doctor::gpu_peak("NVIDIA A100-SXM4-40GB")->model, "A100 40GB");
  EXPECT_EQ(doctor::gpu_peak("NVIDIA A10")->model, "A10");
  EXPECT_EQ(doctor::gpu_peak("NVIDIA L40S")->model, "L40S");
  EXPECT_EQ(doctor::gpu_peak("NVIDIA L4")->model, "L4");
  EXPECT_EQ(doctor::gpu_peak("AMD Instinct MI300X")->model, "MI300X");
  EXPECT_FALSE(doctor::gpu_peak("Fake NVML GPU 0").has_value());
}

TEST(DoctorDriver, CudaRuntimeNeedsANewEnoughDriver) {
  EXPECT_EQ(doctor::check_cuda_driver("12.1", "535.104.05").status, Status::kPass);
  EXPECT_EQ(doctor::check_cuda_driver("11.8", "450.80.02").status, Status::kPass);
  const auto old = doctor::check_cuda_driver("12.4", "470.57.02");
  EXPECT_EQ(old.status, Status::kFail);
  EXPECT_THAT(old.detail, HasSubstr("525.60.13"));
  EXPECT_EQ(doctor::check_cuda_driver("13.0", "575.51.03").status, Status::kFail);
  EXPECT_EQ(doctor::check_cuda_driver("", "535.104.05").status, Status::kInfo);
}

// ---- options and report ------------------------------------------------------------------

TEST(DoctorOptions, EveryBadValueNamesItsFlag) {
  auto check = [](void (*mutate)(doctor::DoctorOptions&), const char* flag) {
    doctor::DoctorOptions o;
    mutate(o);
    EXPECT_THAT(test::bad_input_message([&] { o.validate(); }), HasSubstr(flag));
  };
  check([](doctor::DoctorOptions& o) { o.device = "tpu"; }, "--device");
  check([](doctor::DoctorOptions& o) { o.threads = -1; }, "--threads");
  check([](doctor::DoctorOptions& o) { o.matmul_size = -5; }, "--matmul-size");
  check([](doctor::DoctorOptions& o) { o.reps = 5000; }, "--reps");
  check([](doctor::DoctorOptions& o) { o.bandwidth_mib = -1; }, "--bandwidth-mib");
  check([](doctor::DoctorOptions& o) { o.allreduce_mib = NAN; }, "--allreduce-mib");
  check([](doctor::DoctorOptions& o) { o.matmul_warn_fraction = 0; }, "--warn-fraction");
  check([](doctor::DoctorOptions& o) { o.min_free_disk_gib = -1; }, "--min-free-disk-gib");
  check([](doctor::DoctorOptions& o) { o.dist_timeout_s = 0; }, "--dist-timeout");
  check([](doctor::DoctorOptions& o) { o.telemetry_backend = "dcgm"; }, "--gpu-backend");
  EXPECT_NO_THROW(doctor::DoctorOptions().validate());
}

TEST(DoctorReport, ExitCodeTextAndJson) {
  doctor::Report r;
  r.host = "h";
  r.checks.push_back({"a", Status::kPass, "fine", "", {{"x", 1.5}}});
  r.checks.push_back({"b.longer", Status::kWarn, "meh", "do this", {{"nan", NAN}}});
  EXPECT_EQ(r.exit_code(false), 0);
  EXPECT_EQ(r.exit_code(true), 1);  // --strict
  r.checks.push_back({"c", Status::kFail, "broken", "fix it", {}});
  EXPECT_EQ(r.exit_code(false), 1);
  const std::string text = r.to_text();
  EXPECT_THAT(text, HasSubstr("PASS  a         fine\n"));
  EXPECT_THAT(text, HasSubstr("FAIL  c         broken \u2014 fix it\n"));
  EXPECT_THAT(text, HasSubstr("summary: 1 pass, 1 warn, 1 fail, 0 skip, 0 info"));
  const auto j = nlohmann::json::parse(r.to_json(false).dump());
  EXPECT_EQ(j["checks"].size(), 3u);
  EXPECT_EQ(j["checks"][1]["status"], "warn");
  EXPECT_TRUE(j["checks"][1]["metrics"]["nan"].is_null());
  EXPECT_EQ(j["summary"]["fail"], 1);
  EXPECT_EQ(j["summary"]["exit_code"], 1);
}

// ---- a run on this machine -----------------------------------------------------------------

doctor::DoctorOptions quick() {
  doctor::DoctorOptions o;
  o.quick = true;
  o.min_free_disk_gib = 0;  // the test machine's disk is not the subject
  return o;
}

TEST(DoctorRun, QuickRunOnThisMachine) {
  const auto report = doctor::run_doctor(quick(), env_of({}));
  const std::string text = report.to_text();
  auto get = [&](const std::string& name) {
    const Check* c = report.find(name);
    EXPECT_NE(c, nullptr) << name << " missing in\n" << text;
    return c != nullptr ? *c : Check{};
  };
  EXPECT_EQ(get("torch").status, Status::kPass) << text;
  EXPECT_THAT(get("torch").value, HasSubstr(std::string("LibTorch ") + TORCH_VERSION));
  if (!torch::cuda::is_available()) EXPECT_THAT(get("torch").value, HasSubstr("CPU build"));
  EXPECT_EQ(get("blas").status, Status::kPass) << text;
  EXPECT_EQ(get("threads").status, Status::kPass) << text;
  EXPECT_EQ(get("env.variables").status, Status::kPass);
  EXPECT_EQ(get("dist.env").status, Status::kInfo);
  EXPECT_GT(get("bench.matmul_fp32").metrics["tflops"], 0) << text;
  EXPECT_THAT(get("bench.matmul_fp32").status,
              ::testing::AnyOf(Status::kPass, Status::kWarn, Status::kInfo));
  EXPECT_GT(get("bench.memory_bandwidth").metrics["gbps"], 0) << text;
  EXPECT_EQ(get("bench.allreduce").status, Status::kSkip);
  EXPECT_EQ(report.count(Status::kFail), 0) << text;
  EXPECT_EQ(report.exit_code(false), 0);
}

TEST(DoctorRun, BadEnvironmentFails) {
  auto o = quick();
  o.benchmarks = false;
  const auto report = doctor::run_doctor(
      o, env_of({{"HIP_LAUNCH_BLOCKING", "1"}, {"NCCL_SOCKET_IFNAME", "nosuchif0"}}));
  ASSERT_NE(report.find("env.HIP_LAUNCH_BLOCKING"), nullptr);
  EXPECT_EQ(report.find("env.HIP_LAUNCH_BLOCKING")->status, Status::kFail);
  EXPECT_EQ(report.find("env.NCCL_SOCKET_IFNAME")->status, Status::kFail);
  EXPECT_EQ(report.find("bench")->status, Status::kSkip);
  EXPECT_EQ(report.exit_code(false), 1);
}

TEST(DoctorRun, InvalidLauncherEnvironmentFails) {
  auto o = quick();
  o.benchmarks = false;
  const auto report = doctor::run_doctor(o, env_of({{"RANK", "3"}, {"WORLD_SIZE", "2"}}));
  const Check* c = report.find("dist.env");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, Status::kFail);
  EXPECT_THAT(c->detail, HasSubstr("RANK"));
  EXPECT_EQ(report.find("dist.rendezvous"), nullptr);  // no attempt to meet
  EXPECT_EQ(report.exit_code(false), 1);
}

// ---- the CLI ---------------------------------------------------------------------------

// Runs `env VARS gradguard ARGS` in a temp dir; stdout only, or stdout and stderr merged.
test::CliResult doctor_cli(const std::string& vars, const std::string& args,
                           bool with_stderr = true) {
  static test::TempDir dir;
  const std::string cmd = "cd '" + dir.path() + "' && env " + vars + " '" GRADGUARD_CLI_PATH "' " +
                          args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  test::CliResult result;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed");
  std::array<char, 4096> buf{};
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), pipe)) > 0;)
    result.output.append(buf.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// ---- memory.plan: a configured run against the device's memory ------------------------

plan::PlanInputs small_run() {
  plan::PlanInputs in;
  in.model.vocab_size = 96, in.model.hidden_size = 32, in.model.intermediate_size = 80;
  in.model.num_layers = 3, in.model.num_heads = 4, in.model.num_kv_heads = 2, in.model.max_seq_len = 64;
  in.seq_len = 64, in.micro_batch = 8, in.global_batch = 8;
  in.for_this_cpu();
  return in;
}

TEST(DoctorMemoryPlan, PassBelowNinetyPercentWarnUpToAllOfIt) {
  const auto in = small_run();
  const double need = plan::estimate(in).total;
  const auto pass = doctor::check_memory_plan(in, need / 0.5, "this CPU's available memory");
  EXPECT_EQ(pass.status, Status::kPass);
  EXPECT_THAT(pass.value, HasSubstr("(50%)"));
  EXPECT_DOUBLE_EQ(pass.metrics.at("estimate_bytes"), need);
  const auto warn = doctor::check_memory_plan(in, need / 0.95, "gpu.0");
  EXPECT_EQ(warn.status, Status::kWarn);
  EXPECT_THAT(warn.detail, HasSubstr("headroom in gpu.0"));
  EXPECT_EQ(doctor::check_memory_plan(in, need * 0.999, "gpu.0").status, Status::kFail);
}

TEST(DoctorMemoryPlan, TooSmallNamesTheMicroBatchThatFits) {
  auto in = small_run();
  auto one = in;
  one.micro_batch = 1;
  const double need_one = plan::estimate(one).total;
  ASSERT_LT(need_one, plan::estimate(in).total);
  const auto c = doctor::check_memory_plan(in, need_one * 1.001, "gpu.1");
  EXPECT_EQ(c.status, Status::kFail);
  // micro-batch 1 without checkpointing is the first the search meets that fits
  EXPECT_THAT(c.detail, HasSubstr("gpu.1: too small for micro-batch 8; micro-batch 1 x accumulation 8 fits"));
}

TEST(DoctorMemoryPlan, NoMicroBatchFitsNamesTheFirstLayoutThatDoes) {
  // Llama-2-7B on 2 x 32 GB with fp32 weights (the golden report in tests/golden/plan/
  // shows offload with checkpointing and LoRA fitting there, offload listed first).
  plan::PlanInputs in;
  in.model.vocab_size = 32000, in.model.hidden_size = 4096, in.model.intermediate_size = 11008;
  in.model.num_layers = 32, in.model.num_heads = 32, in.model.num_kv_heads = 32, in.model.max_seq_len = 4096;
  in.ranks = 2, in.seq_len = 2048, in.micro_batch = 1, in.global_batch = 4096;
  const auto c = doctor::check_memory_plan(in, 32e9, "gpu.0");
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_THAT(c.detail, HasSubstr("no micro-batch fits in gpu.0; the first layout that does: bf16 + fp32 masters, ZeRO-1, offload"));
}

TEST(DoctorMemoryPlan, BudgetIsTheCpusShareOrTheSmallestBoard) {
  Check mem;
  mem.name = "memory";
  mem.metrics["available_gib"] = 16;
  Check g0, g1;
  g0.name = "gpu.0", g0.metrics["memory_total_mib"] = 81920;
  g1.name = "gpu.1", g1.metrics["memory_total_mib"] = 65536;
  const std::vector<Check> checks{mem, g0, g1};
  auto [cpu, cpu_where] = doctor::memory_budget("cpu", checks, 2);
  EXPECT_DOUBLE_EQ(cpu, 8.0 * 1073741824.0);
  EXPECT_THAT(cpu_where, HasSubstr("per rank"));
  auto [gpu, gpu_where] = doctor::memory_budget("cuda:0", checks, 2);
  EXPECT_DOUBLE_EQ(gpu, 65536.0 * 1048576.0);
  EXPECT_EQ(gpu_where, "gpu.1");
  EXPECT_TRUE(std::isnan(doctor::memory_budget("cuda:0", {mem}, 1).first));  // no board reported
  EXPECT_TRUE(std::isnan(doctor::memory_budget("", checks, 1).first));       // no usable device
}

TEST(DoctorCli, ChecklistOnThisMachine) {
  const auto r = doctor_cli("", "doctor --quick --min-free-disk-gib 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("PASS  torch"));
  EXPECT_THAT(r.output, HasSubstr("bench.matmul_fp32"));
  EXPECT_THAT(r.output, HasSubstr("SKIP  bench.allreduce"));
  EXPECT_THAT(r.output, HasSubstr("summary: "));
}

TEST(DoctorCli, LaunchBlockingFailsWithExitOne) {
  const auto r = doctor_cli("HIP_LAUNCH_BLOCKING=1", "doctor --no-bench");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("FAIL  env.HIP_LAUNCH_BLOCKING"));
}

TEST(DoctorCli, MissingSocketInterfaceFails) {
  const auto r = doctor_cli("NCCL_SOCKET_IFNAME=nosuchif0", "doctor --no-bench");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("FAIL  env.NCCL_SOCKET_IFNAME"));
}

TEST(DoctorCli, StrictFailsOnWarnings) {
  EXPECT_EQ(doctor_cli("NCCL_DEBUG=INFO", "doctor --no-bench --min-free-disk-gib 0").exit_code, 0);
  EXPECT_EQ(doctor_cli("NCCL_DEBUG=INFO", "doctor --no-bench --strict").exit_code, 1);
}

TEST(DoctorCli, JsonIsOneObjectOnStdout) {
  const auto r = doctor_cli("OMP_NUM_THREADS=nope", "doctor --quick --json", /*with_stderr=*/false);
  EXPECT_EQ(r.exit_code, 1);
  const auto j = nlohmann::json::parse(r.output);  // progress went to stderr
  EXPECT_EQ(j["summary"]["exit_code"], 1);
  bool found = false;
  for (const auto& c : j["checks"]) {
    if (c["name"] == "env.OMP_NUM_THREADS") found = c["status"] == "fail";
    if (c["name"] == "bench.matmul_fp32") EXPECT_GT(c["metrics"]["tflops"].get<double>(), 0);
  }
  EXPECT_TRUE(found) << r.output;
}

TEST(DoctorCli, GpuStateFromTelemetry) {
  // The fake NVML: two GPUs at 87% utilization, 10 of 80 GiB used, software power cap.
  const auto r = doctor_cli("GRADGUARD_NVML_LIBRARY='" GRADGUARD_FAKE_NVML_PATH "'",
                            "doctor --no-bench --json --gpu-backend nvml", false);
  const auto j = nlohmann::json::parse(r.output);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& c : j["checks"]) by_name[c["name"]] = c;
  ASSERT_TRUE(by_name.count("gpu.0")) << r.output;
  EXPECT_EQ(by_name["gpu.0"]["status"], "warn");
  EXPECT_THAT(by_name["gpu.0"]["value"].get<std::string>(), HasSubstr("Fake NVML GPU 0"));
  EXPECT_THAT(by_name["gpu.0"]["detail"].get<std::string>(), HasSubstr("power cap"));
  EXPECT_TRUE(by_name.count("gpu.1"));
  if (!torch::cuda::is_available())
    EXPECT_EQ(by_name["torch.device"]["status"], "warn");  // GPUs, CPU build
}

TEST(DoctorCli, MemoryPlanOfAConfiguredRun) {
  // The built-in default fits this machine's memory; a 200-layer, 4096-wide model does not.
  auto by_name = [](const std::string& out) {
    std::map<std::string, nlohmann::json> m;
    const auto j = nlohmann::json::parse(out);
    for (const auto& c : j["checks"]) m[c["name"]] = c;
    return m;
  };
  auto ok = by_name(doctor_cli("", "doctor --no-bench --json --device cpu --set run.seed=3", false).output);
  ASSERT_TRUE(ok.count("memory.plan"));
  EXPECT_EQ(ok["memory.plan"]["status"], "pass") << ok["memory.plan"];
  EXPECT_THAT(ok["memory.plan"]["value"].get<std::string>(), HasSubstr("in this CPU's available memory"));
  const auto big = doctor_cli("", "doctor --no-bench --json --device cpu --set model.num_layers=200 "
                                  "--set model.hidden_size=4096 --set model.intermediate_size=11008 "
                                  "--set model.num_heads=32 --set model.num_kv_heads=32", false);
  auto m = by_name(big.output);
  EXPECT_EQ(m["memory.plan"]["status"], "fail") << big.output;
  EXPECT_EQ(big.exit_code, 1);
  // A bad configuration is the user's input error: exit 2, naming the key.
  const auto bad = doctor_cli("", "doctor --no-bench --set model.num_layers=zero");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("model.num_layers"));
  const auto missing = doctor_cli("", "doctor --no-bench --config /nonexistent/run.yaml");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("/nonexistent/run.yaml"));
}

TEST(DoctorCli, BadOptionIsExitTwo) {
  const auto r = doctor_cli("", "doctor --reps -1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--reps"));
}

TEST(DoctorCli, TwoRanksMeasureAllReduce) {
  const auto r =
      doctor_cli("", "launch --nproc 2 -- doctor --quick --json --min-free-disk-gib 0", false);
  const auto j = nlohmann::json::parse(r.output);  // only rank 0 prints
  EXPECT_EQ(j["world_size"], 2);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& c : j["checks"]) by_name[c["name"]] = c;
  EXPECT_EQ(by_name["dist.rendezvous"]["status"], "pass") << r.output;
  EXPECT_EQ(by_name["bench.allreduce"]["status"], "info") << r.output;
  EXPECT_GT(by_name["bench.allreduce"]["metrics"]["busbw_gbps"].get<double>(), 0);
  EXPECT_TRUE(by_name.count("ranks.matmul_fp32")) << r.output;  // rank 1's result reached rank 0
  EXPECT_EQ(r.exit_code, j["summary"]["exit_code"].get<int>());
}

}  // namespace
}  // namespace gradguard
