// Small file-system helpers with the crash-safety rules gradguard follows everywhere:
// a file a user relies on is written to a temporary name in the same directory, fsync'd,
// and renamed over the target only when complete, so a crash or a full disk leaves
// either the old file or the new one, never half of one.
#pragma once

#include <cstddef>
#include <string>

namespace gradguard::fs {

// A file written atomically. Destroying it without commit() removes the temporary.
class AtomicFile {
 public:
  // Creates parent directories and opens "<path>.tmp.<pid>". Throws gradguard::Error
  // (runtime) naming the path on failure.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; throws gradguard::Error naming the path (e.g. "No space left on device").
  void write(const void* data, size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // fsync, close, rename into place, fsync the directory.
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
};

// Writes a whole file atomically.
void write_file_atomic(const std::string& path, const std::string& contents);

// Reads a whole regular file of at most `max_bytes`. Throws gradguard::Error (bad
// input) naming the path when it is missing, unreadable, not a regular file (a
// directory, /dev/zero, a FIFO) or larger than the limit.
inline constexpr size_t kMaxReadBytes = size_t{1} << 30;  // 1 GiB
std::string read_file(const std::string& path, size_t max_bytes = kMaxReadBytes);

bool exists(const std::string& path);

// A whole file mapped read-only (an empty file maps to size 0). Pages are read on
// demand, so loading a multi-gigabyte checkpoint does not first copy it into a buffer.
class MappedFile {
 public:
  // Throws gradguard::Error (bad input) naming the path when it cannot be opened/mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return static_cast<const char*>(map_); }
  size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace gradguard::fs
