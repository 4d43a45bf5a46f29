// gradguard::Error is the one exception type users see. It carries a kind that the CLI
// maps to an exit code (docs/design.md: 2 bad input, 3 halted by the guard, 1 anything
// else; 4, a run stopped by SIGTERM/SIGINT after its checkpoint, is a result, not an
// Error: core/stop_signals.h), and, for bad input, where the problem is (a file, a
// config key) so the message can name it. Broken internal invariants are not Errors:
// they assert.
#pragma once

#include <stdexcept>
#include <string>

namespace gradguard {

enum class ErrorKind {
  kBadInput,  // config, data or checkpoint the user supplied is wrong: exit 2
  kHalted,    // the guard stopped training (unrecoverable divergence): exit 3
  kRuntime,   // anything else (I/O failure, out of memory, ...): exit 1
};

class Error : public std::runtime_error {
 public:
  // `where` names the file or config key (may be empty); `what` says what is wrong and,
  // where it helps, what would be valid.
  Error(ErrorKind kind, std::string where, const std::string& what);

  ErrorKind kind() const { return kind_; }
  const std::string& where() const { return where_; }
  // Process exit code for this kind: 2, 3 or 1.
  int exit_code() const;

 private:
  ErrorKind kind_;
  std::string where_;
};

// A number as it should appear in a message ("0.001", "1e-08"): shortest form that
// reads back as the same double.
std::string format_number(double value);

// Shorthands for the common kinds.
Error bad_input(const std::string& where, const std::string& what);
Error runtime_error(const std::string& where, const std::string& what);

}  // namespace gradguard
