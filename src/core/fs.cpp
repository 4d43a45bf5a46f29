// Atomic writes via temporary file + fsync + rename, and whole-file reads with errors
// that name the file.
#include "gradguard/core/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gradguard/core/error.h"

namespace gradguard::fs {
namespace {
std::string errno_text() { return std::strerror(errno); }

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  std::filesystem::path p(path_);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) throw runtime_error(path_, "cannot create directory: " + ec.message());
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw runtime_error(path_, "cannot open for writing: " + errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw runtime_error(path_, "write failed: " + errno_text());
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) throw runtime_error(path_, "fsync failed: " + errno_text());
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_path_.c_str());
    throw runtime_error(path_, "close failed: " + errno_text());
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp_path_.c_str());
    throw runtime_error(path_, "rename into place failed: " + why);
  }
  fsync_dir(std::filesystem::path(path_).parent_path().string());
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

std::string read_file(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw bad_input(path, "is a directory, not a file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw bad_input(path, "cannot open: " + errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw bad_input(path, "cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw bad_input(path, "is not a regular file (a device, FIFO or socket)");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw bad_input(path, "is " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                              std::to_string(max_bytes));
  // Read at most one byte past the limit: a file that grows while read is refused too.
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() > max_bytes) break;
      out.resize(std::min(max_bytes + 1, std::max<size_t>(out.size() * 2, 4096)));
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw bad_input(path, "read failed: " + errno_text());
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes)
    throw bad_input(path, "is more than the limit of " + std::to_string(max_bytes) + " bytes");
  out.resize(got);
  return out;
}

MappedFile::MappedFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw bad_input(path, "is a directory, not a file");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw bad_input(path, "cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    throw bad_input(path, "cannot stat: " + why);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      std::string why = errno_text();
      ::close(fd);
      throw bad_input(path, "cannot map: " + why);
    }
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace gradguard::fs
