// Exclusive use of a run directory by one pope-train process. Two processes writing the same
// directory damage each other: one's checkpoint being written ("step_N.tmp") is the other's
// leftover to delete, and their metrics.jsonl records interleave and get truncated.
//
// The lock is flock(LOCK_EX | LOCK_NB) on <run dir>/.lock. flock belongs to the open file
// description, so the kernel drops it however the process ends (a resume after a crash or
// SIGKILL finds the directory free, with no stale lock to clean up by hand), and two opens of
// the file in one process conflict like two processes do (one Trainer after another in a
// test process each lock, two at once do not).
#pragma once

#include <filesystem>
#include <stdexcept>

namespace pope {

// The run directory is locked by another process (or another RunLock of this one), or its
// lock file cannot be opened. The trainer rethrows it as a ConfigError of --out.
class RunLockError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunLock {
 public:
  // The lock file's name inside the run directory; the leading dot keeps it out of listings.
  static constexpr const char* kFileName = ".lock";

  // Takes the lock of `run_dir` (an existing directory) without waiting and records this
  // process's pid in the lock file. Throws RunLockError naming the directory, and the
  // holder's pid when the file shows it, if the lock is held.
  explicit RunLock(const std::filesystem::path& run_dir);
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  // Closing the descriptor releases the lock. The file stays: removing it would let a third
  // process lock a new file of that name while a second still holds the removed one.
  ~RunLock();

 private:
  int fd_;
};

}  // namespace pope
