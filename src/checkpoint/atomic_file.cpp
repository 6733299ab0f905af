#include "checkpoint/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "data/regular_file.hpp"
#include "pope/checkpoint.hpp"

namespace pope {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Closes the descriptor when the write is abandoned half-way.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes explicitly so that a failing close (delayed write error) is reported.
  int close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result;
  }

 private:
  int fd_;
};

// Errors name `path`, the file the user asked for: the temporary file is removed on failure.
void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      throw AtomicWriteError(fmt::format("cannot write {}: {}", path, errno_text()));
    }
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
}

void write_and_sync(const std::filesystem::path& path, int fd, std::span<const std::span<const std::byte>> pieces) {
  for (const auto& piece : pieces) write_all(fd, piece, path);
  if (::fsync(fd) != 0) throw AtomicWriteError(fmt::format("cannot fsync {}: {}", path, errno_text()));
}

// The path whose file the write replaces: `path` with every symlink followed (a relative
// link target counts from the link's directory), so that the rename updates the link's
// target instead of turning the link into a plain file. A missing file (also at the end of
// a dangling link) is created, as open(O_CREAT) would; anything but a regular file is refused,
// since renaming over it would replace a device node or FIFO with a file, or fail on a
// directory only after all the data was written.
std::filesystem::path write_target(const std::filesystem::path& path) {
  constexpr int kMaxLinks = 40;  // Linux's limit for one path lookup (ELOOP beyond it)
  std::filesystem::path target = path;
  for (int links = 0;; ++links) {
    struct stat info {};
    if (::lstat(target.c_str(), &info) != 0) {
      if (errno == ENOENT) return target;
      throw AtomicWriteError(fmt::format("cannot inspect {}: {}", target, errno_text()));
    }
    if (S_ISREG(info.st_mode)) return target;
    if (!S_ISLNK(info.st_mode)) {
      const std::string what = target == path ? fmt::format("{} is", path)
                                              : fmt::format("{} resolves to {}, which is", path, target);
      throw AtomicWriteError(fmt::format("{} {}, not a regular file; expected a file path to write", what,
                                         file_kind(info.st_mode)));
    }
    if (links == kMaxLinks)
      throw AtomicWriteError(fmt::format("cannot write {}: more than {} symbolic links to follow", path, kMaxLinks));
    std::error_code ec;
    const std::filesystem::path link = std::filesystem::read_symlink(target, ec);
    if (ec) throw AtomicWriteError(fmt::format("cannot read the symbolic link {}: {}", target, ec.message()));
    target = link.is_absolute() ? link : target.parent_path() / link;
  }
}

}  // namespace

void fsync_directory(const std::filesystem::path& directory) {
  const std::filesystem::path dir = directory.empty() ? std::filesystem::path(".") : directory;
  FileDescriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw AtomicWriteError(fmt::format("cannot open directory {}: {}", dir, errno_text()));
  if (::fsync(fd.get()) != 0) throw AtomicWriteError(fmt::format("cannot fsync directory {}: {}", dir, errno_text()));
}

void write_bytes_atomic(const std::filesystem::path& requested_path,
                        std::span<const std::span<const std::byte>> pieces) {
  const std::filesystem::path path = write_target(requested_path);
  if (path.filename().empty()) throw AtomicWriteError(fmt::format("cannot write {}: not a file name", requested_path));
  // mkstemp gives a name no concurrent writer uses; the leading dot and the suffix keep
  // it out of directory scans and glob patterns such as "train_*.bin".
  std::string temp_name = (path.parent_path() / fmt::format(".{}.XXXXXX", path.filename().string())).string();
  FileDescriptor fd(::mkstemp(temp_name.data()));
  if (fd.get() < 0) throw AtomicWriteError(fmt::format("cannot create a temporary file for {}: {}", path, errno_text()));
  const std::filesystem::path temp_path = temp_name;
  try {
    // mkstemp creates the file 0600; give it the permissions a plain open() would have.
    // umask can only be read by setting it, so read it once (before any writer threads).
    static const mode_t mask = [] {
      const mode_t m = ::umask(0);
      ::umask(m);
      return m;
    }();
    if (::fchmod(fd.get(), 0666 & ~mask) != 0)
      throw AtomicWriteError(fmt::format("cannot set permissions of {}: {}", temp_path, errno_text()));
    write_and_sync(path, fd.get(), pieces);
    if (fd.close() != 0) throw AtomicWriteError(fmt::format("cannot close {}: {}", path, errno_text()));
    if (::rename(temp_path.c_str(), path.c_str()) != 0)
      throw AtomicWriteError(fmt::format("cannot rename {} to {}: {}", temp_path, path, errno_text()));
  } catch (...) {
    ::unlink(temp_path.c_str());
    throw;
  }
  fsync_directory(path.parent_path());
}

void write_file_atomic(const std::filesystem::path& path, const std::string& contents) {
  const std::span<const std::byte> piece = std::as_bytes(std::span(contents));
  try {
    write_bytes_atomic(path, std::span(&piece, 1));
  } catch (const AtomicWriteError& error) {
    throw CheckpointError(error.what());
  }
}

}  // namespace pope
