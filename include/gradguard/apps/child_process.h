// Running `gradguard train` as a child process, for the commands that compare runs
// (`bench seed`, `tune`): each child's peak RSS and CPU time come from the kernel's
// accounting of that process alone (wait4), and its output goes to a log file whose
// tail is quoted when it fails.
#pragma once

#include <string>
#include <vector>

namespace gradguard::seed {

struct ChildResult {
  int exit_code = -1;     // 128 + signal when killed
  double wall_s = 0;      // seconds from spawn to exit
  double cpu_s = 0;       // user + system CPU seconds
  double peak_rss_mb = 0; // peak resident set (MiB)
};

// Runs args[0] with args (no shell), stdout and stderr into `log` (truncated). Blocks
// until it exits. Throws gradguard::Error (runtime) naming args[0] when it cannot start.
ChildResult run_child(const std::vector<std::string>& args, const std::string& log);

// The last `lines` lines of a text file, each indented by two spaces ("" if missing).
std::string tail_of(const std::string& path, size_t lines);

// A YAML file as `key.path=value` overrides ("a: {b: 1}" -> "a.b=1"; lists stay YAML flow
// sequences). Throws gradguard::Error (bad input) naming the file when it is not YAML.
std::vector<std::string> yaml_overrides(const std::string& path);

// This process's executable (/proc/self/exe).
std::string self_executable();

}  // namespace gradguard::seed
