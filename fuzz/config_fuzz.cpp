// Fuzzes gradguard::config::load_config, the one place YAML becomes typed options: the
// bytes are written to a per-process temporary file (created once, rewritten for every
// input) and loaded with no overrides. gradguard::Error (unknown key, wrong type, invalid
// YAML, a value out of range) is the expected outcome; any other exception escaping
// (a raw YAML::Exception, std::out_of_range, ...), a crash or an ASan/UBSan report is a
// bug, because `main` would turn it into exit code 1 and a message without the key.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gradguard/config/config.h"
#include "gradguard/core/error.h"

#include "scratch_file.h"

namespace {

const std::string& scratch() { return gradguard::fuzz::scratch_path("gradguard_config_fuzz_", ".yaml"); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gradguard::fuzz::write_scratch(scratch(), data, size);
  try {
    gradguard::config::Config c = gradguard::config::load_config(scratch(), {});
    // An accepted config must print as YAML (what every run directory stores).
    volatile size_t sink = gradguard::config::to_yaml(c).size();
    (void)sink;
  } catch (const gradguard::Error&) {
    // Rejected with a message naming the key: the intended outcome for bad input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "non-gradguard exception escaped load_config: %s\n", e.what());
    std::abort();
  }
  return 0;
}
