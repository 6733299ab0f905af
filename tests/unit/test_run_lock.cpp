// The run directory lock: one pope-train per run directory, released when its holder ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "checkpoint/run_lock.hpp"
#include "scratch_dir.hpp"

using namespace pope;
using pope::testing::read_bytes;
using pope::testing::ScratchDir;
using pope::testing::thrown_message;

// flock locks belong to the open file description, so a second RunLock of this process (a
// second open()) is refused like another process would be; the trainer's tests that create
// one Trainer after another rely on the release when the first is destroyed.
TEST(RunLock, ASecondLockIsRefusedWhileTheFirstIsHeldAndGrantedAfter) {
  ScratchDir dir;
  std::optional<RunLock> first(std::in_place, dir.path());
  const auto pid_bytes = read_bytes(dir / RunLock::kFileName);
  EXPECT_EQ(std::string(pid_bytes.begin(), pid_bytes.end()), std::to_string(::getpid()) + "\n");

  const std::string message = thrown_message<RunLockError>([&] { RunLock second(dir.path()); });
  EXPECT_NE(message.find("run directory " + dir.path().string() + " is in use by another pope-train process (pid " +
                         std::to_string(::getpid()) + " holds"),
            std::string::npos)
      << message;

  first.reset();
  EXPECT_NO_THROW(RunLock third(dir.path()));
}

// A pope-train killed with SIGKILL cannot clean up; the kernel drops its lock, so a resume
// finds the directory free although the lock file (with the dead pid) is still there.
TEST(RunLock, TheLockOfAKilledProcessIsReleased) {
  ScratchDir dir;
  const std::string lock_path = (dir / RunLock::kFileName).string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls after fork: lock, write a stale pid, report, wait to be killed.
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0666);
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::write(fd, "999999\n", 7) != 7) ::_exit(1);
    if (::write(ready[1], "x", 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the child could not take the lock";
  ::close(ready[0]);

  const std::string message = thrown_message<RunLockError>([&] { RunLock refused(dir.path()); });
  EXPECT_NE(message.find("(pid 999999 holds"), std::string::npos) << message;

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_NO_THROW(RunLock granted(dir.path()));
}

TEST(RunLock, AMissingDirectoryIsAnErrorNamingIt) {
  ScratchDir dir;
  const std::string message = thrown_message<RunLockError>([&] { RunLock lock(dir / "missing"); });
  EXPECT_NE(message.find((dir / "missing").string()), std::string::npos) << message;
}
