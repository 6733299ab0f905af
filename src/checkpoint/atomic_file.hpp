// Crash-safe file writes shared by token shards, safetensors and checkpoints: a reader
// either sees the old file or the complete new one, never a torn write, even after a
// power loss (the data is fsync'd before the rename and the directory after it).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <vector>

namespace pope {

// A failed atomic write; callers rethrow it as their own domain error (DataError,
// CheckpointError) so that users see one exception type per subsystem.
class AtomicWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writes the concatenation of `pieces` to `path`: a temporary file in the same directory
// (so the rename cannot cross file systems), full writes, fsync, rename over `path`, then
// fsync of the directory. The temporary file is removed on failure. Throws AtomicWriteError.
// A rename replaces whatever `path` names, so the write goes where a plain open() would: a
// symlink is followed and the file it resolves to is replaced (the link stays a link), and
// an existing non-regular file (directory, device, FIFO, socket) is refused untouched.
void write_bytes_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces);

// Makes a completed rename or removal inside `directory` durable. Throws AtomicWriteError.
void fsync_directory(const std::filesystem::path& directory);

}  // namespace pope
