// The per-process scratch file of the fuzz targets whose code under test reads a path
// rather than a buffer: created once under $TMPDIR (or /tmp), rewritten with every
// input, removed at exit. Failing to create or write it aborts, so a broken environment
// is never mistaken for an input the parser rejected.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace gradguard::fuzz {

// Path of the scratch file, "<tmp>/<stem>XXXXXX<suffix>" made unique on first use.
inline const std::string& scratch_path(const char* stem, const char* suffix) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "XXXXXX" + suffix;
    const int fd = ::mkstemps(p.data(), static_cast<int>(std::strlen(suffix)));
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

// Replaces the contents of `path` with the `size` bytes at `data`.
inline void write_scratch(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror("writing the fuzz input");
    std::abort();
  }
}

}  // namespace gradguard::fuzz
