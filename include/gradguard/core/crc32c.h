// CRC-32C (Castagnoli), the checksum of checkpoint manifests and of TFRecord framing.
// Table-driven, byte at a time: checkpoints are checksummed once per save, so a few
// hundred MB/s is plenty, and the code stays portable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradguard {

// CRC-32C of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// CRC-32C of a whole file, streamed. Throws gradguard::Error (bad input) naming the path
// when it cannot be read.
uint32_t crc32c_file(const std::string& path, uint64_t* size = nullptr);

}  // namespace gradguard
