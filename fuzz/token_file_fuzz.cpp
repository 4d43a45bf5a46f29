// Fuzzes gradguard::data::TokenFile, the memory-mapped reader of llm.c token files: the
// bytes are written to a per-process temporary file (created once, rewritten for every
// input) and opened with vocab_size 256, as byte-level training data is. gradguard::Error
// (bad magic or version, a token count that disagrees with the file size, a token
// outside the vocabulary) is the expected outcome. When the file is accepted every token
// is read through data(), so a count that lets reads run past the mapping crashes, and a
// token >= 256 surviving validation aborts; other exceptions, crashes and ASan/UBSan
// reports are bugs. The target needs no LibTorch.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gradguard/core/error.h"
#include "gradguard/data/token_file.h"

namespace {

constexpr int64_t kVocab = 256;

// Path of this process's scratch file; created on first use, removed at exit.
const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/gradguard_token_fuzz_XXXXXX.bin";
    const int fd = ::mkstemps(p.data(), 4);
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
    gradguard::data::TokenFile file(scratch_path(), kVocab);
    const int64_t expected_bytes = gradguard::data::kTokenFileHeaderBytes + 2 * file.size();
    if (file.size() < 0 || static_cast<uint64_t>(expected_bytes) != size) std::abort();
    uint64_t sum = 0;
    for (int64_t i = 0; i < file.size(); ++i) {
      if (file.data()[i] >= kVocab) std::abort();  // validation let a bad token through
      sum += file.data()[i];
    }
    volatile uint64_t sink = sum;
    (void)sink;
  } catch (const gradguard::Error&) {
    // Rejected with a message naming the file: the intended outcome for bad input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "non-gradguard exception escaped TokenFile: %s\n", e.what());
    std::abort();
  }
  return 0;
}
