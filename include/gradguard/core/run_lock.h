// The exclusive lock of a run directory. The process that trains a run (rank 0 of a
// data-parallel one) holds it for the whole run, so a second `train` or `train --resume`
// on the same directory is refused before it touches anything. It is an flock(2) on
// RunDir::lock(): the kernel drops it when the holder exits however it exits, SIGKILL
// included, so a dead run never leaves a stale lock; the file keeps the holder's pid for
// the message.
#pragma once

#include <string>

namespace gradguard {

class RunLock {
 public:
  RunLock() = default;
  // Takes the lock of run directory `run_dir` (creating the directory and the lock file
  // if needed) without waiting. Throws gradguard::Error (bad input, exit 2) naming the
  // directory and the holder's pid when another process holds it, (runtime) when the
  // lock file cannot be created.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace gradguard
