// posix_spawn + wait4: the child's resource usage arrives with its exit status, so no
// polling thread and no /proc sampling are needed to know its peak memory.
#include "gradguard/apps/child_process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"

extern char** environ;

namespace gradguard::seed {
namespace {

void flatten(const YAML::Node& node, const std::string& prefix, std::vector<std::string>* out) {
  if (node.IsMap()) {
    for (const auto& kv : node) flatten(kv.second, prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar(), out);
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  out->push_back(prefix + "=" + e.c_str());
}

}  // namespace

ChildResult run_child(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const auto start = std::chrono::steady_clock::now();
  const int rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw runtime_error(args[0], std::string("cannot start: ") + std::strerror(rc));
  int status = 0;
  struct rusage usage {};
  if (wait4(pid, &status, 0, &usage) != pid) throw runtime_error(args[0], "wait4 failed");
  ChildResult c;
  c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.cpu_s = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 1e-6;
  c.peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  return c;
}

std::string tail_of(const std::string& path, size_t lines) {
  if (!fs::exists(path)) return "";
  std::istringstream in(fs::read_file(path));
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "  " + all[i] + "\n";
  return out;
}

std::vector<std::string> yaml_overrides(const std::string& path) {
  std::vector<std::string> out;
  try {
    flatten(YAML::LoadFile(path), "", &out);
  } catch (const YAML::Exception& e) {
    throw bad_input(path, std::string("not valid YAML: ") + e.what());
  }
  return out;
}

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

}  // namespace gradguard::seed
