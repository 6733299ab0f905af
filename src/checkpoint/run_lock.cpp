#include "checkpoint/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>

namespace pope {

namespace {

std::string errno_text() { return std::strerror(errno); }

// The pid the holder wrote into the lock file, if it has written one yet (it writes it just
// after taking the lock, so a refusal can come in between).
std::optional<long> holder_pid(int fd) {
  char text[32];
  const ssize_t size = ::pread(fd, text, sizeof text, 0);
  if (size <= 0) return std::nullopt;
  long pid = 0;
  const auto [end, error] = std::from_chars(text, text + size, pid);
  if (error != std::errc() || end == text || pid <= 0) return std::nullopt;
  return pid;
}

}  // namespace

RunLock::RunLock(const std::filesystem::path& run_dir) {
  const std::filesystem::path path = run_dir / kFileName;
  // O_CLOEXEC: a program this process starts must not inherit the lock and keep it after we end.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0)
    throw RunLockError(fmt::format("cannot open the lock file {} of run directory {}: {}", path.string(),
                                   run_dir.string(), errno_text()));
  int result;
  do {
    result = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (result != 0 && errno == EINTR);
  if (result != 0) {
    const int lock_errno = errno;
    const std::optional<long> pid = lock_errno == EWOULDBLOCK ? holder_pid(fd_) : std::nullopt;
    ::close(fd_);
    if (lock_errno != EWOULDBLOCK)
      throw RunLockError(fmt::format("cannot lock {}: {}", path.string(), std::strerror(lock_errno)));
    throw RunLockError(fmt::format("run directory {} is in use by another pope-train process ({} holds {}); wait "
                                   "for it to end or choose another run directory",
                                   run_dir.string(), pid ? fmt::format("pid {}", *pid) : std::string("it"),
                                   path.string()));
  }
  // The pid only makes the refusal above more helpful, so failing to record it is no error.
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t written = ::pwrite(fd_, pid.data(), pid.size(), 0);
    static_cast<void>(written);
  }
}

RunLock::~RunLock() { ::close(fd_); }

}  // namespace pope
