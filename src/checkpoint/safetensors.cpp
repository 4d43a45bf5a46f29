// safetensors I/O. Writing builds the JSON header from the tensors in the order given,
// pads it with spaces to a multiple of 8 bytes (so the data section is aligned), and
// writes through a temporary file that is renamed into place only once complete.
// Reading is split in two: parse_safetensors_header validates the 8-byte length and the
// JSON header completely using only the standard library and nlohmann::json (so it can be
// fuzzed and tested without LibTorch), then load_safetensors copies each validated byte
// range into memory a freshly allocated tensor owns.
#include "gradguard/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include <torch/torch.h>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/fs.h"

namespace gradguard::checkpoint {
namespace {

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  int64_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4},  {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2}, {"I64", at::kLong, 8}, {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},  {"I8", at::kChar, 1},    {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
};

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string valid_dtype_names() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

}  // namespace

std::string safetensors_dtype(at::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.type == dtype) return d.name;
  throw bad_input("", std::string("dtype ") + c10::toString(dtype) +
                          " cannot be stored in safetensors");
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;  // [i] contiguous CPU copy of tensors[i]
  cpu.reserve(tensors.size());
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__" || !seen.insert(name).second)
      throw bad_input(path, "tensor name '" + name + "' is empty, reserved or repeated");
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(t));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');

  fs::AtomicFile out(path);
  uint64_t n = json.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(len, 8);
  out.write(json.data(), json.size());
  for (const auto& t : cpu) out.write(t.data_ptr(), t.numel() * t.element_size());
  out.commit();
}

SafetensorsHeader parse_safetensors_header(const std::string& path, const char* data, size_t size) {
  if (size < 8)
    throw bad_input(path, "truncated safetensors file: " + std::to_string(size) +
                              " bytes, the header length alone needs 8");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i)
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(data[i])) << (8 * i);
  if (header_len > kSafetensorsMaxHeaderBytes)
    throw bad_input(path, "safetensors header length " + std::to_string(header_len) +
                              " exceeds the 100 MB limit (corrupt or hostile file)");
  if (header_len > size - 8)
    throw bad_input(path, "safetensors header length " + std::to_string(header_len) +
                              " runs past the end of the file (" + std::to_string(size) +
                              " bytes): truncated?");
  JsonLimits limits;
  limits.max_bytes = kSafetensorsMaxHeaderBytes;
  limits.max_depth = 8;  // {name: {dtype, shape: [..], data_offsets: [..]}}: 3 levels
  const nlohmann::json header =
      parse_json(std::string_view(data + 8, header_len), path + ": safetensors header", limits);

  SafetensorsHeader out;
  out.data_start = 8 + header_len;
  const uint64_t data_len = size - out.data_start;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [tensor] byte range, for overlaps
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw bad_input(path, "__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          throw bad_input(path, "__metadata__ value for '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + " [" + name + "]";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      throw bad_input(where, "entry must be an object with dtype, shape and data_offsets");
    const DtypeInfo* dtype = find_dtype(entry["dtype"].get<std::string>());
    if (dtype == nullptr)
      throw bad_input(where, "unknown dtype '" + entry["dtype"].get<std::string>() +
                                 "' (valid: " + valid_dtype_names() + ")");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dtype->name;
    e.element_size = dtype->size;
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) throw bad_input(where, "shape must hold non-negative integers");
      uint64_t v = d.get<uint64_t>();
      // Caps keep numel * element size far from uint64 overflow (2^50 * 8 < 2^64).
      if (v > (1ull << 40) || (v != 0 && numel > (1ull << 50) / v))
        throw bad_input(where, "shape is implausibly large");
      numel *= v;
      e.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      throw bad_input(where, "data_offsets must be two non-negative integers");
    e.begin = offs[0].get<uint64_t>();
    e.end = offs[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_len)
      throw bad_input(where, "data_offsets [" + std::to_string(e.begin) + ", " +
                                 std::to_string(e.end) + ") lie outside the data section (" +
                                 std::to_string(data_len) + " bytes)");
    if (e.end - e.begin != numel * dtype->size)
      throw bad_input(where, "byte length " + std::to_string(e.end - e.begin) +
                                 " does not match " + std::string(dtype->name) + " shape with " +
                                 std::to_string(numel) + " elements");
    ranges.emplace_back(e.begin, e.end);
    out.entries.push_back(std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second && ranges[i].first != ranges[i].second)
      throw bad_input(path, "tensors overlap in the data section at byte " +
                                std::to_string(ranges[i].first));
  return out;
}

SafetensorsContents load_safetensors(const std::string& path) {
  const fs::MappedFile bytes(path);
  const SafetensorsHeader header = parse_safetensors_header(path, bytes.data(), bytes.size());
  SafetensorsContents out;
  out.metadata = header.metadata;
  for (const auto& e : header.entries) {
    // parse_safetensors_header accepted the dtype, so find_dtype cannot fail here.
    at::Tensor t = torch::empty(e.shape, torch::dtype(find_dtype(e.dtype)->type));
    if (e.end > e.begin)
      std::memcpy(t.data_ptr(), bytes.data() + header.data_start + e.begin, e.end - e.begin);
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace gradguard::checkpoint
