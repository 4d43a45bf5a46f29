// Fuzzes gradguard::data::TokenFile, the memory-mapped reader of llm.c token files: the
// bytes are written to a per-process temporary file (created once, rewritten for every
// input) and opened with vocab_size 256, as byte-level training data is. gradguard::Error
// (bad magic or version, a token count that disagrees with the file size, a token
// outside the vocabulary) is the expected outcome. When the file is accepted every token
// is read through token() (2- or 4-byte tokens: versions 1 and 2), so a count that lets
// reads run past the mapping crashes, and a
// token >= 256 surviving validation aborts; other exceptions, crashes and ASan/UBSan
// reports are bugs. The target needs no LibTorch.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gradguard/core/error.h"
#include "gradguard/data/token_file.h"

#include "scratch_file.h"

namespace {

constexpr int64_t kVocab = 256;

const std::string& scratch() { return gradguard::fuzz::scratch_path("gradguard_token_fuzz_", ".bin"); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gradguard::fuzz::write_scratch(scratch(), data, size);
  try {
    gradguard::data::TokenFile file(scratch(), kVocab);
    // Tokens, then (with flags) one flag byte per token.
    const int64_t expected_bytes =
        gradguard::data::kTokenFileHeaderBytes + (file.width() + (file.has_flags() ? 1 : 0)) * file.size();
    if (file.size() < 0 || static_cast<uint64_t>(expected_bytes) != size) std::abort();
    if (file.has_flags()) {
      if (file.size() > 0 && (file.flags()[0] & gradguard::data::kTokenSampleStart) == 0) std::abort();
      for (int64_t i = 0; i < file.size(); ++i)
        if ((file.flags()[i] & ~(gradguard::data::kTokenTrained | gradguard::data::kTokenSampleStart)) != 0) std::abort();
    }
    uint64_t sum = 0;
    for (int64_t i = 0; i < file.size(); ++i) {
      if (file.token(i) >= kVocab) std::abort();  // validation let a bad token through
      sum += file.token(i);
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
