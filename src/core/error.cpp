// Formats gradguard::Error messages as "<where>: <what>" so every user-facing error
// names its file or key first.
#include "gradguard/core/error.h"

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

Error bad_input(const std::string& where, const std::string& what) {
  return Error(ErrorKind::kBadInput, where, what);
}

Error runtime_error(const std::string& where, const std::string& what) {
  return Error(ErrorKind::kRuntime, where, what);
}

}  // namespace gradguard
