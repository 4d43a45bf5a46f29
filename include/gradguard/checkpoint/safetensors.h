// safetensors reader and writer (the format Hugging Face checkpoints use): an 8-byte
// little-endian header length N, N bytes of JSON mapping each tensor name to its dtype,
// shape and [begin, end) byte offsets into the data section, then the data section.
// Tensors are stored little-endian and contiguous. gradguard writes model checkpoints
// with Hugging Face Llama names so they load in the Python ecosystem, and reads HF
// checkpoints for `model.init_from`.
//
// The reader validates everything before it trusts it: the header length against the
// file size and a 100 MB cap, the JSON, every dtype, shape and offset pair (in bounds,
// byte length = numel * element size, no overlaps), so a truncated, corrupted or
// hostile file is rejected with a message instead of being read out of bounds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

namespace gradguard::checkpoint {

constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One tensor's record in a validated header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // safetensors dtype string: "F32", "BF16", ...
  int64_t element_size = 0;     // bytes per element of `dtype`
  std::vector<int64_t> shape;   // [dim] non-negative sizes; empty for a scalar
  uint64_t begin = 0;           // byte offsets [begin, end) into the data section;
  uint64_t end = 0;             // end - begin == numel * element_size
};

// A validated header: what load_safetensors needs to copy the tensors out of the file.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;        // sorted by name (JSON object order)
  std::map<std::string, std::string> metadata;  // the "__metadata__" object
  uint64_t data_start = 0;  // byte offset of the data section in the file (8 + header length)
};

struct SafetensorsContents {
  std::map<std::string, at::Tensor> tensors;        // CPU tensors owning their memory
  std::map<std::string, std::string> metadata;      // the "__metadata__" object
};

// Writes `tensors` (any device, any supported dtype; copied to contiguous CPU) to `path`
// atomically (temporary file, fsync, rename). Names must be unique and non-empty.
// Throws gradguard::Error naming the path when the file cannot be written.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Validates the `size` bytes of a whole safetensors file at `data` (the length prefix,
// the 100 MB header cap, the JSON, every entry's dtype, shape and offsets, no overlaps)
// without touching LibTorch or the file system; `path` is only used in messages. Throws
// gradguard::Error (bad input) naming `path` and what is wrong; the returned offsets are
// then safe to read within [data + data_start, data + size).
SafetensorsHeader parse_safetensors_header(const std::string& path, const char* data, size_t size);

// Reads and validates a whole file (parse_safetensors_header, then a copy per tensor). Throws gradguard::Error (bad input) naming the path
// and what is wrong with it.
SafetensorsContents load_safetensors(const std::string& path);

// safetensors dtype string ("F32", "BF16", ...) for a torch dtype; throws for dtypes the
// format cannot hold.
std::string safetensors_dtype(at::ScalarType dtype);

}  // namespace gradguard::checkpoint
