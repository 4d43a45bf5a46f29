// Helpers shared by the tests: temporary directories, running the CLI, golden files.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"

namespace gradguard::test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs the built `gradguard` executable with `args` (a shell-quoted string) in `cwd`.
CliResult run_cli(const std::string& args, const std::string& cwd = ".");

// Absolute path of a file in the source tree, e.g. source_path("tests/golden/x.json").
std::string source_path(const std::string& relative);

std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
// Every line of a JSON-lines file (metrics.jsonl), parsed.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// Runs `fn`, expects a bad-input gradguard::Error (exit code 2) and returns its message.
template <typename F>
std::string bad_input_message(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected gradguard::Error (bad input)";
  return "";
}

}  // namespace gradguard::test
