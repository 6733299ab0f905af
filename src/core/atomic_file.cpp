#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include <cerrno>
#include <cstring>
#include <string>

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

void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& temp_path) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      throw AtomicWriteError(fmt::format("cannot write {}: {}", temp_path, errno_text()));
    }
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
}

void write_and_sync(const std::filesystem::path& temp_path, int fd, std::span<const std::span<const std::byte>> pieces) {
  for (const auto& piece : pieces) write_all(fd, piece, temp_path);
  if (::fsync(fd) != 0) throw AtomicWriteError(fmt::format("cannot fsync {}: {}", temp_path, errno_text()));
}

}  // namespace

void fsync_directory(const std::filesystem::path& directory) {
  const std::filesystem::path dir = directory.empty() ? std::filesystem::path(".") : directory;
  FileDescriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw AtomicWriteError(fmt::format("cannot open directory {}: {}", dir, errno_text()));
  if (::fsync(fd.get()) != 0) throw AtomicWriteError(fmt::format("cannot fsync directory {}: {}", dir, errno_text()));
}

void write_bytes_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces) {
  if (path.filename().empty()) throw AtomicWriteError(fmt::format("cannot write {}: not a file name", path));
  // mkstemp gives a name no concurrent writer uses; the leading dot and the suffix keep
  // it out of directory scans and glob patterns such as "train_*.bin".
  std::string temp_name = (path.parent_path() / fmt::format(".{}.XXXXXX", path.filename().string())).string();
  FileDescriptor fd(::mkstemp(temp_name.data()));
  if (fd.get() < 0) throw AtomicWriteError(fmt::format("cannot create a temporary file for {}: {}", path, errno_text()));
  const std::filesystem::path temp_path = temp_name;
  try {
    write_and_sync(temp_path, fd.get(), pieces);
    if (fd.close() != 0) throw AtomicWriteError(fmt::format("cannot close {}: {}", temp_path, errno_text()));
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
