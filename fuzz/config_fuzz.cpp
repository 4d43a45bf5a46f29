// Fuzzes gradguard::config::load_config, the one place YAML becomes typed options: the
// bytes are written to a per-process temporary file (created once, rewritten for every
// input) and loaded with no overrides. gradguard::Error (unknown key, wrong type, invalid
// YAML, a value out of range) is the expected outcome; any other exception escaping
// (a raw YAML::Exception, std::out_of_range, ...), a crash or an ASan/UBSan report is a
// bug, because `main` would turn it into exit code 1 and a message without the key.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gradguard/config/config.h"
#include "gradguard/core/error.h"

namespace {

// Path of this process's scratch file; created on first use, removed at exit.
const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/gradguard_config_fuzz_XXXXXX.yaml";
    const int fd = ::mkstemps(p.data(), 5);
    if (fd < 0) {
      std::perror("mkstemps");
      std::abort();
    }
    ::close(fd);
    static std::string to_remove = p;
    std::atexit([] { ::unlink(to_remove.c_str()); });
    return p;
  }();
  return path;
}

void write_scratch(const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(scratch_path().c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror("writing the fuzz input");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_scratch(data, size);
  try {
    gradguard::config::Config c = gradguard::config::load_config(scratch_path(), {});
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
