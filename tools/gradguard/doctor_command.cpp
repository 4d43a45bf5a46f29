// `gradguard doctor [--json] [--quick] [--strict] ...` checks this machine before a long
// run (doctor/doctor.h) and prints a checklist, or with --json one JSON object, on stdout;
// progress of the slow steps goes to stderr. Exit code: 1 when any check failed (with
// --strict also when one warned), else 0; 2 for invalid options. Under a launcher only
// local rank 0 prints its report; another rank that failed says so on stderr.
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "gradguard/apps/doctor.h"

namespace gradguard::cli {

void add_doctor_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("doctor",
                                 "Check this machine before a long run (pass/warn/fail checklist)");
  auto o = std::make_shared<doctor::DoctorOptions>();
  struct Flags {
    bool json = false, strict = false, quiet = false, no_bench = false;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_flag("--json", f->json, "Print one JSON object instead of the checklist");
  cmd->add_flag("--quick", o->quick, "Short benchmarks (about a second in all)");
  cmd->add_flag("--strict", f->strict, "Exit 1 on warnings too");
  cmd->add_flag("--no-bench", f->no_bench, "Skip the matmul, bandwidth and all-reduce benchmarks");
  cmd->add_flag("-q,--quiet", f->quiet, "No progress lines on stderr");
  cmd->add_option("--device", o->device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_option("-c,--config", o->config_path,
                  "A run's configuration: check its memory plan (gradguard plan) against this device");
  cmd->add_option("-s,--set", o->overrides, "Override of that configuration: key.path=value; repeatable");
  cmd->add_option("--threads", o->threads,
                  "Intra-op threads as run.threads (0 = CPUs / ranks on this node)")
      ->capture_default_str();
  cmd->add_option("--matmul-size", o->matmul_size,
                  "n of the n x n matmuls (0 = CPU 2048, GPU 8192; quick 256 / 2048)")
      ->capture_default_str();
  cmd->add_option("--reps", o->reps,
                  "Timed repetitions per benchmark, median reported (0 = 5, quick 3)")
      ->capture_default_str();
  cmd->add_option("--bandwidth-mib", o->bandwidth_mib,
                  "Memory-bandwidth copy size, MiB (0 = 256, quick 16)")
      ->capture_default_str();
  cmd->add_option("--allreduce-mib", o->allreduce_mib,
                  "All-reduce message size, MiB (0 = 64, quick 4)")
      ->capture_default_str();
  cmd->add_option("--warn-fraction", o->matmul_warn_fraction,
                  "Warn when matmul TFLOP/s < this x peak")
      ->capture_default_str();
  cmd->add_option("--min-free-disk-gib", o->min_free_disk_gib,
                  "Warn below this free space in the current dir")
      ->capture_default_str();
  cmd->add_option("--dist-timeout", o->dist_timeout_s,
                  "Rendezvous / collective timeout with several ranks, s")
      ->capture_default_str();
  cmd->add_option("--gpu-backend", o->telemetry_backend,
                  "GPU state from: auto | nvml | rocm_smi | none")
      ->capture_default_str();
  cmd->callback([&action, o, f] {
    action = [o, f] {
      o->benchmarks = !f->no_bench;
      const auto report = doctor::run_doctor(*o, dist::process_env, f->quiet ? nullptr : stderr);
      const int code = report.exit_code(f->strict);
      if (report.local_rank == 0) {
        if (f->json)
          std::cout << report.to_json(f->strict).dump(2) << std::endl;
        else
          std::cout << report.to_text() << std::flush;
      } else if (report.count(doctor::Status::kFail) > 0) {
        std::fprintf(stderr,
                     "doctor [rank %lld]: %lld check(s) failed (listed in rank 0's report)\n",
                     (long long)report.rank, (long long)report.count(doctor::Status::kFail));
      }
      return code;
    };
  });
}

}  // namespace gradguard::cli
