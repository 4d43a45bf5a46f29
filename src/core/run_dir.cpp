// RunDir: paths and the two whole-directory operations a fresh run needs.
#include "gradguard/core/run_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace gradguard {
namespace stdfs = std::filesystem;

std::string RunDir::checkpoint(int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "step-%07lld", static_cast<long long>(step));
  return checkpoints() + "/" + name;
}

std::vector<std::string> RunDir::event_files() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(root_, ec))
    if (e.path().filename().string().rfind(kEventsPrefix, 0) == 0) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool RunDir::holds_run() const {
  std::error_code ec;
  return stdfs::exists(metrics(), ec) || stdfs::exists(config(), ec);
}

void RunDir::clear_outputs() const {
  stdfs::remove(metrics());
  stdfs::remove_all(checkpoints());
  stdfs::remove_all(snapshots());
  for (const auto& f : {report(), steps_csv(), telemetry_csv()}) stdfs::remove(f);
  std::error_code ec;
  for (const auto& f : event_files()) stdfs::remove(f, ec);
}

}  // namespace gradguard
