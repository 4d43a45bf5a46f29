// Formats gradguard::Error messages as "<where>: <what>" so every user-facing error
// names its file or key first.
#include "gradguard/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace gradguard {
namespace {
std::string format(const std::string& where, const std::string& what) {
  return where.empty() ? what : where + ": " + what;
}
}  // namespace

Error::Error(ErrorKind kind, std::string where, const std::string& what)
    : std::runtime_error(format(where, what)), kind_(kind), where_(std::move(where)) {}

int Error::exit_code() const {
  switch (kind_) {
    case ErrorKind::kBadInput:
      return 2;
    case ErrorKind::kHalted:
      return 3;
    case ErrorKind::kRuntime:
      return 1;
  }
  return 1;
}

std::string format_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  for (int precision = 1; precision <= 17; ++precision) {
    char shorter[32];
    std::snprintf(shorter, sizeof shorter, "%.*g", precision, value);
    if (std::strtod(shorter, nullptr) == value) return shorter;
  }
  return buf;
}

Error bad_input(const std::string& where, const std::string& what) {
  return Error(ErrorKind::kBadInput, where, what);
}

Error runtime_error(const std::string& where, const std::string& what) {
  return Error(ErrorKind::kRuntime, where, what);
}

}  // namespace gradguard
