// Reflected CRC-32C, polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF.
#include "gradguard/core/crc32c.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "gradguard/core/error.h"

namespace gradguard {
namespace {
std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t crc32c_file(const std::string& path, uint64_t* size) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw bad_input(path, std::string("cannot open: ") + std::strerror(errno));
  std::array<char, 1 << 16> buf;
  uint32_t crc = 0;
  uint64_t total = 0;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    crc = crc32c(buf.data(), n, crc);
    total += n;
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw bad_input(path, "read failed");
  if (size != nullptr) *size = total;
  return crc;
}

}  // namespace gradguard
