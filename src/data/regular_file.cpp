#include "data/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include <cerrno>
#include <cstring>

#include "pope/data.hpp"

namespace pope {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

std::string why_not_regular_file(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0)
    return S_ISREG(info.st_mode) ? std::string() : fmt::format("is {}, not a regular file", file_kind(info.st_mode));
  const int error = errno;
  switch (error) {
    case ELOOP: return "is a symbolic link loop (or more than 40 links deep)";
    case ENOTDIR: return "does not exist (a part of its path is not a directory)";
    case EACCES: return "cannot be reached: permission denied on a directory of its path";
    case ENOENT: {
      std::error_code ec;
      if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec)))
        return fmt::format("is a dangling symbolic link (to {})", std::filesystem::read_symlink(path, ec));
      return "does not exist";
    }
    default: return fmt::format("cannot be inspected: {}", std::strerror(error));
  }
}

int open_regular_file(const std::filesystem::path& path, const std::string& what) {
  if (const std::string why = why_not_regular_file(path); !why.empty())
    throw DataError(fmt::format("{} {} {}", what, path, why));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw DataError(fmt::format("cannot open {} {}: {}", what, path, std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("{} {} is not a regular file (it changed while it was opened)", what, path));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // regular files ignore it; clear it for plain reads
  return fd;
}

}  // namespace pope
