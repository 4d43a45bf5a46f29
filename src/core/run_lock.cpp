// flock on <run>/.lock with the holder's pid written into it. The pid is written after
// the lock is taken, so a reader that finds the lock held may briefly see the previous
// holder's pid (or none); the message says "pid unknown" then.
#include "gradguard/core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "gradguard/core/error.h"
#include "gradguard/core/run_dir.h"

namespace gradguard {

RunLock::RunLock(const std::string& run_dir) {
  const RunDir run(run_dir);
  std::error_code ec;
  std::filesystem::create_directories(run.root(), ec);
  const int fd = ::open(run.lock().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw runtime_error(run.lock(), std::string("cannot create the run's lock file: ") + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {0};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK)
      throw runtime_error(run.lock(), std::string("cannot lock the run directory: ") + std::strerror(err));
    std::string pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw bad_input(run.root(), "is in use by another gradguard process (pid " + (pid.empty() ? "unknown" : pid) +
                                    ") that trains this run; wait for it to end, or use another run.name");
  }
  const std::string text = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    // The lock is what matters; a pid that cannot be recorded only makes a message vaguer.
  }
  fd_ = fd;
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

RunLock::RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

}  // namespace gradguard
