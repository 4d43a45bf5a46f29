// Reads and writes llm.c token files. Reading maps the file read-only and validates
// everything a training run would otherwise trip over much later (a foreign file, a
// truncated copy, a header that lies about its length, tokens outside the vocabulary),
// so each of those becomes one bad-input error naming the file. Writing goes through a
// temporary file in the target directory, fsync and rename, so a crash never leaves a
// half-written token file under the final name. The on-disk integers are little-endian;
// the writer converts explicitly and the reader, which hands out a pointer into the map,
// is only built for little-endian hosts.
#include "gradguard/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <utility>

#include "gradguard/core/error.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "TokenFile maps little-endian token files directly and needs a little-endian host"
#endif

namespace gradguard::data {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

void put_le32(unsigned char* out, int32_t value) {
  const auto u = static_cast<uint32_t>(value);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>((u >> (8 * i)) & 0xffu);
}

int32_t get_le32(const unsigned char* in) {
  uint32_t u = 0;
  for (int i = 0; i < 4; ++i) u |= static_cast<uint32_t>(in[i]) << (8 * i);
  return static_cast<int32_t>(u);
}

// Writes all `size` bytes, retrying short writes and EINTR. Returns errno or 0.
int write_all(int fd, const unsigned char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

// Owns a file descriptor until released; closes it on every error path.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

namespace {
// Both versions: the header ints given, then the tokens at `width` bytes each.
template <class Token>
void write_tokens(const std::string& path, const std::vector<Token>& tokens, const int32_t (&ints)[11], int width,
                  const std::vector<uint8_t>& flags = {}) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  fs::path dir = target.parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw bad_input(path, "cannot create directory " + dir.string() + ": " + ec.message());
  }

  std::string tmp = (dir.empty() ? fs::path(".") : dir).string() + "/." +
                    target.filename().string() + ".tmp-XXXXXX";
  FdGuard fd(::mkstemp(tmp.data()));
  if (fd.get() < 0) throw bad_input(path, "cannot create temporary file: " + errno_text(errno));
  // Removes the temporary file unless it was renamed into place.
  bool renamed = false;
  struct TmpCleanup {
    const std::string& tmp;
    const bool& renamed;
    ~TmpCleanup() {
      if (!renamed) ::unlink(tmp.c_str());
    }
  } cleanup{tmp, renamed};
  auto fail = [&](const std::string& what, int err) {
    return bad_input(path, what + ": " + errno_text(err));
  };

  unsigned char header[kTokenFileHeaderBytes] = {};
  for (int i = 0; i < 11; ++i) put_le32(header + 4 * i, ints[i]);
  if (int err = write_all(fd.get(), header, sizeof(header))) throw fail("cannot write", err);

  // Tokens go out in chunks converted to little-endian bytes.
  constexpr size_t kChunk = 1 << 16;
  std::vector<unsigned char> buf(static_cast<size_t>(width) * kChunk);
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    const size_t end = std::min(tokens.size(), begin + kChunk);
    for (size_t i = begin; i < end; ++i) {
      const auto value = static_cast<uint32_t>(tokens[i]);
      for (int b = 0; b < width; ++b) {
        buf[static_cast<size_t>(width) * (i - begin) + b] = static_cast<unsigned char>((value >> (8 * b)) & 0xffu);
      }
    }
    if (int err = write_all(fd.get(), buf.data(), static_cast<size_t>(width) * (end - begin)))
      throw fail("cannot write", err);
  }
  if (!flags.empty()) {
    if (int err = write_all(fd.get(), flags.data(), flags.size())) throw fail("cannot write", err);
  }
  if (::fsync(fd.get()) != 0) throw fail("cannot fsync", errno);
  if (::close(fd.release()) != 0) throw fail("cannot close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw fail("cannot rename temporary file into place", errno);
  renamed = true;
}

int32_t low32(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v & 0xffffffffu)); }
int32_t high32(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v >> 32)); }
uint64_t join32(const unsigned char* low) {
  return static_cast<uint64_t>(static_cast<uint32_t>(get_le32(low))) |
         static_cast<uint64_t>(static_cast<uint32_t>(get_le32(low + 4))) << 32;
}
}  // namespace

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens, uint64_t dataset_id) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw bad_input(path, std::to_string(tokens.size()) +
                              " tokens do not fit the header's int32 token count; "
                              "split the corpus into several files");
  }
  const int32_t ints[11] = {kTokenFileMagic, kTokenFileVersion, static_cast<int32_t>(tokens.size()),
                            low32(dataset_id), high32(dataset_id), 0, 0, 0, 0, 0, 0};
  write_tokens(path, tokens, ints, 2);
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, const TokenFileMeta& meta,
                      const std::vector<uint8_t>& flags) {
  if (!flags.empty()) {
    if (flags.size() != tokens.size()) {
      throw bad_input(path, std::to_string(flags.size()) + " token flags for " + std::to_string(tokens.size()) +
                                " tokens (one byte per token)");
    }
    if ((flags[0] & kTokenSampleStart) == 0) throw bad_input(path, "the first token's flags do not start a sample");
    for (size_t i = 0; i < flags.size(); ++i) {
      if ((flags[i] & ~(kTokenTrained | kTokenSampleStart)) != 0) {
        throw bad_input(path, "token flags " + std::to_string(flags[i]) + " at position " + std::to_string(i) +
                                  " use bits other than 0 and 1");
      }
    }
  }
  if (meta.vocab_size < 1 || meta.vocab_size > std::numeric_limits<int32_t>::max()) {
    throw bad_input(path, "vocab_size " + std::to_string(meta.vocab_size) + " must be in [1, 2^31)");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= static_cast<uint64_t>(meta.vocab_size)) {
      throw bad_input(path, "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                                " is outside the vocabulary (vocab_size " + std::to_string(meta.vocab_size) + ")");
    }
  }
  const int width = meta.vocab_size <= 65536 ? 2 : 4;
  const uint64_t count = tokens.size();
  const int32_t ints[11] = {kTokenFileMagic,        kTokenFileVersion2,      low32(count),
                            low32(meta.dataset_id), high32(meta.dataset_id), width,
                            high32(count),          low32(meta.tokenizer_hash), high32(meta.tokenizer_hash),
                            static_cast<int32_t>(meta.vocab_size),
                            flags.empty() ? 0 : 1};
  write_tokens(path, tokens, ints, width, flags);
}

TokenFile::TokenFile(const std::string& path, int64_t vocab_size) : path_(path) {
  FdGuard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw bad_input(path, "cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw bad_input(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw bad_input(path, "is not a regular file");
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kTokenFileHeaderBytes) {
    throw bad_input(path, "truncated: " + std::to_string(file_bytes) + " bytes, header needs " +
                              std::to_string(kTokenFileHeaderBytes));
  }

  void* map = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) throw bad_input(path, "cannot memory-map: " + errno_text(errno));
  map_ = map;
  map_bytes_ = file_bytes;
  // The map outlives the descriptor; from here on a failure must unmap before throwing.
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    const int32_t magic = get_le32(bytes);
    const int32_t version = get_le32(bytes + 4);
    int64_t count = get_le32(bytes + 8);
    if (magic != kTokenFileMagic) {
      throw bad_input(path, "bad magic number " + std::to_string(magic) + " (expected " +
                                std::to_string(kTokenFileMagic) +
                                "): not a token file written by `gradguard prepare` or llm.c");
    }
    if (version != kTokenFileVersion && version != kTokenFileVersion2) {
      throw bad_input(path, "unsupported version " + std::to_string(version) + " (supported: " +
                                std::to_string(kTokenFileVersion) + ", uint16 tokens; " +
                                std::to_string(kTokenFileVersion2) + ", uint16 or uint32 tokens and a tokenizer)");
    }
    version_ = version;
    int64_t flag_bytes_per_token = 0;
    if (version == kTokenFileVersion2) {
      width_ = get_le32(bytes + 20);
      if (width_ != 2 && width_ != 4) {
        throw bad_input(path, "header says tokens are " + std::to_string(width_) + " bytes wide (must be 2 or 4)");
      }
      const uint64_t count64 = static_cast<uint64_t>(static_cast<uint32_t>(get_le32(bytes + 8))) |
                               static_cast<uint64_t>(static_cast<uint32_t>(get_le32(bytes + 24))) << 32;
      if (count64 > static_cast<uint64_t>(file_bytes)) {
        throw bad_input(path, "header says " + std::to_string(count64) + " tokens (more bytes than the whole file) but file has " +
                                  std::to_string(file_bytes - kTokenFileHeaderBytes) + " bytes of tokens");
      }
      count = static_cast<int64_t>(count64);
      tokenizer_hash_ = join32(bytes + 28);
      tokenizer_vocab_size_ = get_le32(bytes + 36);
      const int32_t has_flags = get_le32(bytes + 40);
      if (has_flags != 0 && has_flags != 1) {
        throw bad_input(path, "header int 10 (flags section) is " + std::to_string(has_flags) + " (must be 0 or 1)");
      }
      flag_bytes_per_token = has_flags;
    }
    // Tokens, then (with flags) one byte per token: width_ + 1 bytes per token.
    const int64_t token_bytes = file_bytes - kTokenFileHeaderBytes;
    const int64_t per_token = width_ + flag_bytes_per_token;
    // count is at most the file size here, so width_ * count cannot overflow.
    if (count < 0 || count > token_bytes || per_token * count != token_bytes) {
      const std::string need = count < 0 ? std::string("a negative number of")
                                         : std::to_string(per_token * count);
      throw bad_input(path, "header says " + std::to_string(count) + " tokens (" + need +
                                " bytes) but file has " + std::to_string(token_bytes) + " bytes of tokens");
    }
    tokens_ = bytes + kTokenFileHeaderBytes;
    num_tokens_ = count;
    if (flag_bytes_per_token == 1) {
      flags_ = bytes + kTokenFileHeaderBytes + width_ * count;
      if (count > 0 && (flags_[0] & kTokenSampleStart) == 0) {
        throw bad_input(path, "the flags section does not start a sample at token 0");
      }
      for (int64_t i = 0; i < count; ++i) {
        if ((flags_[i] & ~(kTokenTrained | kTokenSampleStart)) != 0) {
          throw bad_input(path, "token flags " + std::to_string(flags_[i]) + " at position " + std::to_string(i) +
                                    " use bits other than 0 and 1");
        }
      }
    }
    dataset_id_ = join32(bytes + 12);
    if (vocab_size > 0) {
      for (int64_t i = 0; i < num_tokens_; ++i) {
        if (token(i) >= vocab_size) {
          throw bad_input(path, "token " + std::to_string(token(i)) + " at position " +
                                    std::to_string(i) + " is outside the vocabulary (vocab_size " +
                                    std::to_string(vocab_size) + ")");
        }
      }
    }
  } catch (...) {
    ::munmap(map_, static_cast<size_t>(map_bytes_));
    map_ = nullptr;
    throw;
  }
}

uint64_t new_dataset_id() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(::getpid());
  return id;
}

void check_same_dataset(const TokenFile& train, const TokenFile& val) {
  if (train.dataset_id() == 0 || val.dataset_id() == 0 || train.dataset_id() == val.dataset_id()) return;
  char ids[64];
  std::snprintf(ids, sizeof ids, "%016llx and %016llx", (unsigned long long)train.dataset_id(),
                (unsigned long long)val.dataset_id());
  throw bad_input(val.path(), "was prepared apart from " + train.path() + " (dataset ids " + ids +
                                  "): the pair is from two `gradguard prepare` runs, e.g. one interrupted "
                                  "over an older dataset; prepare them again together");
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(map_bytes_));
}

}  // namespace gradguard::data
