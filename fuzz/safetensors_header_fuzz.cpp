// Fuzzes gradguard::checkpoint::parse_safetensors_header, the validation every
// safetensors file (our checkpoints, Hugging Face `model.init_from` directories) goes
// through before a single tensor byte is trusted. The input is the whole file: 8-byte
// length, JSON header, data section. Rejecting it with gradguard::Error is the expected
// outcome for almost every input; anything else (a crash, an ASan/UBSan report, another
// exception type) is a bug. When the header is accepted, every entry's byte range is
// read back, so an offset the parser let through out of bounds shows up as an ASan
// report instead of silently passing.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradguard::checkpoint;
  // A heap copy of exactly `size` bytes, so reading past the end trips ASan.
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const SafetensorsHeader h =
        parse_safetensors_header("fuzz.safetensors", bytes.data(), bytes.size());
    unsigned sum = 0;
    for (const auto& e : h.entries) {
      if (e.begin > e.end || h.data_start + e.end > bytes.size() || e.element_size <= 0)
        std::abort();
      for (uint64_t i = e.begin; i < e.end; ++i)
        sum += static_cast<unsigned char>(bytes[h.data_start + i]);
    }
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const gradguard::Error&) {
    // Rejected with a message: the intended outcome for bad input.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "non-gradguard exception escaped parse_safetensors_header: %s\n",
                 e.what());
    std::abort();
  }
  return 0;
}
